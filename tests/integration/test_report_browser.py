"""Open every kind of page torchscalpel writes in headless Chromium: no console errors, every chart laid out
with visible marks and axis titles, the verdict first, no two labels of one chart alike, no tick labels that
run together or out of their chart, and a screenshot of each that is not blank."""

from __future__ import annotations

import html
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import run_cli

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
MEMORY = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fix"

# Appended to a copy of the report: measures what the browser actually laid out, and records
# any script error or console error into the DOM that --dump-dom prints.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
const origError = console.error; console.error = (...a) => { window.__errors.push(a.join(' ')); origError(...a); };
window.addEventListener('load', () => {
  // a label's own text (a bar label carries the full name in a <title> child: not part of what is shown)
  const own = t => [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
    const box = svg.getBoundingClientRect();
    const marks = [...svg.querySelectorAll('rect, polyline, circle')].filter(m => {
      const b = m.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length;
    const title = cls => { const t = svg.querySelector('text.axis-title.' + cls);
      if (!t) return null; const b = t.getBoundingClientRect();
      return b.width > 0 && b.height > 0 ? t.textContent : null; };
    const xticks = [...svg.querySelectorAll('text.tick.x-tick')];
    const ticks = xticks.map(t => t.textContent);
    const labels = {
      x: ticks,
      y: [...svg.querySelectorAll('text.tick.y-tick')].map(own),
      legend: [...svg.querySelectorAll('g.legend text')].map(own),
      bars: [...svg.querySelectorAll('text.bar-label')].map(own),
    };
    // x tick labels that overlap their neighbour ("step 10step 11") or leave the chart ("12,00(")
    const boxes = xticks.map(t => t.getBoundingClientRect()).sort((a, b) => a.left - b.left);
    const overlaps = boxes.slice(1).filter((b, i) => b.left < boxes[i].right).length;
    const outside = [...svg.querySelectorAll('text.tick, text.bar-label, g.legend text')].filter(t => {
      const b = t.getBoundingClientRect();
      return b.left < box.left - 0.5 || b.right > box.right + 0.5; }).map(own);
    // the labels of marks drawn inside the plot (a suggestion, a divergence, a limit, a peak): whole, in the chart
    const markLabels = [...svg.querySelectorAll('text.mark-label, text.peak-label, text.capacity-label')];
    const clipped = markLabels.filter(t => { const b = t.getBoundingClientRect();
      return b.left < box.left - 0.5 || b.right > box.right + 0.5 || b.top < box.top - 0.5 || b.bottom > box.bottom + 0.5;
    }).map(own);
    return {name: svg.dataset.chart, width: box.width, height: box.height, marks,
            x_title: title('x-title'), y_title: title('y-title'), ticks, labels, overlaps, outside,
            legend: !!svg.querySelector('g.legend'), capacity: !!svg.querySelector('.capacity, .capacity-label'),
            mark_labels: markLabels.map(own), clipped,
            peak: [...svg.querySelectorAll('text.peak-label')].map(own),
            y_scale: svg.dataset.yScale || null, y_min: parseFloat(svg.dataset.yMin), y_max: parseFloat(svg.dataset.yMax)};
  });
  // anything laid out past its card's edges (a table wider than the card, a long code line), unless a
  // scrolling box (a <pre>) or a chart (checked above) holds it
  const overflow = [];
  document.querySelectorAll('main section').forEach(sec => {
    const sb = sec.getBoundingClientRect();
    sec.querySelectorAll('*').forEach(el => {
      const b = el.getBoundingClientRect();
      if (b.width === 0 || b.height === 0) return;
      for (let p = el.parentElement; p && p !== sec; p = p.parentElement) {
        const ox = getComputedStyle(p).overflowX;
        if (ox === 'auto' || ox === 'scroll' || ox === 'hidden' || p.tagName.toLowerCase() === 'svg') return;
      }
      if (b.right > sb.right + 0.5 || b.left < sb.left - 0.5)
        overflow.push(sec.id + ' ' + el.tagName.toLowerCase() + ': ' + (el.textContent || '').slice(0, 80));
    });
  });
  const sections = [...document.querySelectorAll('main section')].map(s => ({id: s.id, top: s.getBoundingClientRect().top,
    headings: [...s.querySelectorAll('h3')].map(h => h.textContent), text: s.textContent.slice(0, 4000)}));
  const pre = document.createElement('pre'); pre.id = 'probe-result';
  pre.textContent = JSON.stringify({charts, sections, overflow, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser() -> str:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI: .ci/run should have installed the chromium package")
        pytest.skip("Chromium not installed (apt-get install chromium)")
    return browser


def _probe(browser: str, report: Path, tmp_path: Path, png: Path | None = None) -> dict:
    """What Chromium laid out for ``report``: charts (size, marks, axis titles, ticks, labels), sections, errors;
    with ``png``, a screenshot of the page too (the same browser run)."""
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--window-size=1100,1400",
            *([f"--screenshot={png}"] if png is not None else []),
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', result.stdout, re.S)
    assert match, f"probe did not run; chromium said: {result.stderr[-2000:]}"
    data = json.loads(html.unescape(match.group(1)))
    assert data["errors"] == []
    assert "Uncaught" not in result.stderr
    for chart in data["charts"]:  # every chart names both axes, and the titles are laid out (visible)
        assert chart["x_title"] and chart["y_title"], f"chart {chart['name']} lacks an axis title: {chart}"
    return data


def _section_order(data: dict) -> list[str]:
    return [s["id"] for s in sorted(data["sections"], key=lambda s: s["top"])]


def _png_colours(png: Path, most: int = 64) -> int:
    """How many distinct pixel colours a PNG holds (up to ``most``): a tiny decoder (8-bit RGB or RGBA, not
    interlaced, as Chromium writes screenshots), zlib and the five row filters of the PNG spec."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    pos, idat, width = 8, b"", 0
    channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    seen: set[bytes] = set()
    for row in range(len(raw) // (stride + 1)):
        kind, line = (
            raw[row * (stride + 1)],
            bytearray(raw[row * (stride + 1) + 1 : (row + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        if row % 7 == 0:  # every 7th row is plenty to tell a page from a blank one
            seen.update(bytes(line[i : i + channels]) for i in range(0, stride, channels * 5))
            if len(seen) >= most:
                return len(seen)
        prev = line
    return len(seen)


def _run(*args: str, cwd: Path | None = None) -> None:
    proc = run_cli(*args, cwd=cwd, OMP_NUM_THREADS="1")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # memory's out-of-memory run exits 1, by design


def _tune_page(base: Path) -> Path:
    """A tune record rendered by tune's own stage, its trials answered without running them (a real search is
    minutes of fresh processes; the page is what is under test)."""
    from torchscalpel.runtime.target import Target
    from torchscalpel.stages.demo import tune_options
    from torchscalpel.stages.tune import run as tune_stage_run
    from torchscalpel.tune import search as search_mod
    from torchscalpel.tune.options import SilentProgress
    from torchscalpel.tune.result import TrialResult

    def trial(target: Any, settings: Any, out_dir: Path, **kw: Any) -> TrialResult:
        label = settings.label()
        median = 100.0 if label == "baseline" else 60.0 if "amp" in label else 90.0 + len(label) % 7
        result = TrialResult(
            label=label,
            settings=settings.to_dict(),
            family=kw.get("family", "x"),
            out_dir=str(out_dir),
            wall_s=1.0,
        )
        result.median_ms = median
        result.step_ms = [median] * 5
        result.losses = [2.0 - 0.1 * i for i in range(5)]
        if kw.get(
            "facts"
        ):  # what the baseline's profile tells the search (a CPU model with a repeated block)
            result.facts = {
                "device": "cpu",
                "bf16_supported": True,
                "models": ["Net"],
                "loaders": 1,
                "cpu_count": 2,
                "torch_threads": 1,
                "optimizers": ["AdamW"],
                "repeated": [{"cls": "Block", "count": 2, "params": 10}],
            }
        if label != "baseline":
            result.apply = {"fired": ["x"], "applied": ["x"], "skipped": []}
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search_mod, "run_trial", trial)
        tune_stage_run(
            tune_options(Target(script=Path("train.py")), base / "tune", budget_s=60),
            progress=SilentProgress(),
        )
    return base / "tune" / "report.html"


def _lr_page(base: Path) -> Path:
    """An lr record made by the sweep's own observer, fed one loss per step (a sweep that diverges)."""
    from torchscalpel.lrfind.observer import LrSweepObserver
    from torchscalpel.lrfind.options import LrOptions
    from torchscalpel.record import RunRecord
    from torchscalpel.report.html import write_report

    losses = [2.0 - 0.03 * i for i in range(30)] + [50.0] * 10
    observer = LrSweepObserver(LrOptions(min_lr=1e-5, max_lr=1.0, steps=len(losses)))

    class Opt:
        param_groups = [{"lr": 0.1, "params": []}]

    class Step:
        def __init__(self, index: int, loss: float) -> None:
            self.index, self.loss = index, loss

    opt = Opt()  # one optimizer: the sweep follows the first it sees by identity (a new one each step
    # only worked while CPython happened to reuse the freed object's address)
    for i, loss in enumerate(losses):
        observer.on_optimizer_step_pre(opt)  # type: ignore[arg-type]
        observer.on_step_end(Step(i, loss))  # type: ignore[arg-type]
        if observer.divergence:
            break
    record = RunRecord(name="lr", command=["scalpel", "lr"])
    observer.on_finish(record)
    return write_report(record, base / "lr.html")


def _snapshot_page(base: Path) -> Path:
    """A snapshot laid out as torch writes one (segments, blocks with frames, a trace with segment events and an
    out-of-memory), read by the pure-Python reader and written as its page."""
    from torchscalpel.memory.snapshot import explain_snapshot
    from torchscalpel.report.snapshot_page import write_snapshot_page

    frames = [[{"filename": f"/home/u/train_{i}.py", "line": 10 + i, "name": "forward"}] for i in range(6)]
    blocks = [
        {
            "size": 1 << (16 + i % 6),
            "state": "active_allocated" if i % 4 else "inactive",
            "frames": frames[i % 6],
        }
        for i in range(40)
    ]
    events: list[dict[str, Any]] = [{"action": "segment_alloc", "size": 64 << 20, "frames": []}]
    for i in range(600):
        size = 1 << (16 + i % 6)
        events.append({"action": "alloc", "size": size, "frames": frames[i % 6]})
        if i % 3:
            events.append({"action": "free_completed", "size": size, "frames": []})
    events.append({"action": "oom", "size": 1 << 30, "device_free": 0, "frames": frames[0]})
    data = {"segments": [{"total_size": 64 << 20, "blocks": blocks}], "device_traces": [events]}
    path = base / "snap.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHSCALPEL_NATIVE", "0")
        explained = explain_snapshot(path)
    return write_snapshot_page(explained, base / "snapshot.html")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One page of each kind: profile, doctor, memory and plan from short real runs; compare and launch from
    those runs' records; tune, lr and a snapshot from their own stages' code without a training run."""
    from torchscalpel.compare import compare_runs
    from torchscalpel.distributed.rankmerge import merge
    from torchscalpel.record import load_record
    from torchscalpel.report.compare_page import write_html
    from torchscalpel.report.launch_page import write_launch_page

    _browser()
    base = tmp_path_factory.mktemp("pages")
    script = str(SCRIPTS / "epoch_loop.py")
    _run(
        "profile",
        "--out",
        str(base / "profile"),
        "--warmup",
        "1",
        "--steps",
        "6",
        "--profile-steps",
        "2",
        "--",
        script,
    )
    _run("doctor", "--out", str(base / "doctor"), "--warmup", "1", "--steps", "3", "--", script)
    _run(
        "memory",
        "--steps",
        "all",
        "--memory-limit",
        "60MiB",
        "--no-plan",
        "--out",
        str(base / "memory"),
        "--",
        str(MEMORY / "logged_losses.py"),
    )
    factory = base / "models_for_browser.py"
    factory.write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), "
        "nn.Linear(256, 10))\n"
    )
    # a small device so the capacity line lies within the bars' scale
    _run(
        "plan",
        "--model",
        f"{factory}:build",
        "--batch",
        "x=float32[64,256],y=int64[64]:10",
        "--device-memory",
        "3MiB",
        "--no-max-batch",
        "--out",
        str(base / "plan"),
        cwd=base,
    )
    # a healthy memory run: its verdict reports a peak inside a step, above every step-end bar
    _run("memory", "--steps", "12", "--no-plan", "--out", str(base / "memory-healthy"), "--", script)
    # the profile's own trace through scalpel analyze
    _run("analyze", str(base / "profile"), "--top", "8", "--html", str(base / "analyze.html"))
    # a doctor run of a trainer fix patches (two findings), fixed without --apply, then its report
    proj = base / "proj"
    proj.mkdir()
    shutil.copy(FIX / "resume_regression.py", proj / "train.py")
    _run("doctor", "--out", "doctor", "--", "train.py", cwd=proj)
    _run("fix", "doctor", cwd=proj)
    _run("report", "doctor", cwd=proj)
    out = {
        kind: base / kind / "report.html"
        for kind in ("profile", "doctor", "memory", "memory-healthy", "plan")
    }
    out["analyze"] = base / "analyze.html"
    out["fix"] = proj / "doctor" / "fix.html"
    out["fixed-run"] = proj / "doctor" / "report.html"
    out["compare"] = write_html(compare_runs([base / "profile", base / "doctor"]), base / "compare.html")
    records = {0: load_record(base / "profile" / "run.json"), 1: load_record(base / "doctor" / "run.json")}
    merged = json.loads(json.dumps(merge(records), default=str))
    out["launch"] = write_launch_page(merged, base / "launch.html", subtitle="two ranks")
    out["tune"] = _tune_page(base)
    out["lr"] = _lr_page(base)
    out["snapshot"] = _snapshot_page(base)
    yield out


FIRST_SECTION = {
    "profile": "profile-verdict",
    "doctor": "findings",
    "memory": "memory",
    "plan": "plan",
    "compare": "verdict",
    "launch": "verdict",
    "tune": "tune",
    "lr": "lr",
    "snapshot": "verdict",
    "memory-healthy": "memory",
    "analyze": "verdict",
    "fix": "fix",
    "fixed-run": "findings",
}
"""The verdict section each kind of page opens with."""


@pytest.fixture(scope="module")
def laid_out(pages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    browser = _browser()
    shots = tmp_path_factory.mktemp("screenshots")
    out = {}
    for kind, page in pages.items():  # one browser run a page: its layout and its screenshot
        png = shots / f"{kind}.png"
        out[kind] = {**_probe(browser, page, tmp_path_factory.mktemp(f"probe-{kind}"), png), "png": png}
    return out


@pytest.mark.browser
@pytest.mark.parametrize("kind", sorted(FIRST_SECTION))
def test_each_page_opens_with_its_verdict_and_its_chart_labels_are_distinct_and_apart(
    kind: str, laid_out: dict[str, dict]
) -> None:
    data = laid_out[kind]
    order = _section_order(data)
    assert order and order[0] == FIRST_SECTION[kind], (kind, order)
    for chart in data["charts"]:
        for axis, labels in chart["labels"].items():
            repeated = sorted({x for x in labels if labels.count(x) > 1})
            assert not repeated, f"{kind}: chart {chart['name']} repeats {axis} labels {repeated}"
        assert chart["overlaps"] == 0, (
            f"{kind}: chart {chart['name']} x tick labels run together: {chart['ticks']}"
        )
        assert chart["outside"] == [], (
            f"{kind}: chart {chart['name']} labels leave the chart: {chart['outside']}"
        )
        assert chart["clipped"] == [], (
            f"{kind}: chart {chart['name']} cuts its mark labels: {chart['clipped']}"
        )
        if chart["y_scale"] is not None:  # a line chart: log exactly where its positive values span decades
            decades = chart["y_min"] > 0 and chart["y_max"] >= 10 * chart["y_min"]
            assert (chart["y_scale"] == "log") == decades, (
                f"{kind}: chart {chart['name']} draws {chart['y_min']}..{chart['y_max']} on a {chart['y_scale']} axis"
            )
    assert data["overflow"] == [], f"{kind}: laid out past its card: {data['overflow'][:5]}"
    png = data["png"]
    assert png.is_file() and png.stat().st_size > 1000, f"no screenshot of the {kind} page"
    assert _png_colours(png) > 8, f"the {kind} page's screenshot is blank"


@pytest.mark.browser
def test_report_renders_charts_without_console_errors(laid_out: dict[str, dict]) -> None:
    data = laid_out["profile"]
    charts = {c["name"]: c for c in data["charts"]}
    for name in ("step-breakdown", "loss", "memory", "top-ops"):
        assert name in charts, f"chart {name} missing: {sorted(charts)}"
        assert charts[name]["width"] > 100 and charts[name]["height"] > 50
        assert charts[name]["marks"] >= 1
    assert charts["step-breakdown"]["marks"] >= 6 * 3  # 6 measured steps, at least 3 visible phases each
    step = charts["step-breakdown"]
    assert step["legend"] and not charts["loss"]["legend"]  # a legend only where there are several series
    assert step["ticks"] and all(
        re.fullmatch(r"\d+[wpf]?", t) for t in step["ticks"]
    )  # whole numbers (w warm-up, p profiled, f FLOP-counted)
    assert charts["loss"]["ticks"] and all(re.fullmatch(r"\d+", t) for t in charts["loss"]["ticks"])
    order = _section_order(data)
    assert order[-1] == "environment" and order.index("overview") < order.index("steps")


@pytest.mark.browser
def test_plan_report_leads_with_the_plan_and_draws_the_device_limit(laid_out: dict[str, dict]) -> None:
    data = laid_out["plan"]
    order = _section_order(data)
    assert order[0] == "plan" and order[-1] == "environment"
    assert "overview" not in order  # no "0 measured steps ... timing clock: ?" for a plan
    chart = next(c for c in data["charts"] if c["name"] == "plan-memory")
    assert chart["capacity"] and chart["legend"] and chart["marks"] >= 3
    assert "MiB" in chart["y_title"]


@pytest.mark.browser
def test_the_snapshot_page_draws_allocated_and_reserved_over_the_trace(laid_out: dict[str, dict]) -> None:
    chart = next(c for c in laid_out["snapshot"]["charts"] if c["name"] == "snapshot-timeline")
    assert chart["legend"] and chart["labels"]["legend"] == ["allocated", "reserved"] and chart["marks"] >= 2


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["memory", "memory-healthy"])
def test_the_memory_chart_draws_the_peak_its_verdict_reports(kind: str, laid_out: dict[str, dict]) -> None:
    data = laid_out[kind]
    verdict = next(s for s in data["sections"] if s["id"] == "memory")
    reported = next(h for h in verdict["headings"] if h.startswith("At the peak: "))
    figure = reported.removeprefix("At the peak: ")
    chart = next(c for c in data["charts"] if c["name"] == "memory-steps")
    assert chart["peak"] and figure in chart["peak"][0], (reported, chart["peak"])
    assert chart["clipped"] == []


@pytest.mark.browser
def test_the_lr_sweep_draws_its_divergence_spike_on_a_log_loss_axis(laid_out: dict[str, dict]) -> None:
    chart = next(c for c in laid_out["lr"]["charts"] if c["name"] == "lr-range-test")
    assert chart["y_scale"] == "log" and "log scale" in chart["y_title"], chart
    assert any(t.startswith("diverged") for t in chart["mark_labels"]) and chart["clipped"] == []
    assert len(chart["labels"]["y"]) >= 3  # the descent has ticks of its own, not one tick under the spike


@pytest.mark.browser
def test_the_fix_page_and_the_fixed_runs_report_show_the_patch(laid_out: dict[str, dict]) -> None:
    page = {s["id"]: s for s in laid_out["fix"]["sections"]}
    assert list(page)[:1] == ["fix"] and {"fix-measured", "fix-diff"} <= set(page)
    assert "2 changes patched in 1 file" in page["fix"]["text"] and "not verified" in page["fix"]["text"]
    assert "findings fixed: unsafe-torch-load, whole-model-save" in page["fix-measured"]["text"]
    assert "+    torch.save(model.state_dict(), CKPT)" in page["fix-diff"]["text"]
    order = _section_order(laid_out["fixed-run"])
    assert order[0] == "findings" and "fix" in order and "fix-diff" in order, order
    assert order.index("fix") < order.index("fix-diff")


@pytest.mark.browser
def test_the_analyze_page_opens_with_what_the_trace_says(laid_out: dict[str, dict]) -> None:
    verdict = next(s for s in laid_out["analyze"]["sections"] if s["id"] == "verdict")
    assert re.search(r"1 trace, \d+ profiled step\(s\): mean step [\d.]+ ms", verdict["text"]), verdict[
        "text"
    ]
    assert "next: " in verdict["text"]
