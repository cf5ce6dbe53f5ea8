"""``scalpel lr``: the learning-rate range test on an unmodified script (docs/lr.md).

``options`` (what to sweep, validated), ``sweep`` (the pure math: schedule, smoothing, divergence,
suggestion), ``coverage`` (whether a sweep measured what a suggestion is read from: it reached
``--max`` or diverged; otherwise how far it got and how to give it the steps), ``observer`` (the runtime side: every param group's lr set before each optimizer step,
the script's LR scheduler suspended, the loss per step); ``stages/lr.py`` runs the script under
both and saves the record.
"""
