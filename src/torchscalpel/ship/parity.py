"""Parity: does each exported form compute what the eager model computes?

Every export runs the same inputs at several batch sizes (1, 7, the maximum) as eager; per output
we record the max absolute and max relative error and pass when every element satisfies
``|got - want| <= atol + rtol * |want|`` with tolerances chosen by the output's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from torchscalpel.ship.runners import Runner

TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-8, 1e-6),
    "float32": (1e-4, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}
"""dtype -> (atol, rtol). Integer and bool outputs must match exactly."""
INT8_TOLERANCE = (5e-2, 5e-2)


def tolerance_for(
    dtype: np.dtype, override: tuple[float | None, float | None] = (None, None)
) -> tuple[float, float]:
    """(atol, rtol) for an output of ``dtype``, with user overrides applied."""
    atol, rtol = TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))
    return (
        override[0] if override[0] is not None else atol,
        override[1] if override[1] is not None else rtol,
    )


@dataclass(kw_only=True, slots=True)
class ParityCheck:
    """One export, one batch size, one output."""

    format: str
    batch: int
    output: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    note: str = ""
    sizes: str = ""
    """Sizes of the dynamic dimensions besides the batch, e.g. ``seq=64`` (empty: the example's)."""

    def to_dict(self) -> dict[str, object]:
        """JSON form for the manifest."""
        return asdict(self)

    @classmethod
    def failed_to_run(cls, fmt: str, batch: int, exc: BaseException) -> ParityCheck:
        """An export that could not run this batch: a parity failure with the exception's first line."""
        return cls(
            format=fmt,
            batch=batch,
            output="*",
            max_abs=float("inf"),
            max_rel=float("inf"),
            atol=0.0,
            rtol=0.0,
            passed=False,
            note=f"failed to run: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}",
        )


def compare(
    fmt: str,
    batch: int,
    names: Sequence[str],
    want: Sequence[np.ndarray],
    got: Sequence[np.ndarray],
    override: tuple[float | None, float | None] = (None, None),
) -> list[ParityCheck]:
    """Compare one run of an export with eager's outputs for the same inputs."""
    if len(got) != len(want):
        return [
            ParityCheck(
                format=fmt,
                batch=batch,
                output="*",
                max_abs=float("inf"),
                max_rel=float("inf"),
                atol=0.0,
                rtol=0.0,
                passed=False,
                note=f"{len(got)} outputs, eager has {len(want)}",
            )
        ]
    checks = []
    for name, w, g in zip(names, want, got, strict=True):
        atol, rtol = tolerance_for(w.dtype, override)
        if w.shape != g.shape:
            checks.append(
                ParityCheck(
                    format=fmt,
                    batch=batch,
                    output=name,
                    max_abs=float("inf"),
                    max_rel=float("inf"),
                    atol=atol,
                    rtol=rtol,
                    passed=False,
                    note=f"shape {g.shape} vs eager {w.shape}",
                )
            )
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        diff = np.abs(g64 - w64)
        nan_mismatch = bool(np.any(np.isnan(w64) != np.isnan(g64)))
        diff = np.where(np.isnan(w64) & np.isnan(g64), 0.0, diff)
        max_abs = float(np.nanmax(diff)) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(w64), np.finfo(np.float64).tiny)
        max_rel = float(np.nanmax(np.where(diff == 0, 0.0, rel))) if diff.size else 0.0
        ok = bool(np.all(diff <= atol + rtol * np.abs(w64))) and not nan_mismatch
        checks.append(
            ParityCheck(
                format=fmt,
                batch=batch,
                output=name,
                max_abs=max_abs,
                max_rel=max_rel,
                atol=atol,
                rtol=rtol,
                passed=ok,
                note="NaN where eager has none" if nan_mismatch else "",
            )
        )
    return checks


def run_parity(
    eager: Runner,
    exports: Sequence[Runner],
    batches: dict[int, list[np.ndarray]],
    output_names: Sequence[str],
    override: tuple[float | None, float | None] = (None, None),
) -> list[ParityCheck]:
    """Run every export at every batch size against eager."""
    checks: list[ParityCheck] = []
    for size, inputs in batches.items():
        want = eager(inputs)
        for runner in exports:
            try:
                got = runner(inputs)
            except (
                Exception
            ) as exc:  # an export that cannot run a batch size is a parity failure, with the reason
                checks.append(ParityCheck.failed_to_run(runner.name, size, exc))
                continue
            checks.extend(compare(runner.name, size, output_names, want, got, override))
    return checks


def format_table(checks: Sequence[ParityCheck]) -> str:
    """Plain-text table of parity results (printed by the CLI, pass or fail)."""
    lines = [
        f"{'format':<12} {'batch':>5} {'output':<12} {'max abs':>10} {'max rel':>10} {'atol':>8} {'rtol':>8}  result"
    ]
    for c in checks:
        lines.append(
            f"{c.format:<12} {c.batch:>5} {c.output:<12} {c.max_abs:>10.3g} {c.max_rel:>10.3g} {c.atol:>8.0e} "
            f"{c.rtol:>8.0e}  {'ok' if c.passed else 'FAIL'}{'  ' + c.sizes if c.sizes else ''}"
            f"{'  ' + c.note if c.note else ''}"
        )
    return "\n".join(lines)
