"""A trial's status and verdict: one spelling each, the same strings in JSON, old records still read."""

from __future__ import annotations

import json

import pytest

from torchscalpel.record import RunRecord
from torchscalpel.report.tune_sections import build
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.states import TrialStatus, Verdict
from torchscalpel.tune.verify import MIN_MARGIN


def test_states_are_spelled_once_and_compare_as_their_strings():
    assert [s.value for s in TrialStatus] == ["ok", "failed", "timeout", "not applied", "skipped", "not run"]
    assert [v.value for v in Verdict if v is not Verdict.UNJUDGED] == [
        "baseline",
        "winner",
        "not confirmed",
        "faster",
        "not faster",
        "numerics",
        "failed",
        "timeout",
        "skipped",
        "not applied",
        "not run",
    ]
    # what both enums share is one word, not two spellings
    shared = {s.value for s in TrialStatus} & {v.value for v in Verdict}
    assert shared == {"failed", "timeout", "not applied", "skipped", "not run"}
    assert TrialStatus.NOT_APPLIED == "not applied" and f"{Verdict.NOT_FASTER:>12}" == "  not faster"
    assert str(Verdict.WINNER) == "winner" and f"[{TrialStatus.TIMEOUT}]" == "[timeout]"


def test_to_dict_writes_plain_strings_and_from_dict_reads_them_back():
    trial = TrialResult(
        label="amp=bf16",
        settings={"amp": "bf16"},
        status=TrialStatus.NOT_APPLIED,
        verdict=Verdict.NOT_APPLIED,
    )
    data = trial.to_dict()
    assert type(data["status"]) is str and type(data["verdict"]) is str
    assert json.loads(json.dumps(data))["status"] == "not applied"
    back = TrialResult.from_dict({**json.loads(json.dumps(data)), "unknown_key": 1})
    assert back.status is TrialStatus.NOT_APPLIED and back.verdict is Verdict.NOT_APPLIED
    assert TrialResult(label="b", settings={}).verdict is Verdict.UNJUDGED


@pytest.mark.parametrize(
    ("old", "state"), [("not-applied", TrialStatus.NOT_APPLIED), ("not-run", TrialStatus.NOT_RUN)]
)
def test_old_records_status_spellings_are_read(old, state):
    assert TrialStatus.parse(old) is state
    assert (
        TrialResult.from_dict({"label": "x", "settings": {}, "status": old, "verdict": state.value}).status
        is state
    )


def test_an_unknown_state_is_an_error_not_a_silent_string():
    with pytest.raises(ValueError):
        TrialResult(label="x", settings={}, verdict="great")  # type: ignore[arg-type]


def _section(**extra):
    base = TrialResult(label="baseline", settings={}, median_ms=10.0, losses=[1.0], verdict=Verdict.BASELINE)
    old = {
        **TrialResult(
            label="compile(model)", settings={"compile": "model"}, verdict=Verdict.NOT_APPLIED
        ).to_dict(),
        "status": "not-applied",
    }  # written before the states were typed
    return {"baseline": base.to_dict(), "trials": [old], "winner": None, **extra}


def test_report_reads_an_old_record_and_takes_the_margin_from_it():
    sections = build(RunRecord(sections={"tune": _section(required_speedup=1.07)}))
    assert "Required speedup 1.07x" in sections[0].body
    assert "not applied" in sections[1].body


def test_report_without_a_stated_margin_uses_tunes_own():
    body = build(RunRecord(sections={"tune": _section()}))[0].body
    assert f"Required speedup {1 + MIN_MARGIN:.2f}x" in body
