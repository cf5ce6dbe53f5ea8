"""Open report.html in headless Chromium: no console errors, every chart laid out with visible marks and
axis titles, and the verdict (findings, recommendation, plan) above the evidence and the environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import run_cli

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"

# Appended to a copy of the report: measures what the browser actually laid out, and records
# any script error or console error into the DOM that --dump-dom prints.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
const origError = console.error; console.error = (...a) => { window.__errors.push(a.join(' ')); origError(...a); };
window.addEventListener('load', () => {
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
    const box = svg.getBoundingClientRect();
    const marks = [...svg.querySelectorAll('rect, polyline, circle')].filter(m => {
      const b = m.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length;
    const title = cls => { const t = svg.querySelector('text.axis-title.' + cls);
      if (!t) return null; const b = t.getBoundingClientRect();
      return b.width > 0 && b.height > 0 ? t.textContent : null; };
    const ticks = [...svg.querySelectorAll('text.tick.x-tick')].map(t => t.textContent);
    return {name: svg.dataset.chart, width: box.width, height: box.height, marks,
            x_title: title('x-title'), y_title: title('y-title'), ticks,
            legend: !!svg.querySelector('g.legend'), capacity: !!svg.querySelector('.capacity, .capacity-label')};
  });
  const sections = [...document.querySelectorAll('main section')].map(s => ({id: s.id, top: s.getBoundingClientRect().top}));
  const pre = document.createElement('pre'); pre.id = 'probe-result';
  pre.textContent = JSON.stringify({charts, sections, errors: window.__errors});
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


def _probe(browser: str, report: Path, tmp_path: Path) -> dict:
    """What Chromium laid out for ``report``: charts (size, marks, axis titles, ticks), sections, errors."""
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
    data = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert data["errors"] == []
    assert "Uncaught" not in result.stderr
    for chart in data["charts"]:  # every chart names both axes, and the titles are laid out (visible)
        assert chart["x_title"] and chart["y_title"], f"chart {chart['name']} lacks an axis title: {chart}"
    return data


def _section_order(data: dict) -> list[str]:
    return [s["id"] for s in sorted(data["sections"], key=lambda s: s["top"])]


@pytest.mark.browser
def test_report_renders_charts_without_console_errors(tmp_path):
    browser = _browser()
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "6",
        "--profile-steps",
        "2",
        "--",
        str(SCRIPTS / "epoch_loop.py"),
    )
    assert proc.returncode == 0, proc.stderr
    data = _probe(browser, out / "report.html", tmp_path)
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
def test_plan_report_leads_with_the_plan_and_draws_the_device_limit(tmp_path):
    browser = _browser()
    factory = tmp_path / "models_for_browser.py"
    factory.write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), "
        "nn.Linear(256, 10))\n"
    )
    out = tmp_path / "plan"
    # a small device so the capacity line lies within the bars' scale
    proc = run_cli(
        "plan",
        "--model",
        f"{factory}:build",
        "--batch",
        "x=float32[64,256],y=int64[64]:10",
        "--device-memory",
        "3MiB",
        "--no-max-batch",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    data = _probe(browser, out / "report.html", tmp_path)
    order = _section_order(data)
    assert order[0] == "plan" and order[-1] == "environment"
    assert "overview" not in order  # no "0 measured steps ... timing clock: ?" for a plan
    chart = next(c for c in data["charts"] if c["name"] == "plan-memory")
    assert chart["capacity"] and chart["legend"] and chart["marks"] >= 3
    assert "MiB" in chart["y_title"]
