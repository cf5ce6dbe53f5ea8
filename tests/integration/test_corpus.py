"""Acceptance corpus (issue 13, "every real training script"): ``scalpel profile`` and ``scalpel doctor``
on scripts written the way real users write them (tests/fixtures/corpus/).

Each script prints ``step N loss X`` (or nanoGPT's ``iter N: loss X``) for the N-th optimizer step,
0-based, with X the loss the script itself would report. Runs are shared per module: one plain
``python`` run, one profile and (for a few scripts) one doctor run per script.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO, cli_env, run_cli
from torchscalpel.record import RunRecord, load_record

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
WARMUP, STEPS = 2, 10
LOSS_LINE = re.compile(r"^(?:step|iter) (\d+):? loss ([-+0-9.eE]+|nan|inf)", re.MULTILINE)
# Where a script prints them on its loss line: the learning rate it set and what its clip_grad_norm_ returned.
LR_AND_NORM = {
    "lr": re.compile(r"^(?:step|iter) (\d+):? loss \S+.*?\blr ([-+0-9.eE]+)", re.MULTILINE),
    "grad_norm": re.compile(r"^(?:step|iter) (\d+):? loss \S+.*?\bgrad norm ([-+0-9.eE]+)", re.MULTILINE),
}
BACKWARD_OP = re.compile(r"Backward|autograd::engine")


@dataclass(frozen=True)
class Spec:
    """What a corpus script should look like to the runtime."""

    script: str
    samples: int
    """Samples per optimizer step: the real batch size (times the micro-batches under accumulation)."""
    args: tuple[str, ...] = ()
    step_kind: str = "optimizer"
    micro_batches: int | None = 1
    """Backward calls per step (None: the script's optimizer decides, e.g. L-BFGS line search)."""
    forward_calls: int | None = None
    """Root forward calls per step, where no evaluation forward can fall into a step."""

    @property
    def id(self) -> str:
        return " ".join((self.script, *self.args))


SPECS = [
    Spec("lightning_auto.py", samples=32),
    Spec("lightning_manual.py", samples=32),
    Spec("lbfgs.py", samples=1797, micro_batches=None),
    Spec("closure_sgd.py", samples=32, forward_calls=1),
    Spec("checkpoint_nonreentrant.py", samples=64, forward_calls=1),
    Spec("checkpoint_reentrant.py", samples=64, forward_calls=1),
    # batch_size 8 x gradient_accumulation_steps 2; evaluation (no_grad) at iters 0 and 10
    Spec("nanogpt_style.py", samples=16, micro_batches=2),
    Spec("nanogpt_style.py", samples=16, micro_batches=2, args=("--compile",)),
    Spec("mingpt_trainer.py", samples=16, forward_calls=1),
    Spec("hf_trainer.py", samples=4),
    # batch 16 x accelerate's gradient_accumulation_steps 2
    Spec("accelerate_loop.py", samples=32, micro_batches=2, forward_calls=2),
    # (seq=35, batch=20) sequence-first input; the criterion (a root module without parameters, fed
    # (700, vocab)) is not a model: it counts neither as a forward call nor as samples
    Spec("lstm_manual_sgd.py", samples=20, step_kind="backward", forward_calls=1),
]
DOCTOR = ["nanogpt_style.py", "lstm_manual_sgd.py", "lbfgs.py", "mingpt_trainer.py", "lightning_manual.py"]
"""Scripts whose stdout is deterministic (hf_trainer prints its own run time), run under doctor."""

ids = [s.id for s in SPECS]


class Runs:
    """Each script run at most once per module, in plain python, under profile and under doctor."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}

    def _dir(self, kind: str, spec: Spec) -> Path:
        return self.root / kind / re.sub(r"\W+", "_", spec.id)

    def plain(self, spec: Spec) -> subprocess.CompletedProcess[str]:
        key = ("plain", spec.id)
        if key not in self._cache:
            self._cache[key] = subprocess.run(
                [sys.executable, str(CORPUS / spec.script), *spec.args],
                cwd=REPO,
                env=cli_env(),
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
        return self._cache[key]

    def profile(self, spec: Spec) -> tuple[subprocess.CompletedProcess[str], Path]:
        key = ("profile", spec.id)
        out = self._dir("profile", spec)
        if key not in self._cache:
            self._cache[key] = run_cli(
                "profile",
                "--warmup",
                str(WARMUP),
                "--steps",
                str(STEPS),
                "--out",
                str(out),
                "--no-report",
                "--",
                str(CORPUS / spec.script),
                *spec.args,
            )
        return self._cache[key], out

    def record(self, spec: Spec) -> RunRecord:
        proc, out = self.profile(spec)
        if not (out / "run.json").exists():
            pytest.fail(f"no run.json (exit {proc.returncode}); stderr tail:\n{proc.stderr[-3000:]}")
        return load_record(out)

    def doctor(self, spec: Spec) -> subprocess.CompletedProcess[str]:
        key = ("doctor", spec.id)
        if key not in self._cache:
            self._cache[key] = run_cli(
                "doctor",
                "--out",
                str(self._dir("doctor", spec)),
                "--no-report",
                "--",
                str(CORPUS / spec.script),
                *spec.args,
            )
        return self._cache[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("corpus"))


def _brief(record: RunRecord) -> str:
    """The record in a few lines, for assertion messages."""
    rows = [
        f"status={record.status} step_kind={record.step_kind} steps={len(record.steps)} notes={record.notes}"
    ]
    rows += [
        f"  #{s.index}{'w' if s.warmup else ''}{'p' if s.profiled else ''} total={s.total_ms:.1f} data={s.data_ms:.1f} "
        f"fwd={s.forward_ms:.1f} bwd={s.backward_ms:.1f} opt={s.optimizer_ms:.1f} other={s.other_ms:.1f} "
        f"micro={s.micro_batches} calls={s.forward_calls} samples={s.samples} loss={s.loss}"
        for s in record.steps
    ]
    return "\n".join(rows)


def _losses(stdout: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in LOSS_LINE.finditer(stdout)}


def _trace_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_plain_python_runs_long_enough(runs, spec):
    proc = runs.plain(spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _losses(proc.stdout)
    assert sorted(steps) == list(range(len(steps))) and len(steps) >= WARMUP + STEPS + 2, proc.stdout[-2000:]


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_profile_exits_0_and_honours_steps(runs, spec):
    proc, _ = runs.profile(spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = runs.record(spec)
    if record.status == "stopped":
        assert len(record.steps) == WARMUP + STEPS, _brief(record)
    else:
        assert record.status == "complete", f"{record.error}\n{_brief(record)}"
        assert len(record.steps) >= WARMUP + STEPS, _brief(record)
    assert [s.warmup for s in record.steps[: WARMUP + 1]] == [True] * WARMUP + [False]
    assert len(record.measured_steps) >= STEPS


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_step_kind(runs, spec):
    record = runs.record(spec)
    assert record.step_kind == spec.step_kind, _brief(record)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_phases_add_up_and_forward_and_backward_are_seen(runs, spec):
    record = runs.record(spec)
    assert record.measured_steps, _brief(record)
    bad = []
    for step in record.measured_steps:
        parts = sum(step.phase_ms().values())
        if abs(parts - step.total_ms) > 0.01 * step.total_ms:
            bad.append(f"step {step.index}: phases sum {parts:.2f} ms != total {step.total_ms:.2f} ms")
        if not step.forward_ms > 0 or not step.backward_ms > 0:
            bad.append(
                f"step {step.index}: forward {step.forward_ms:.2f} ms, backward {step.backward_ms:.2f} ms"
            )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_micro_batches_and_forward_calls(runs, spec):
    record = runs.record(spec)
    got = [(s.index, s.micro_batches, s.forward_calls) for s in record.measured_steps]
    assert got, _brief(record)
    for _, micro, calls in got:
        assert micro >= 1, got
        if spec.micro_batches is not None:
            assert micro == spec.micro_batches, f"(index, micro_batches, forward_calls): {got}"
        if spec.forward_calls is not None:
            assert calls == spec.forward_calls, f"(index, micro_batches, forward_calls): {got}"


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_samples_per_step_is_the_real_batch_size(runs, spec):
    record = runs.record(spec)
    got = [s.samples for s in record.measured_steps]
    assert got, _brief(record)
    assert all(n == spec.samples for n in got), f"expected {spec.samples} per step, got {got}"


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_recorded_loss_is_what_the_script_reports(runs, spec):
    proc, _ = runs.profile(spec)
    record = runs.record(spec)
    printed = _losses(proc.stdout)
    pairs = [(s.index, s.loss, printed[s.index]) for s in record.steps if s.index in printed]
    assert len(pairs) >= STEPS, f"only {len(pairs)} printed losses matched recorded steps: {sorted(printed)}"
    wrong = [
        (i, got, want)
        for i, got, want in pairs
        if got is None or not math.isclose(got, want, rel_tol=1e-5, abs_tol=2e-6)
    ]
    assert not wrong, f"(step, recorded, printed): {wrong}"


WITNESSED_SERIES = [
    (s, series)
    for s in SPECS
    for series in sorted(LR_AND_NORM)
    if (s.script, series)
    in {("nanogpt_style.py", "lr"), ("nanogpt_style.py", "grad_norm"), ("mingpt_trainer.py", "grad_norm")}
]


@pytest.mark.parametrize(
    ("spec", "series"), WITNESSED_SERIES, ids=[f"{s.id}-{n}" for s, n in WITNESSED_SERIES]
)
def test_recorded_lr_and_grad_norm_are_what_the_script_set_and_clipped(runs, spec, series):
    """Witness: the learning rate the script set (nanoGPT's cosine schedule) and the norm its own
    clip_grad_norm_ returned, step by step, against the record's per-step series."""
    proc, _ = runs.profile(spec)
    printed = {int(m.group(1)): float(m.group(2)) for m in LR_AND_NORM[series].finditer(proc.stdout)}
    assert printed, f"{spec.script} printed no {series}"
    recorded = runs.record(spec).sections.get("steps_extra", {}).get(series, {})
    pairs = [(i, recorded.get(str(i)), want) for i, want in printed.items() if str(i) in recorded]
    assert len(pairs) >= STEPS, (
        f"only {len(pairs)} printed {series} values matched recorded steps: {recorded}"
    )
    wrong = [
        (i, got, want) for i, got, want in pairs if not math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-9)
    ]
    assert not wrong, f"(step, recorded, printed): {wrong}"


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_profiling_does_not_change_what_the_script_computes(runs, spec):
    plain = _losses(runs.plain(spec).stdout)
    profiled = _losses(runs.profile(spec)[0].stdout)
    assert profiled, "the profiled script printed no losses"
    assert profiled == {i: plain[i] for i in profiled if i in plain}, (profiled, plain)


@pytest.mark.parametrize("spec", SPECS, ids=ids)
def test_profiler_window_covers_training_steps_with_backward_ops(runs, spec):
    _, out = runs.profile(spec)
    record = runs.record(spec)
    window = record.profiler.get("steps") or []
    assert window, f"{record.profiler}\n{_brief(record)}"
    by_index = {s.index: s for s in record.steps}
    for index in window:
        step = by_index[index]
        assert not step.warmup and step.profiled, _brief(record)
        assert step.backward_ms > 0 and step.forward_ms > 0, _brief(record)
    trace = out / "trace.json.gz"
    assert trace.exists(), record.profiler
    events = _trace_events(trace)
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(ranges) == len(window), sorted(
        {e["name"] for e in events if e["name"].startswith("ProfilerStep")}
    )
    backward = [e for e in events if BACKWARD_OP.search(e["name"])]
    assert backward, "no autograd ops in the trace"
    inside = [e for e in backward if any(lo <= e["ts"] <= hi for lo, hi in ranges)]
    assert inside, "no autograd op falls inside a ProfilerStep range"


@pytest.mark.parametrize(
    "spec",
    [s for s in SPECS if s.script in DOCTOR and not s.args],
    ids=[s.id for s in SPECS if s.script in DOCTOR and not s.args],
)
def test_doctor_keeps_the_scripts_exit_code_and_stdout(runs, spec):
    plain = runs.plain(spec)
    doctored = runs.doctor(spec)
    assert doctored.returncode == plain.returncode, doctored.stderr[-3000:]
    assert plain.stdout in doctored.stdout, (
        f"plain stdout:\n{plain.stdout[-1500:]}\n--- doctor stdout:\n{doctored.stdout[-3000:]}"
    )


def test_nanogpt_ddp_branch_is_not_taken_under_doctor(runs):
    """The RANK-guarded branch calls init_process_group("nccl"), which fails on this CPU machine."""
    doctored = runs.doctor(next(s for s in SPECS if s.script == "nanogpt_style.py"))
    assert doctored.returncode == 0, doctored.stderr[-3000:]
    assert "nccl" not in doctored.stderr.lower() and "iter 19: loss" in doctored.stdout


def test_notebook_profiles_in_process(tmp_path):
    has_api = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torchscalpel, sys; sys.exit(0 if hasattr(torchscalpel, 'profile') else 1)",
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    proc = subprocess.run(
        [sys.executable, str(CORPUS / "notebook_inprocess.py"), str(tmp_path)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy" in proc.stdout  # the notebook went on after the profiled call
    if has_api.returncode != 0:
        assert "not available" in proc.stdout
        pytest.skip("torchscalpel.profile does not exist yet; the notebook trained without it")
    for part in ("context", "decorated"):
        record = load_record(tmp_path / part)
        assert record.status == "stopped" and len(record.measured_steps) == 10, (
            part,
            record.status,
            record.notes,
        )
        assert record.step_kind == "optimizer"
        assert all(s.forward_ms > 0 and s.backward_ms > 0 and s.samples == 32 for s in record.measured_steps)
    assert "context manager: status stopped, 10 measured steps" in proc.stdout


PLAN = [
    # (script, the optimizer the script built, its batch size, the dimension that is the batch)
    ("lbfgs.py", "LBFGS", 1797, "dim 0"),
    ("lightning_auto.py", "Adam", 32, "dim 0"),
    ("closure_sgd.py", "SGD", 32, "dim 0"),
    ("checkpoint_nonreentrant.py", "AdamW", 64, "dim 0"),
    ("hf_trainer.py", "AdamW", 4, "dim 0"),
    ("lstm_manual_sgd.py", "none", 20, "dim 1"),
]


@pytest.mark.parametrize(("script", "optimizer", "batch", "dim"), PLAN, ids=[p[0] for p in PLAN])
def test_plan_prices_what_the_script_built(tmp_path, script, optimizer, batch, dim):
    out = tmp_path / "plan"
    proc = run_cli(
        "plan",
        "--no-max-batch",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "plan.json"),
        "--",
        str(CORPUS / script),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = load_record(out).sections["plan"]
    assert plan["optimizer"] == optimizer
    assert plan["batch_size"] == batch and dim in plan["batch_dims"]
    row = plan["rows"][0]
    assert row["fits"]
    assert (row["optim"] == 0) == (optimizer == "none"), row  # momentum SGD keeps one buffer per parameter
