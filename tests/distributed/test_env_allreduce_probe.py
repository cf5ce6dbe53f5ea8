"""The all_reduce probe between two local gloo processes: it measures, and a rank that fails is reported
(moved from tests/unit/test_env_probes.py)."""

from __future__ import annotations

import pytest

from torchscalpel.envcheck import probes


@pytest.mark.dist
def test_gloo_allreduce_between_two_local_processes() -> None:
    r = probes.allreduce_probe("gloo", 2, timeout=90)
    assert r.status == "ok", r.detail
    assert r.metrics["world_size"] == 2 and r.metrics["ms_per_call"] > 0


@pytest.mark.dist
def test_allreduce_probe_reports_a_failing_rank() -> None:
    # an unknown backend fails inside init_process_group on both ranks
    r = probes.allreduce_probe("no_such_backend", 2, timeout=60)
    assert r.status == "failed" and r.detail
