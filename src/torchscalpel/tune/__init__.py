"""``scalpel tune``: measured, numerics-checked speedups applied to an unmodified script.

- :mod:`torchscalpel.tune.knobs`: one knob family per module, each a setup hook with an undo;
- :mod:`torchscalpel.tune.settings`: the knob values and their ``scalpel.toml`` form;
- :mod:`torchscalpel.tune.trial` / :mod:`~torchscalpel.tune.runner`: one trial per fresh process;
- :mod:`torchscalpel.tune.states`: a trial's status and verdict (one enum each);
- :mod:`torchscalpel.tune.verify`: the numerics gate and the speed margin;
- :mod:`torchscalpel.tune.bottleneck`: the baseline's bottleneck class from its record and profile;
- :mod:`torchscalpel.tune.plan`: which candidates, in what order, and why (from that class);
- :mod:`torchscalpel.tune.triage`: compile breaks, recompile guards, a failing function excluded;
- :mod:`torchscalpel.tune.search`: the loop: baseline, single knobs, greedy combination;
- :mod:`torchscalpel.tune.options` / :mod:`~torchscalpel.tune.result`: what it is asked, what it found;
- :mod:`torchscalpel.tune.budget`: time left, each trial's limit, what a confirmation costs;
- :mod:`torchscalpel.tune.ordering`: winners per family, near-ties to stack, the confirmation order;
- :mod:`torchscalpel.tune.confirm`: the interleaved confirmation pairs.
"""
