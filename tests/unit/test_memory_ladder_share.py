"""Memory output defects found on public scripts (issue 27), checked on the section the observer writes."""

from __future__ import annotations

import re

import torchscalpel.report.memory_terminal as memory_terminal
from torchscalpel.memory.ladder import build_ladder
from torchscalpel.sections import MemorySection

MIB = 1024**2


def test_the_ladder_puts_every_rung_that_fits_before_those_that_do_not() -> None:
    # pytorch/examples mnist under a tight limit: the plan's micro-batches (even doubled) and bf16 stay over the
    # limit, a smaller batch fits; the first rung is the recommended fix (docs/memory.md), so it must fit
    plan = {
        "peak": 53 * MIB,
        "batch": 64,
        "max_batch": 20,
        "per_sample": 0.5 * MIB,
        "fixed": 19 * MIB,
        "microbatches": 8,
        "microbatch_peak": 34 * MIB,
        "bf16_peak": 36 * MIB,
        "blocks": 0,
        "batchnorm": None,
    }
    ladder = build_ladder(
        measured_peak=48 * MIB,
        limit=32 * MIB,
        plan=plan,
        cause="activations",
        breakdown={"activations": 19 * MIB, "temporaries": 20 * MIB},
        phase="backward",
        growth=None,
        fragmentation=None,
    )
    fits = [r["fits"] is True for r in ladder]
    assert fits[0], [(r["kind"], r["fits"]) for r in ladder]
    assert fits == sorted(fits, reverse=True), [(r["kind"], r["fits"]) for r in ladder]
    assert [r["kind"] for r in ladder] == ["max-batch", "micro-batches", "bf16"]


def test_largest_share_names_the_largest_category_printed() -> None:
    # mnist's default window: the peak is in the training backward, temporaries 44.8% > activations 24.6%; the
    # top cause reads those temporaries as activations (they scale with the batch), but "largest share" is a figure
    by_category = {
        "parameters": int(4.6 * MIB),
        "gradients": int(4.5 * MIB),
        "optimizer_state": int(9.2 * MIB),
        "activations": int(14.7 * MIB),
        "temporaries": int(26.8 * MIB),
    }
    section = {
        "peak": {
            "total": sum(by_category.values()),
            "step": 1,
            "phase": "backward",
            "op": "aten.x",
            "by_category": by_category,
        },
        "top_cause": {
            "key": "activations",
            "text": "activations saved for backward",
            "note": "temporaries of the training backward ... scale with the batch",
        },
    }
    lines = memory_terminal.render(MemorySection.from_dict(section))
    shares = {
        m.group(1).strip(): float(m.group(2))
        for line in lines
        if (m := re.match(r"  (\D+?)\s+[\d.]+ \w+\s+([\d.]+)%$", line))
    }
    largest = max(shares, key=lambda k: shares[k])
    share_line = next(line for line in lines if line.startswith("largest share:"))
    assert share_line.startswith(f"largest share: {largest}"), (share_line, shares)
    assert any(line.startswith("top cause: activations saved for backward (temporaries") for line in lines)


def test_under_growth_no_other_rung_comes_first_as_fitting() -> None:
    # logged losses keep their graphs: set-to-none "fitting" would only delay the out-of-memory (docs/memory.md)
    growth = {
        "per_step": 1 * MIB,
        "sites": [{"site": "train.py:9", "per_step": MIB, "live": 20 * MIB}],
        "kept": None,
    }
    ladder = build_ladder(
        measured_peak=41 * MIB,
        limit=40 * MIB,
        plan=None,
        cause="growth",
        breakdown={"gradients": 5 * MIB},
        phase="forward",
        growth=growth,
        fragmentation=None,
    )
    assert ladder[0]["kind"] == "stop-growth", [(r["kind"], r["fits"]) for r in ladder]
    assert next(r for r in ladder if r["kind"] == "set-to-none")["fits"] is False
