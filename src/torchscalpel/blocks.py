"""The one definition of a model's repeated *block*, shared by tune, plan and dist.

A block is a module class that the forward *calls* repeatedly: transformer layers (``Block``,
``LlamaDecoderLayer``), residual blocks (``BasicBlock``), the Linears of a flat ``Sequential``
MLP. It is never a module used as a container: ``ModuleList``/``ModuleDict``/``ParameterList``/
``ParameterDict`` have no forward at all (compiling or sharding one means nothing), and a
``Sequential`` that merely groups layers (the model itself, a stage of blocks) is looked into,
not returned. The one exception is the stack idiom ``ModuleList([Sequential(...), ...])`` with
``for layer in self.layers: x = layer(x)``, where each ``Sequential`` is what the forward calls.

Users of the definition:

- ``scalpel tune``: the ``compile(<Block>)`` region (one compiled graph reused by every instance);
- ``scalpel plan``: the FSDP units and the activation-checkpointing units it prices;
- ``torchscalpel.distributed.wrap``: the modules ``fully_shard``, checkpointing and ``compile`` apply to.

Because all three call :func:`find_blocks`, plan prices exactly the units dist shards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

CONTAINERS: tuple[type[nn.Module], ...] = (
    nn.ModuleList,
    nn.ModuleDict,
    nn.Sequential,
    nn.ParameterList,
    nn.ParameterDict,
)
"""Module classes that hold modules rather than compute: never a block."""

_STACKS = (nn.ModuleList, nn.Sequential)


def is_container(module: nn.Module) -> bool:
    """True for ModuleList / ModuleDict / Sequential / ParameterList / ParameterDict (and subclasses)."""
    return isinstance(module, CONTAINERS)


def calls_from_rows(rows: Iterable[Mapping[str, Any]] | None) -> dict[str, int] | None:
    """Forward-call counts by qualified name from the Run record's ``modules`` rows (``name``, ``calls``).

    None when there are no rows (the run did not time modules): the caller then has no evidence
    about calls and :func:`find_blocks` falls back to the static definition alone.
    """
    out: dict[str, int] = {}
    for row in rows or []:
        name, calls = row.get("name"), row.get("calls")
        if isinstance(name, str) and isinstance(calls, int):
            out[name] = out.get(name, 0) + calls
    return out or None


def find_blocks(model: nn.Module, calls: Mapping[str, int] | None = None) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of ``model`` as (qualified name, module), in module order; ``[]`` when none.

    Statically, a block candidate is a child of a container (``ModuleList``/``ModuleDict``/
    ``Sequential``, at any depth, so ``ModuleDict`` -> ``ModuleList`` -> ``Block`` works, and the
    model itself counts when it is a ``Sequential``) that holds parameters and is not a container,
    except that a ``Sequential`` element of a ``ModuleList`` is a candidate (see the module
    docstring). A candidate class needs at least two such instances and must form a stack
    somewhere: two or more instances in one ``ModuleList``/``Sequential``, or a ``ModuleDict`` that
    holds that class only (so a ``ModuleDict``'s ``wte``/``wpe`` Embeddings or ``c_fc``/``c_proj``
    Linears never make a block). The block class is the
    candidate class with the most parameters over all its instances (parameters x instances); on a
    tie, a class defined outside ``torch.nn`` beats a ``Sequential``, which beats a ``torch.nn``
    layer (``Linear``), then more instances win. So transformer layers win over the Linears inside
    them, and ``BasicBlock`` over the ``Sequential`` stage that holds nothing else. Other candidate
    classes defined outside ``torch.nn`` are blocks too when their instances lie outside the chosen
    ones (and do not contain them), e.g. the encoder and decoder layers of an encoder-decoder model.

    ``calls`` (optional): forward calls per qualified name seen at run time (names relative to
    ``model``, as :func:`calls_from_rows` reads them from ``record.modules``). When given, a class
    must have at least two called instances, and only called instances are returned. A name
    missing from ``calls`` counts as not called; a module deeper than every name listed (the
    runtime times submodules down to a fixed depth only) counts as called when its nearest
    non-container ancestor within that depth was.

    Only the outermost instances are returned (a block nested in another returned block is not).
    """
    named = list(model.named_modules())
    owned: dict[type[nn.Module], list[tuple[str, nn.Module]]] = {}
    stacked: set[type[nn.Module]] = set()
    seen: set[int] = set()
    for name, container in named:
        if not is_container(container):
            continue
        per_class: dict[type[nn.Module], int] = {}
        for child_name, child in container.named_children():
            if not _candidate(container, child):
                continue
            per_class[type(child)] = per_class.get(type(child), 0) + 1
            if id(child) in seen:  # one instance registered twice (shared layer): count it once
                continue
            seen.add(id(child))
            owned.setdefault(type(child), []).append((f"{name}.{child_name}" if name else child_name, child))
        # A stack: two or more instances of one class in a ModuleList/Sequential, or a ModuleDict
        # of one class only. Two Embeddings of a ModuleDict (wte, wpe) are not a stack.
        if isinstance(container, _STACKS):
            stacked.update(cls for cls, n in per_class.items() if n >= 2)
        elif len(per_class) == 1 and len(container._modules) == sum(per_class.values()) >= 2:
            stacked.update(per_class)

    if calls is not None:
        depth = _max_depth(calls)
        by_name = dict(named)
        owned = {
            cls: [(n, m) for n, m in mods if _called(n, calls, depth, by_name)] for cls, mods in owned.items()
        }
    candidates = {cls: mods for cls, mods in owned.items() if cls in stacked and len(mods) >= 2}
    if not candidates:
        return []

    def score(cls: type[nn.Module]) -> tuple[int, int, int]:
        mods = candidates[cls]
        return _param_count(m for _, m in mods), _kind_rank(cls), len(mods)

    order = sorted(candidates, key=score, reverse=True)
    chosen: list[type[nn.Module]] = [order[0]]
    for cls in order[1:]:
        if _kind_rank(cls) == 2 and not any(_overlaps(candidates[cls], candidates[c]) for c in chosen):
            chosen.append(cls)
    picked = {id(m) for cls in chosen for _, m in candidates[cls]}
    out: list[tuple[str, nn.Module]] = []
    inner: set[int] = set()
    for name, module in named:
        if id(module) in picked and id(module) not in inner:
            out.append((name, module))
            inner.update(id(m) for m in module.modules() if m is not module)
    return out


