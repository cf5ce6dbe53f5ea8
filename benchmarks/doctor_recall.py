"""Doctor recall on the project's planted-bug fixtures, idle and with the CPU deliberately loaded.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/doctor_recall.py [--loads normal doubled]
        [--json out.json] [--only NAME ...] [--no-clean]

Planted bugs are the fixtures of ``tests/fixtures/doctor/expected.json``: a ``positive`` fixture's
bugs are its ``must`` rules (each must fire at warning or error), an ``info`` fixture's are its rules
(any severity). Recall = planted bugs found / planted bugs. False alarms = warnings/errors on the
clean fixtures (``clean_*.py``) and on the clean corpus (``tests/fixtures/corpus/``, the scripts in
the styles real users write). "doubled" load runs one competing process spinning on every core for
the whole pass (the doctor then gets about half the CPU it had). Every script runs in this process
through :func:`torchscalpel.doctor.api.diagnose`, with the default window, as ``scalpel doctor`` would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cpu_load

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "doctor"
CORPUS = REPO / "tests" / "fixtures" / "corpus"
LAUNCHER = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}


def competing_load(kind: str) -> contextlib.AbstractContextManager[int]:
    """``doubled``: one busy-looping process per core until the block ends (:mod:`cpu_load`); ``normal``: none."""
    return cpu_load.competing_load(None if kind == "doubled" else 0)


@contextlib.contextmanager
def launcher_env(path: Path) -> Iterator[None]:
    """The variables a 1-rank launcher sets, for scripts that call init_process_group (doctor sets none)."""
    # Only the DDP/FSDP fixtures expect a launcher; the corpus runs as 'scalpel doctor -- SCRIPT' would.
    if path.parent != FIXTURES or "init_process_group" not in path.read_text(encoding="utf-8"):
        yield
        return
    from torchscalpel.netutil import free_port

    saved = {k: os.environ.get(k) for k in [*LAUNCHER, "MASTER_PORT"]}
    os.environ.update(LAUNCHER, MASTER_PORT=str(free_port()))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def diagnose_script(path: Path, args: list[str] | None = None) -> dict:
    """One default-window doctor run: status, steps, the window and every finding's (rule, severity)."""
    from torchscalpel.doctor.api import diagnose
    from torchscalpel.runtime.target import Target

    start = time.monotonic()
    with launcher_env(path), contextlib.redirect_stdout(open(os.devnull, "w")):
        record, findings = diagnose(Target(script=path, args=list(args or [])))
    return {
        "status": record.status,
        "steps": len(record.steps),
        "seconds": round(time.monotonic() - start, 2),
        "capped": (record.sections.get("doctor", {}).get("window") or {}).get("capped"),
        # how the run went on past its window under the cheap checks (None: it did not)
        "tail": (record.sections.get("doctor", {}).get("window") or {}).get("tail"),
        "findings": [(f.rule, str(f.severity)) for f in findings],
    }


def corpus_scripts() -> list[tuple[Path, list[str]]]:
    """The clean corpus, with the arguments its acceptance test uses (none: the scripts' defaults)."""
    return [*((p, []) for p in sorted(CORPUS.glob("*.py"))), (CORPUS / "nanogpt_style.py", ["--compile"])]


def one_pass(load: str, only: set[str], clean: bool) -> dict:
    expected = json.loads((FIXTURES / "expected.json").read_text())
    out: dict = {"load": load, "fixtures": {}, "clean": {}}
    with competing_load(load) as burners:
        out["burners"] = burners
        time.sleep(1.0 if burners else 0.0)
        out["loadavg_start"] = os.getloadavg()[0]
        planted = found = 0
        for name, e in sorted(expected["positive"].items()):
            if only and name not in only:
                continue
            r = diagnose_script(FIXTURES / name)
            loud = {rule for rule, sev in r["findings"] if sev in {"warning", "error"}}
            r["missed"] = sorted(set(e["must"]) - loud)
            planted += len(e["must"])
            found += len(e["must"]) - len(r["missed"])
            out["fixtures"][name] = r
        for name, rules in sorted(expected["info"].items()):
            if only and name not in only:
                continue
            r = diagnose_script(FIXTURES / name)
            r["missed"] = sorted(set(rules) - {rule for rule, _ in r["findings"]})
            planted += len(rules)
            found += len(rules) - len(r["missed"])
            out["fixtures"][name] = r
        if clean and not only:
            for path, args in [*((p, []) for p in sorted(FIXTURES.glob("clean_*.py"))), *corpus_scripts()]:
                r = diagnose_script(path, args)
                r["false_alarms"] = sorted(
                    {rule for rule, sev in r["findings"] if sev in {"warning", "error"}}
                )
                out["clean"][" ".join([str(path.relative_to(REPO)), *args])] = r
        out["loadavg_end"] = os.getloadavg()[0]
    out["planted"], out["found"] = planted, found
    out["recall"] = found / planted if planted else float("nan")
    out["false_alarm_scripts"] = sorted(k for k, r in out["clean"].items() if r["false_alarms"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", nargs="+", choices=("normal", "doubled"), default=["normal", "doubled"])
    ap.add_argument("--only", nargs="*", default=[], help="fixture names (default: all)")
    ap.add_argument("--no-clean", action="store_true", help="skip the clean fixtures and the corpus")
    ap.add_argument("--json", type=Path, help="write every pass's details here")
    a = ap.parse_args()
    # a plain kill must still run competing_load's finally (no spinning process left behind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if "torchscalpel" not in sys.modules and not any(Path(p, "torchscalpel").is_dir() for p in sys.path if p):
        sys.path.insert(0, str(REPO / "src"))  # PYTHONPATH decides which torchscalpel is measured
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    passes = [one_pass(load, set(a.only), not a.no_clean) for load in a.loads]
    print(f"CPU: {cpu}, {os.cpu_count()} cores")
    for p in passes:
        missed = {k: r["missed"] for k, r in p["fixtures"].items() if r["missed"]}
        print(
            f"{p['load']:8} load (competing procs {p['burners']}, loadavg {p['loadavg_start']:.1f}->{p['loadavg_end']:.1f}): "
            f"recall {p['found']}/{p['planted']} = {p['recall']:.1%}; missed {missed or 'none'}; "
            f"false alarms on clean scripts: {len(p['false_alarm_scripts'])}/{len(p['clean'])} "
            f"{[(k, p['clean'][k]['false_alarms']) for k in p['false_alarm_scripts']]}"
        )
        failed = {k: r["status"] for k, r in p["clean"].items() if r["status"] not in {"complete", "stopped"}}
        if failed:
            print(f"         clean scripts that did not run through: {failed}")
        capped = [k for k, r in {**p["fixtures"], **p["clean"]}.items() if r["capped"]]
        if capped:
            print(f"         time cap reached in: {capped}")
        tails = {
            k: f"{r['tail']['ran_s']:.1f} s, {r['tail']['end']}"
            for k, r in {**p["fixtures"], **p["clean"]}.items()
            if r.get("tail")
        }
        if tails:
            print(f"         ran on past the window (s, what ended it): {tails}")
    if a.json:
        a.json.write_text(json.dumps({"cpu": cpu, "passes": passes}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
