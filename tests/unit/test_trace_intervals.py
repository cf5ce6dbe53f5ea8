"""Interval arithmetic against a brute-force count on an integer grid; the straggler rule."""

from __future__ import annotations

import numpy as np
import pytest

from torchscalpel.trace.intervals import Coverage, clipped_length, merge, union_length
from torchscalpel.trace.ranks import stragglers


def _grid(starts, ends, size):
    g = np.zeros(size, dtype=bool)
    for s, e in zip(starts, ends, strict=True):
        g[int(s) : int(e)] = True
    return g


@pytest.mark.parametrize("seed", range(5))
def test_union_coverage_and_clipping_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = 400
    kinds = []
    for _ in range(3):
        s = rng.integers(0, size - 20, 30).astype(float)
        kinds.append((s, s + rng.integers(1, 20, 30)))
    grids = [_grid(s, e, size) for s, e in kinds]
    assert union_length(*kinds[0]) == grids[0].sum()
    ms, me, first = merge(*kinds[0])
    assert np.all(ms[1:] > me[:-1])  # disjoint and sorted
    assert np.all(kinds[0][0][first] == ms)  # the opening interval starts its group
    assert clipped_length(ms, me, 100, 250) == grids[0][100:250].sum()
    cov = Coverage(kinds)
    masks = sum((g.astype(int) << b) for b, g in enumerate(grids))
    expected = np.bincount(masks, minlength=8)
    assert np.allclose(cov.totals()[1:], expected[1:])
    expected_win = np.bincount(masks[50:300], minlength=8)
    assert np.allclose(cov.totals(50, 300)[1:], expected_win[1:])


def _rank(rank: int, durs: list[float], comm: list[float]) -> dict:
    return {
        "rank": rank,
        "steps": [
            {"name": f"ProfilerStep#{i}", "start_us": i * 1000.0, "dur_us": d, "communication_us": c}
            for i, (d, c) in enumerate(zip(durs, comm, strict=True))
        ],
    }


def test_straggler_named_only_when_collective_wait_differs() -> None:
    same = stragglers([_rank(0, [100, 110, 105], [30, 30, 30]), _rank(1, [101, 109, 104], [30.5, 30, 29])])
    assert "likely_straggler" not in same
    assert same["verdict"]["sentence"].startswith("none: ")
    assert same["steps"][0]["slowest_rank"] == 1 and same["steps"][1]["slowest_rank"] == 0
    # rank 0 waits ~0.4 ms of each ~1 ms step in its collective for rank 1, tight spreads
    skew = stragglers(
        [_rank(0, [1000, 1100, 1050], [400, 450, 420]), _rank(1, [1010, 1110, 1060], [50, 60, 50])]
    )
    assert skew["likely_straggler"] == 1
    assert skew["verdict"]["what"] == "per step outside collectives"
    assert stragglers([_rank(0, [100], [1])]) is None
    assert stragglers([_rank(1, [100], [1]), _rank(1, [100], [40])]) is None  # two runs, same rank number
    two = stragglers([_rank(0, [100, 110], [40, 45]), _rank(1, [101, 111], [5, 6])])  # two steps: no spread
    assert "likely_straggler" not in two
    assert (
        two["verdict"]["sentence"]
        == "not measured: rank 0 has 2, rank 1 has 2 steps; a spread needs 3 per rank"
    )
