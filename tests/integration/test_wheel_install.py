"""The built wheel, installed into a fresh venv, runs ``scalpel demo`` from an empty folder.

The fresh venv holds only the wheel (``--no-deps``); its dependencies come from the venv running the
tests through a ``.pth`` line, so nothing is downloaded and no torch build is resolved. That venv's
own (editable) torchscalpel is not seen: a plain ``.pth`` path does not run the ``.pth`` files in it,
and the fresh site-packages comes first.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from helpers import REPO

# Every stage that reads packaged files (examples, data tables) except tune, which only adds minutes.
STAGES = "env,profile,doctor,analyze,plan,ship"


def _run(args: list[str], cwd: Path, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_wheel_installs_and_demo_runs_from_an_empty_folder(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", tree / "src", symlinks=True, ignore=skip)  # example_scripts stays a link
    shutil.copytree(REPO / "examples", tree / "examples", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, tree / name)
    wheels = tmp_path / "wheels"
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(tree),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("torchscalpel-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(
        _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path
        ).stdout.strip()
    )
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_test_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _run(
        [
            str(py),
            "-c",
            "import torchscalpel, torchscalpel.examples as e; print(torchscalpel.__file__); "
            "print(e.EXAMPLES_DIR)",
        ],
        cwd=empty,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    module_file, examples_dir = proc.stdout.split()
    assert Path(module_file).is_relative_to(site) and Path(examples_dir).is_relative_to(site), proc.stdout
    assert str(REPO) not in proc.stdout

    proc = _run(
        [str(env_dir / "bin" / "scalpel"), "demo", "--out", "out", "--steps", "3", "--stages", STAGES],
        cwd=empty,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "FAILED" not in proc.stdout
    out = empty / "out"
    assert {p.name for p in (out / "examples").iterdir()} >= {"char_transformer.py", "digits_cnn.py"}
    assert (out / "report.html").is_file() and (out / "ship" / "bundle" / "manifest.json").is_file()
    assert sorted(p.name for p in empty.iterdir()) == ["out"]

    # the snapshot reader's C source ships in the wheel and compiles on first use (the Python reader without a compiler)
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(
        pickle.dumps(
            {
                "segments": [
                    {
                        "total_size": 4096,
                        "blocks": [
                            {
                                "size": 4096,
                                "state": "active_allocated",
                                "frames": [{"filename": "/u/train.py", "line": 7, "name": "f"}],
                            }
                        ],
                    }
                ]
            }
        )
    )
    proc = _run(
        [str(env_dir / "bin" / "scalpel"), "memory", str(snap)],
        cwd=tmp_path,
        TORCHSCALPEL_CACHE_DIR=str(tmp_path / "native-cache"),
    )
    assert proc.returncode == 0 and "/u/train.py:7" in proc.stdout, proc.stdout + proc.stderr
    has_cc = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
    assert ("(read by the native streaming reader)" if has_cc else "pure-Python reader") in proc.stdout, (
        proc.stdout
    )
