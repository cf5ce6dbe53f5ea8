"""The statement that goes with tune's compile of a transformers model in training: ``use_cache`` off.

Tune's compile candidate sets ``model.config.use_cache = False`` when the baseline saw a transformers
model train with its config asking for a key/value cache (``compile.use_cache = false`` in
scalpel.toml): the cache a training forward builds is never read, and under compile its guards
recompiled the model during timed steps. What tune measured is compile *with* that setting, so fix
inserts it beside the compile call, on the model the script built (``{var}``: the name the model's
line assigns, read from the source by the ``after_statement`` edit)."""

from __future__ import annotations


def cache_off_statement(var: str) -> str:
    """``VAR.config.use_cache = False`` as a statement line (with the reason as a comment)."""
    return f"{var}.config.use_cache = False  # no key/value cache in training (what tune measured)\n"
