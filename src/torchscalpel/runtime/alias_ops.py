"""Which dispatched ops allocate: an op whose outputs all alias its inputs (a view, an in-place or ``out=`` op)
allocates nothing, read once per op from its schema and cached for every allocation tracker."""

from __future__ import annotations

from typing import Any

OPS: dict[int, tuple[Any, str | None]] = {}
"""``id(op) -> (op, name or None)``: None for an op whose outputs all alias inputs. The op is kept so an id
is never reused by another; shared by every tracker, so a tracker started per step starts warm."""


def op_entry(func: Any) -> tuple[Any, str | None]:
    """Cache and return ``(op, its name)``, the name None when every output aliases an input (nothing allocated)."""
    entry = (func, None if returns_alias(func) else str(func))
    OPS[id(func)] = entry
    return entry


def returns_alias(func: Any) -> bool:
    """Whether every output of ``func`` aliases an input (views, in-place and ``out=`` ops), from its schema."""
    if func.is_view:
        return True
    try:
        returns = func._schema.returns
    except AttributeError:
        return False
    return bool(returns) and all(r.alias_info is not None for r in returns)