def block_classes(model: nn.Module, calls: Mapping[str, int] | None = None) -> list[type[nn.Module]]:
    """The repeated block class(es) of ``model`` (see :func:`find_blocks`), in module order."""
    out: list[type[nn.Module]] = []
    for _, module in find_blocks(model, calls):
        if type(module) not in out:
            out.append(type(module))
    return out


def _candidate(container: nn.Module, child: nn.Module) -> bool:
    """A child of ``container`` that could be a block: it computes, and holds parameters."""
    # ModuleList([Sequential(...), ...]): the forward iterates the list and calls each Sequential
    stack_element = isinstance(child, nn.Sequential) and isinstance(container, nn.ModuleList)
    if is_container(child) and not stack_element:
        return False
    return _has_params(child)


def _kind_rank(cls: type[nn.Module]) -> int:
    """Tie-break between candidate classes: a model's own class > Sequential > a torch.nn layer."""
    if issubclass(cls, nn.Sequential):
        return 1
    return 0 if cls.__module__.startswith("torch.nn") else 2


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _param_count(modules: Iterable[nn.Module]) -> int:
    ids: dict[int, int] = {}
    for module in modules:
        for p in module.parameters():
            ids[id(p)] = p.numel()
    return sum(ids.values())


def _max_depth(calls: Mapping[str, int] | None) -> int:
    return max((n.count(".") + 1 for n in calls or {} if n and not n.startswith("<")), default=0)


def _called(name: str, calls: Mapping[str, int], depth: int, by_name: Mapping[str, nn.Module]) -> bool:
    """Called, as far as ``calls`` can tell. A module deeper than the names timed is judged by its
    nearest ancestor within the timed depth that is not a container (containers are never called)."""
    parts = name.split(".")
    for level in range(min(depth, len(parts)), 0, -1):
        prefix = ".".join(parts[:level])
        if not is_container(by_name[prefix]) or level == len(parts):
            return calls.get(prefix, 0) > 0
    return True  # only containers between it and the root, and the root ran


def _overlaps(a: list[tuple[str, nn.Module]], b: list[tuple[str, nn.Module]]) -> bool:
    """True when an instance of one list sits inside (or contains) an instance of the other."""
    inside_b = {id(m) for _, mod in b for m in mod.modules()}
    inside_a = {id(m) for _, mod in a for m in mod.modules()}
    return any(id(m) in inside_b for _, m in a) or any(id(m) in inside_a for _, m in b)
