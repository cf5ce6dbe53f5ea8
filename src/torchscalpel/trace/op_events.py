"""The op-line pass's events as the pattern rules (:mod:`torchscalpel.trace.patterns`) and the ops table
read them: :class:`OpEvent` (one op, the user's line that called it, its time and kernels),
:class:`PassFacts` (the step it came from), :func:`op_cost` (what an op costs the step) and
:func:`op_lines` (per op name, the user line where it spends most). Torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OpEvent:
    """One op of the op-line pass, as the rules see it."""

    name: str
    """``aten::bmm``, or a CUDA runtime call (``cudaStreamSynchronize``)."""
    site: str | None
    """The user's ``file:line`` that called it (``runtime.userframes``); None: no user frame."""
    start_us: float = 0.0
    self_us: float = 0.0
    """Host time in the op itself, children excluded."""
    total_us: float = 0.0
    """Host time with its children."""
    device_us: float = 0.0
    """Device time of the kernels it launched itself (0 on CPU)."""
    shapes: tuple[tuple[int, ...], ...] = ()
    parent: str | None = None
    """The op it ran inside (``aten::linear`` for its ``aten::mm``); None: called by the user's line."""
    kernels: tuple[str, ...] = ()
    """Kernel and memcpy names it launched (``Memcpy HtoD (Pageable -> Device)``)."""
    backward: bool = False
    """Run by autograd for a forward op; ``site`` is then the forward op's line."""
    library_site: str | None = None
    """The installed package's ``file:line`` that made the call, when one did (transformers'
    ``eager_attention_forward``): ``site`` is then the user's line that called into the package."""

    @property
    def code_site(self) -> str | None:
        """The line whose code ran the op: the library's when a package made the call, else the user's."""
        return self.library_site or self.site

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {
            "name": self.name,
            "site": self.site,
            "start_us": self.start_us,
            "self_us": self.self_us,
            "total_us": self.total_us,
            "device_us": self.device_us,
            "shapes": [list(s) for s in self.shapes],
            "parent": self.parent,
            "kernels": list(self.kernels),
            "backward": self.backward,
            "library_site": self.library_site,
        }


@dataclass(frozen=True, slots=True)
class PassFacts:
    """What the rules need besides the events."""

    step_us: float
    """Wall time of the recorded step(s), the denominator of every share."""
    steps: int = 1
    cuda: bool = False
    compute_capability: tuple[int, int] | None = None
    """The GPU's (major, minor); tensor cores from 7.0, TF32 and bf16 from 8.0."""


def op_cost(e: OpEvent) -> float:
    """What an op costs the step: its own device time on a GPU, its own host time otherwise."""
    return e.device_us if e.device_us > 0 else e.self_us


def op_lines(events: Iterable[OpEvent], limit: int = 40) -> list[dict[str, object]]:
    """Per op name, the user line where it spends most (its share of the op, and its shapes there), and
    ``library_site``: the installed package's line that made most of those calls (None: the user's code did).

    Ops that ran without any user frame (the autograd engine's own work has the backward call's line)
    are left out. The ``limit`` names with the most time are kept, most first.
    """
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    shapes: dict[tuple[str, str], tuple[tuple[int, ...], ...]] = {}
    libraries: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if not e.site:
            continue
        cell = per[e.name][e.site]
        cell[0] += op_cost(e)
        cell[1] += 1
        shapes.setdefault((e.name, e.site), e.shapes)
        libraries[(e.name, e.site)][e.library_site or ""] += op_cost(e)
    rows = []
    for name, sites in per.items():
        total = sum(c[0] for c in sites.values())
        site, (cost, calls) = max(sites.items(), key=lambda kv: kv[1][0])
        by_library = libraries[(name, site)]
        library = max(by_library, key=lambda k: by_library[k]) if by_library else ""
        rows.append(
            {
                "name": name,
                "site": site,
                "site_share": cost / total if total > 0 else 1.0,
                "calls": int(calls),
                "self_us": total,
                "shapes": [list(s) for s in shapes[(name, site)]],
                "library_site": library or None,
            }
        )
    rows.sort(key=lambda r: -float(r["self_us"]))  # type: ignore[arg-type]
    return rows[:limit]
