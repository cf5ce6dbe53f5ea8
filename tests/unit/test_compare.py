"""scalpel compare on hand-made records that differ in exactly one thing: the verdict must name it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.compare import compare_records
from torchscalpel.record import SCHEMA_VERSION, RunRecord, StepRecord, load_record, save_record
from torchscalpel.report.compare_page import render
from torchscalpel.runtime.summary import summarize

PHASE_MS = {"data": 1.0, "forward": 3.0, "backward": 5.0, "optimizer": 1.0, "other": 0.5}


def make_record(
    *,
    backward_scale: float = 1.0,
    seed: int = 0,
    torch_version: str = "2.12.0",
    losses: list[float] | None = None,
    settings: dict | None = None,
    jitter: float = 0.01,
) -> RunRecord:
    """A record of 12 measured steps (+2 warm-up) with a small, fixed spread."""
    steps = []
    for i in range(14):
        wiggle = 1.0 + jitter * ((i % 3) - 1)
        phases = {k: v * wiggle * (backward_scale if k == "backward" else 1.0) for k, v in PHASE_MS.items()}
        steps.append(
            StepRecord(
                index=i,
                warmup=i < 2,
                total_ms=sum(phases.values()),
                **{f"{k}_ms": v for k, v in phases.items()},
                loss=(losses[i] if losses else 2.0 / (i + 1)),
                samples=32,
            )
        )
    record = RunRecord(
        name="train",
        created="2026-12-01T10:00:00+0000",
        steps=steps,
        command=["scalpel", "profile", "--", "train.py"],
        target={"script": "train.py", "module": None, "args": ["--lr", "0.1"]},
        environment={
            "python": "3.11.7",
            "torch": torch_version,
            "packages": {"torch": torch_version, "numpy": "2.4.6"},
            "cpu": {"model": "Xeon", "load_avg_1m": 0.1 * seed + backward_scale},
        },
        config={"warmup": 2, "steps": 12, "profile_steps": 0, "module_times": False, "step_kind": "auto"},
        provenance={
            "git": {"commit": "a" * 40, "branch": "main", "dirty": False, "diff_sha256": "0" * 64},
            "code": {
                "script": {"path": "train.py", "sha256": "1" * 64},
                "modules": {"helpers": {"path": "helpers.py", "sha256": "2" * 64}},
            },
            "data": {"dataset_len": 256, "shapes": [[32, 8]], "dtypes": ["float32"], "sha256": "3" * 64},
            "seeds": {
                "calls": [{"source": "torch", "seed": seed}],
                "torch_initial_seed": seed,
                "loaders": [],
            },
        },
    )
    if settings is not None:
        record.config["tune_settings"] = settings
    record.summary = summarize(record)
    return record


def test_a_faked_torch_upgrade_slower_in_backward_is_named() -> None:
    a, b = make_record(), make_record(backward_scale=1.652, torch_version="2.13.0")
    cmp = compare_records([a, b])
    verdict = cmp.pairs[0].verdict
    assert verdict.startswith("B is 1.31x slower per step, all of it in backward")
    assert "torch 2.12.0 -> 2.13.0 is the only environment change" in verdict
    # the load average differs too, but it differs between any two runs: never a difference
    assert [d.key for d in cmp.pairs[0].differences] == ["torch"]


def test_a_seed_is_named_and_losses_first_differ_where_they_do() -> None:
    base = [2.0 / (i + 1) for i in range(14)]
    other = list(base)
    other[5] += 1e-7
    cmp = compare_records([make_record(losses=base), make_record(seed=1, losses=other)])
    pair = cmp.pairs[0]
    assert pair.losses.first_diff_step == 5 and not pair.losses.identical
    assert "within noise" in pair.verdict
    assert "seed (torch) 0 -> 1 is the only recorded difference" in pair.verdict
    assert "losses first differ at step 5" in pair.verdict


def test_a_tune_knob_is_named_and_identical_losses_are_bit_identical() -> None:
    cmp = compare_records([make_record(), make_record(settings={"amp": "bf16"})])
    pair = cmp.pairs[0]
    assert pair.losses.identical and pair.losses.compared == 14
    assert "losses bit-identical over 14 steps" in pair.verdict
    assert "tune.amp (none) -> bf16 is the only recorded difference" in pair.verdict


def test_no_difference_and_noise_keeps_a_small_change_unnamed() -> None:
    noisy_a = make_record(jitter=0.3)
    noisy_b = make_record(jitter=0.3, backward_scale=1.05)
    pair = compare_records([noisy_a, noisy_b]).pairs[0]
    assert not pair.significant and "within noise" in pair.verdict
    assert pair.verdict.endswith(
        "no recorded difference in config, tune settings, code, data, seeds or environment"
    )


def test_code_and_data_differences_are_listed() -> None:
    a, b = make_record(), make_record()
    b.provenance["code"]["modules"]["helpers"]["sha256"] = "9" * 64
    b.provenance["data"]["sha256"] = "8" * 64
    keys = [d.key for d in compare_records([a, b]).pairs[0].differences]
    assert keys == ["module helpers hash", "first batch content hash"]


def test_three_runs_each_against_the_first() -> None:
    cmp = compare_records([make_record(), make_record(seed=2), make_record(torch_version="2.14.0")])
    assert [(p.a.label, p.b.label) for p in cmp.pairs] == [("A", "B"), ("A", "C")]
    assert "seed (torch) 0 -> 2" in cmp.pairs[0].verdict and "torch 2.12.0 -> 2.14.0" in cmp.pairs[1].verdict


def test_html_is_self_contained_with_overlaid_curves() -> None:
    page = render(compare_records([make_record(), make_record(backward_scale=1.652, torch_version="2.13.0")]))
    assert 'data-chart="compare-loss"' in page and 'data-chart="compare-steps"' in page
    assert page.count("<polyline") >= 4  # two runs on each of the two line charts
    assert "<script" not in page and not re.search(r"(src|href)=\"https?://", page)
    assert "all of it in backward" in page


def _write(tmp_path: Path, name: str, record: RunRecord) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    save_record(record, folder)
    return folder


def test_cli_json_html_and_an_older_minor_schema_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = make_record()
    old.schema_version, old.provenance = "1.2", {}
    a = _write(tmp_path, "a", old)
    b = _write(tmp_path, "b", make_record(backward_scale=1.652, torch_version="2.13.0"))
    assert (
        main(
            [
                "compare",
                str(a),
                str(b / "run.json"),
                "--json",
                str(tmp_path / "c.json"),
                "--html",
                str(tmp_path / "c.html"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "verdict A -> B: B is 1.31x slower per step, all of it in backward" in out
    assert "schema 1.2 record" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["pairs"][0]["differences"] == [
        {"kind": "environment", "key": "torch", "a": "2.12.0", "b": "2.13.0"}
    ]
    assert any("no provenance" in n for n in data["notes"])
    assert (tmp_path / "c.html").read_text().startswith("<!DOCTYPE html>")
    assert load_record(a).schema_version == "1.2"  # older records still load


def test_cli_refuses_a_newer_major_schema_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = make_record()
    newer.schema_version = f"{int(SCHEMA_VERSION.split('.')[0]) + 1}.0"
    a = _write(tmp_path, "a", make_record())
    b = _write(tmp_path, "b", newer)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "newer than" in err and "upgrade torchscalpel" in err


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path, "a", make_record())
    assert main(["compare", str(a)]) == 2
    assert "at least two runs" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(a), str(tmp_path / "empty")]) == 2
    assert "holds no run.json" in capsys.readouterr().err
    (tmp_path / "launch").mkdir()
    _write(tmp_path / "launch", "rank-0", make_record())
    assert main(["compare", str(a), str(tmp_path / "launch")]) == 2
    assert "is a launch folder; compare one rank's run, e.g." in capsys.readouterr().err


def test_phases_moving_both_ways_are_named_with_their_signs() -> None:
    a = make_record()
    b = make_record()
    for s in b.steps:  # forward 3 ms faster, backward 1.5 ms slower: net 1.5 ms faster
        s.forward_ms -= 3.0
        s.backward_ms += 1.5
        s.total_ms -= 1.5
    b.summary = summarize(b)
    verdict = compare_records([a, b]).pairs[0].verdict
    assert "faster per step, net of forward -3.0 ms, backward +1.5 ms" in verdict, verdict


def _skewed(forward_ms: list[float], backward_ms: float) -> RunRecord:
    """12 measured steps whose forward times are ``forward_ms`` (one outlier pulls the mean off the median)."""
    record = make_record()
    measured = [s for s in record.steps if not s.warmup]
    for s, f in zip(measured, forward_ms, strict=True):
        s.forward_ms, s.backward_ms = f, backward_ms
        s.total_ms = sum(s.phase_ms().values())
    record.summary = summarize(record)
    return record


def test_the_phase_chart_plots_the_medians_its_table_names() -> None:
    # the run: forward 15.5 ms in the chart, 13.30 ms in the table titled "median"
    a = _skewed([13.3] * 11 + [39.5], backward_ms=20.0)  # mean 15.48, median 13.30
    b = _skewed([10.0] * 10 + [60.0, 61.0], backward_ms=20.0)  # mean 18.42, median 10.00
    cmp = compare_records([a, b])
    page = render(cmp)
    section = page[page.index('id="steps"') :]
    table_html, chart = section.split('data-chart="compare-phases"', 1)
    chart = chart[: chart.index("</svg>")]
    cells = {
        m[1]: [float(x) for x in re.findall(r'<td class="num">([\d.]+)</td>', m[2])]
        for m in re.finditer(r'<tr><td class="">(\w+)</td>(.*?)</tr>', table_html)
    }
    plotted = {
        (m[1], m[2]): float(m[3]) for m in re.finditer(r"<title>(\w) (\w+): ([\d.,]+) ms</title>", chart)
    }
    assert cells["forward"] == [13.3, 10.0]
    for phase in ("data", "forward", "backward", "optimizer", "other"):
        for label, cell in zip("AB", cells[phase], strict=True):
            assert plotted[(label, phase)] == pytest.approx(cell, abs=0.051), (label, phase, plotted, cells)
    # the verdict's phase deltas are the same medians: forward B - A read off the table
    assert cmp.pairs[0].phase_delta_ms["forward"] == pytest.approx(10.0 - 13.3)


def test_stacked_medians_that_do_not_add_up_to_the_median_step_are_said() -> None:
    b = make_record()
    for s in b.steps:  # every step 31.5 ms, spent in one phase of three in turn: each phase's median is 0
        s.data_ms, s.forward_ms, s.backward_ms = [(30.0, 0.0, 0.0), (0.0, 30.0, 0.0), (0.0, 0.0, 30.0)][
            s.index % 3
        ]
        s.total_ms = sum(s.phase_ms().values())
    b.summary = summarize(b)
    page = render(compare_records([make_record(), b]))
    assert (
        "need not add up to the median step when steps vary (B: 1.50 ms stacked, 31.50 ms median step)"
        in page
    )
    assert "A: " not in page[page.index("need not add up") : page.index("median step)")]


def test_terminal_comparison_fits_80_columns_with_numbers_whole() -> None:
    import io

    from rich.console import Console

    import torchscalpel.report.compare_terminal as compare_terminal

    a, b = make_record(), make_record(backward_scale=1.652, torch_version="2.13.0", settings={"amp": "bf16"})
    b.provenance["data"]["sha256"] = "8" * 64
    cmp = compare_records([a, b, make_record(seed=3)])
    buf = io.StringIO()
    compare_terminal.render(cmp, Console(file=buf, width=80))  # an 80-column terminal
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()), [x for x in text.splitlines() if len(x) > 80]
    flat = " ".join(text.split())
    for pair in cmp.pairs:  # the verdict whole, wrapped only between words
        assert f"verdict {pair.a.label} -> {pair.b.label}: {' '.join(pair.verdict.split())}" in flat
    for r in cmp.runs:
        assert f"{r.facts.median_step_ms:.2f} ±{r.facts.noise:.0%}" in text


def test_piped_comparison_is_not_wrapped_at_80(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torchscalpel.report.compare_terminal as compare_terminal

    monkeypatch.delenv("COLUMNS", raising=False)
    cmp = compare_records([make_record(), make_record(backward_scale=1.652, torch_version="2.13.0")])
    cmp.runs[0].path = Path("/a/long/path/to/scalpel-runs/20261201-100000-train-with-a-long-name/run.json")
    compare_terminal.render(cmp)  # stdout captured: a pipe
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"A {cmp.runs[0].path} (train, ") and "schema" in line for line in lines), (
        lines
    )
    assert any(line == f"verdict A -> B: {cmp.pairs[0].verdict}" for line in lines), lines


def test_compare_page_labels_are_readable_names_with_units() -> None:
    page = render(compare_records([make_record(), make_record(backward_scale=1.652)]))
    loss = page.split('data-chart="compare-loss"', 1)[1].split("</svg>", 1)[0]
    # the y-axis names what is plotted (on a log scale where the losses span a decade)
    assert re.search(r">loss( \(log scale\))?</text>", loss) and ">value</text>" not in loss
    steps = page.split('data-chart="compare-steps"', 1)[1].split("</svg>", 1)[0]
    assert ">step time (ms)</text>" in steps
    assert "samples/s" in page and "samples_per_s" not in page  # the terminal's names, not raw keys
    assert "3,047.6" in page  # and its figures (4 significant digits in exponent form were shown here)


def test_a_noisy_run_is_named_in_the_verdict() -> None:
    quiet = compare_records([make_record(), make_record(backward_scale=1.652)]).pairs[0].verdict
    assert "noisy" not in quiet
    noisy = compare_records([make_record(jitter=0.5), make_record(backward_scale=1.652)]).pairs[0].verdict
    assert "noisy: A's steps vary ±" in noisy and "re-measure on an idle machine" in noisy


def test_a_commit_that_changed_no_file_that_ran_is_not_blamed() -> None:
    """The issue's case: a 1.22x slowdown from machine load, beside a git commit that touched no file of the
    script (script and module hashes equal); the commit was named "the only recorded difference"."""
    a, b = make_record(), make_record(backward_scale=1.5)
    for record, load in ((a, 0.6), (b, 6.2)):
        record.environment["cpu"] = {"model": "Xeon", "load_avg_1m": load, "usable_cores": 2}
    b.provenance["git"]["commit"] = "b" * 40
    pair = compare_records([a, b]).pairs[0]
    assert pair.significant and pair.verdict.startswith("B is 1.24x slower per step")
    assert "is the only recorded difference" not in pair.verdict
    assert (
        "no recorded difference in what ran (git commit aaaaaaaaaa -> bbbbbbbbbb changed no file"
        in pair.verdict
    )
    assert "machine load: A ran at load 0.6 on 2 cores, B ran at load 6.2 on 2 cores (busy)" in pair.verdict
    assert [d.ran for d in pair.differences] == [False]
    assert "code (no file that ran)" in render(compare_records([a, b]))
    # the same commit with the script changed is what ran: it is blamed
    b.provenance["code"]["script"]["sha256"] = "7" * 64
    blamed = compare_records([a, b]).pairs[0]
    assert (
        "2 recorded differences: git commit aaaaaaaaaa -> bbbbbbbbbb; script train.py hash" in blamed.verdict
    )
    assert all(d.ran for d in blamed.differences)


def test_a_verdict_within_noise_says_which_run_is_slower_and_by_how_much() -> None:
    noisy_a = make_record(jitter=0.3)
    noisy_b = make_record(jitter=0.3, backward_scale=1.2)
    pair = compare_records([noisy_a, noisy_b]).pairs[0]
    assert not pair.significant
    assert re.match(
        r"B is 1\.\d\dx slower per step than A, within noise \(threshold ±\d+%\)", pair.verdict
    ), pair.verdict
    faster = compare_records([noisy_b, noisy_a]).pairs[0]
    assert re.match(r"B is 1\.\d\dx faster per step than A, within noise", faster.verdict), faster.verdict
    assert "machine load" not in pair.verdict  # neither run was busy


def test_how_each_run_ended_is_not_a_config_difference() -> None:
    from torchscalpel.compare.differences import config_differences

    a = RunRecord(
        name="a", config={"steps": 8, "stopped_by": {"kind": "steps", "reason": "stopped after 10 steps"}}
    )
    b = RunRecord(
        name="b", config={"steps": 20, "stopped_by": {"kind": "steps", "reason": "stopped after 22 steps"}}
    )
    assert [d.key for d in config_differences(a, b)] == ["steps"]
