"""Open report.html in headless Chromium: no console errors, every chart laid out with visible marks."""

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
    const marks = [...svg.querySelectorAll('rect, polyline')].filter(m => {
      const b = m.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length;
    return {name: svg.dataset.chart, width: box.width, height: box.height, marks};
  });
  const pre = document.createElement('pre'); pre.id = 'probe-result';
  pre.textContent = JSON.stringify({charts, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.browser
def test_report_renders_charts_without_console_errors(tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI: .ci/run should have installed the chromium package")
        pytest.skip("Chromium not installed (apt-get install chromium)")
    out = tmp_path / "run"
    proc = run_cli("profile", "--out", str(out), "--warmup", "1", "--steps", "6", "--profile-steps", "2",
                   "--", str(SCRIPTS / "epoch_loop.py"))
    assert proc.returncode == 0, proc.stderr
    probed = tmp_path / "probed.html"
    probed.write_text((out / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', result.stdout, re.S)
    assert match, f"probe did not run; chromium said: {result.stderr[-2000:]}"
    data = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert data["errors"] == []
    assert "Uncaught" not in result.stderr
    charts = {c["name"]: c for c in data["charts"]}
    for name in ("step-breakdown", "loss", "memory", "top-ops"):
        assert name in charts, f"chart {name} missing: {sorted(charts)}"
        assert charts[name]["width"] > 100 and charts[name]["height"] > 50
        assert charts[name]["marks"] >= 1
    assert charts["step-breakdown"]["marks"] >= 6 * 3  # 6 measured steps, at least 3 visible phases each
