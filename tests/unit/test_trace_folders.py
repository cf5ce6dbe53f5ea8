"""scalpel analyze's folder kinds (run, launch, TensorBoard logdir, rank traces), memory counter tracks,
and the HTA trace_dir layout of launch folders (HTA itself loading one, in its own venv's process:
tests/integration/test_trace_folders_hta.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.errors import UsageError
from torchscalpel.trace import analyze_traces, expand_paths
from torchscalpel.trace.counters import add_memory_counters
from torchscalpel.trace.layout import TRACES_DIR, trace_rank, write_rank_traces
from trace_builders import make_launch, trace_events, write_run, write_trace


def test_a_run_folder_is_its_trace_not_its_record(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    assert expand_paths([run]) == [run / "trace.json.gz"]
    with pytest.raises(UsageError, match="run folder without a profiler trace"):
        expand_paths([write_run(tmp_path / "bare", trace=False)])


def test_a_launch_folder_is_its_ranks_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "launch"
    for r in (1, 0):
        write_run(out / f"rank-{r}", rank=r)
    (out / "launch.json").write_text(json.dumps({"ranks": [{"rank": 0}, {"rank": 1}]}))
    write_rank_traces(out)  # the HTA copies are not read a second time
    assert expand_paths([out]) == [out / "rank-0" / "trace.json.gz", out / "rank-1" / "trace.json.gz"]
    assert main(["analyze", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rank 0 · cpu" in printed and "rank 1 · cpu" in printed


def test_a_tensorboard_logdir_is_searched_at_any_depth(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    (logdir / "run1").mkdir(parents=True)
    (logdir / "run1" / "events.out.tfevents.1.host").write_bytes(b"not a trace")
    a = write_trace(logdir / "plugins" / "profile" / "run1" / "rank0.pt.trace.json.gz", 0)
    b = write_trace(logdir / "plugins" / "profile" / "run1" / "rank1.pt.trace.json.gz", 1)
    assert expand_paths([logdir]) == [a, b]
    result = analyze_traces([logdir]).to_dict()
    assert [r["rank"] for r in result["ranks"]] == [0, 1]


def test_a_folder_of_rank_traces_still_reads_flat(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "t" / "rank-0.json.gz", 0)
    assert expand_paths([tmp_path / "t"]) == [a]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="TensorBoard log folder"):
        expand_paths([tmp_path / "empty"])


def test_memory_counters_are_added_once_and_change_no_figure(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "trace.json.gz")
    before = analyze_traces([path]).to_dict()
    assert add_memory_counters(path) == 3
    assert add_memory_counters(path) == 0  # already there
    with gzip.open(path, "rt") as f:
        counters = [e for e in json.load(f)["traceEvents"] if e["ph"] == "C"]
    assert [(c["name"], c["ts"], c["args"]["allocated"]) for c in counters] == [
        ("Memory (cpu)", 12, 4096),
        ("Memory (cpu)", 30, 8192),
        ("Memory (cpu)", 70, 4096),
    ]
    after = analyze_traces([path]).to_dict()
    assert (
        after["top_ops"] == before["top_ops"]
        and after["memory"]["peak_bytes"] == before["memory"]["peak_bytes"] == 8192
    )


def test_launch_traces_folder_follows_htas_layout_contract(tmp_path: Path) -> None:
    out = make_launch(tmp_path)
    written = write_rank_traces(out)
    folder = out / TRACES_DIR
    # HTA reads every *.json / *.gz file directly in trace_dir as a trace: only rank traces may be there
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    assert written == [folder / "rank-0.pt.trace.json.gz", folder / "rank-1.pt.trace.json.gz"]
    assert [trace_rank(p) for p in written] == [0, 1]  # HTA's own pattern: '"rank":\s+(\d+)'
    with gzip.open(written[1], "rt") as f:
        data = json.load(f)
    assert data["distributedInfo"]["rank"] == 1 and len(data["traceEvents"]) == 6
    assert trace_rank(out / "launch.json") == 0  # why launch.json itself must stay out of trace_dir


def test_counters_are_spliced_into_torchs_bytes_or_the_document_rewritten(tmp_path: Path) -> None:
    torch_style = json.dumps(trace_events(rank=3), indent=2).replace('"traceEvents"', '"traceEvents"') + "\n"
    path = tmp_path / "t.json"
    path.write_text(torch_style[:-2] + ',\n  "traceName": "x]y.json"\n}\n')  # a ']' after the array too
    assert add_memory_counters(path) == 3
    text = path.read_text()
    assert text.startswith(torch_style[: torch_style.index('"traceEvents"')])  # head kept byte for byte
    data = json.loads(text)
    assert data["traceName"] == "x]y.json" and [e["ph"] for e in data["traceEvents"]].count("C") == 3
    assert trace_rank(path) == 3
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"traceEvents": trace_events()["traceEvents"], "meta": {"list": [1, 2]}}))
    assert add_memory_counters(other) == 3  # not torch's tail: the whole document is written again
    data = json.loads(other.read_text())
    assert data["meta"] == {"list": [1, 2]} and len(data["traceEvents"]) == 9
