"""run_script as a process runs it: ``scalpel run`` prints the traceback ``python SCRIPT`` prints, and a rank's
entry point runs a script under ``python -m`` as torchrun starts it (moved from tests/unit/test_run_script.py,
which checks run_script in this process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO, cli_env, run_cli
from torchscalpel.distributed import rank_entry

# The same scripts as tests/unit/test_run_script.py's: one raising from a function, one writing what it saw.
RAISES = """
def inner():
    raise ValueError("bad batch")

inner()
"""

SEES = """
import json, sys
json.dump({"argv": sys.argv, "path0": sys.path[0]}, open(sys.argv[1], "w"))
"""


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_scalpel_run_prints_the_traceback_python_prints(tmp_path) -> None:
    """``scalpel run`` used to print its own and runpy's frames above the script's (``traceback.print_exc``);
    ``python SCRIPT`` shows only the script's, which is what ``scalpel run`` promises to be."""
    path = _script(tmp_path, RAISES)
    (tmp_path / "scalpel.toml").write_text("[tune]\n")
    plain = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    ours = run_cli("run", "--", str(path), cwd=tmp_path)
    assert ours.returncode == plain.returncode == 1, ours.stderr

    def frames(err: str) -> list[str]:
        return [line.strip() for line in err.splitlines() if line.strip().startswith('File "')]

    assert frames(ours.stderr) == frames(plain.stderr) and len(frames(plain.stderr)) == 2, ours.stderr
    assert "torchscalpel" not in "\n".join(frames(ours.stderr))


def test_rank_entry_runs_under_python_as_torchrun_starts_it(tmp_path) -> None:
    path = _script(tmp_path, SEES)
    out = tmp_path / "seen.json"
    proc = subprocess.run(
        [sys.executable, "-m", rank_entry.MODULE, "exec", "--", str(path), str(out)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["argv"] == [str(path), str(out)]
