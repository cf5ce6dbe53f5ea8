"""``scalpel profile`` end to end on attention written by hand (nanoGPT with flash=False, minGPT): the
op-line pass names the ``q @ k.transpose`` line of the script, stores the unfused-attention finding, is
left out of the step times, and stays silent on the same model with F.scaled_dot_product_attention."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from helpers import run_cli
from torchscalpel.record import load_record
from torchscalpel.record_check import check_invariants

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "op_patterns"
GPT = FIXTURES / "gpt_manual_attention.py"
MINGPT = FIXTURES / "mingpt_attention.py"


def score_line(script: Path) -> int:
    """The script's line of ``q @ k.transpose(-2, -1)``, read from the file (never hard-coded)."""
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "q @ k.transpose" in text)


def _profile(
    tmp_path: Path, script: Path, *flags: str, script_args: tuple[str, ...] = (), exit_ok: bool = True
) -> tuple[dict, str, Path]:
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--steps",
        "8",
        "--no-report",
        *flags,
        "--",
        str(script),
        *script_args,
        OMP_NUM_THREADS="1",
    )
    if exit_ok:
        assert proc.returncode == 0, proc.stderr
    return json.loads((out / "run.json").read_text()), proc.stdout + proc.stderr, out


@pytest.mark.slow
@pytest.mark.parametrize("script", [GPT, MINGPT], ids=["nanogpt-flash-false", "mingpt"])
def test_the_attention_line_is_named_with_its_fix(tmp_path, script):
    record, printed, out = _profile(tmp_path, script)
    line = score_line(script)
    (finding,) = [f for f in record["findings"] if f["rule"] == "unfused-attention"]
    assert finding["location"]["line"] == line and finding["location"]["file"].endswith(script.name)
    assert "scaled_dot_product_attention" in finding["fix"]
    assert f"{script.name}:{line}" in printed and "unfused-attention" in printed
    lines = record["profiler"]["op_lines"]
    assert lines["seconds"] > 0 and len(lines["steps"]) == 1 and "error" not in lines
    # the pass's step is instrumented: marked, left out of the step times, outside the profiler window
    (step,) = [s for s in record["steps"] if s["index"] == lines["steps"][0]]
    assert step["profiled"] and step["op_lines"]
    assert step["index"] not in record["profiler"]["steps"]
    assert record["summary"]["steps_summarized"] == record["summary"]["steps_measured"] - 5
    # every op line kept is a top op of the window, and the heaviest matmul of attention is charged to it
    top = {o["name"] for o in record["sections"]["trace"]["top_ops"]}
    assert lines["ops"] and {o["name"] for o in lines["ops"]} <= top
    bmm = next(o for o in lines["ops"] if o["name"] == "aten::bmm")
    file, _, at = bmm["site"].rpartition(":")
    assert file.endswith(script.name) and line <= int(at) <= line + 4, bmm  # q @ k or att @ v
    assert check_invariants(load_record(out / "run.json")) == []


@pytest.mark.slow
def test_the_fused_twin_does_not_fire_and_exits_cleanly(tmp_path):
    # exit 0: the two profiler sessions' results are freed while the run lasts (left to the exit, freeing
    # them crashed the interpreter after a script that ran CPU flash attention: rc 139)
    record, printed, _ = _profile(tmp_path, GPT, script_args=("--flash",))
    assert [f for f in record["findings"] if f["rule"] == "unfused-attention"] == []
    assert "unfused-attention" not in printed
    assert record["profiler"]["op_lines"]["ops"]  # the pass ran: it found nothing to fix


@pytest.mark.slow
def test_no_op_lines_turns_the_pass_off(tmp_path):
    record, printed, _ = _profile(tmp_path, GPT, "--no-op-lines")
    assert "op_lines" not in record["profiler"]
    assert not any(s.get("op_lines") for s in record["steps"])
    assert record["findings"] == [] and "op lines:" not in printed


@pytest.mark.slow
def test_with_stack_records_the_main_window_the_torch_way(tmp_path):
    record, _, out = _profile(tmp_path, MINGPT, "--with-stack", "--record-shapes", "--no-op-lines")
    with gzip.open(out / record["profiler"]["trace"]) as fh:
        events = json.loads(fh.read())["traceEvents"]
    assert any(e.get("cat") == "python_function" and MINGPT.name in e.get("name", "") for e in events)
    assert any("Input Dims" in e.get("args", {}) for e in events if e.get("name") == "aten::bmm")


LOSS_ITEM = FIXTURES / "loss_item_every_step.py"


def item_line() -> int:
    return next(i for i, text in enumerate(LOSS_ITEM.read_text().splitlines(), 1) if "loss.item()" in text)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a .item() synchronises only with a GPU")
def test_loss_item_every_step_is_named_on_a_gpu(tmp_path):
    record, printed, _ = _profile(tmp_path, LOSS_ITEM)
    (finding,) = [f for f in record["findings"] if f["rule"] == "sync-in-step"]
    assert finding["location"]["line"] == item_line() and f"{LOSS_ITEM.name}:{item_line()}" in printed
    twin, _, _ = _profile(tmp_path / "twin", LOSS_ITEM, script_args=("--log-every", "1000"))
    assert not any(
        f["location"]["line"] == item_line() for f in twin["findings"] if f["rule"] == "sync-in-step"
    )


@pytest.mark.slow
def test_loss_item_on_a_cpu_run_is_not_called_a_stall(tmp_path):
    record, _, _ = _profile(tmp_path, LOSS_ITEM, script_args=("--device", "cpu"))
    assert record["profiler"]["op_lines"]["ops"]
    assert [f for f in record["findings"] if f["rule"] == "sync-in-step"] == []


HF_GPT2 = FIXTURES / "hf_gpt2_eager.py"


def hf_attention_lines() -> tuple[Path, int, int]:
    """The installed transformers' GPT-2 eager attention: its file, the ``torch.matmul(query, key...)`` line
    and the ``torch.matmul(attn_weights, value)`` line, read from the file (never hard-coded)."""
    import importlib.util

    spec = importlib.util.find_spec("transformers.models.gpt2.modeling_gpt2")
    assert spec is not None and spec.origin
    source = Path(spec.origin).read_text().splitlines()
    start = next(i for i, t in enumerate(source) if t.startswith("def eager_attention_forward"))
    first = next(i for i in range(start, len(source)) if "torch.matmul(" in source[i]) + 1
    last = next(i for i in range(first, len(source)) if "torch.matmul(" in source[i]) + 1
    return Path(spec.origin), first, last


@pytest.mark.slow
def test_hf_eager_attention_names_the_library_line_and_the_users_line(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    record, printed, _ = _profile(tmp_path, HF_GPT2)
    library, first, last = hf_attention_lines()
    user = next(i for i, t in enumerate(HF_GPT2.read_text().splitlines(), 1) if "outputs = model(" in t)
    (finding,) = [f for f in record["findings"] if f["rule"] == "unfused-attention"]
    # the location is the user's line (what a report links to); the message names the library's attention
    assert finding["location"]["file"].endswith(HF_GPT2.name) and finding["location"]["line"] == user
    assert f"transformers/models/gpt2/{library.name}:{first}-{last} (library code)" in finding["message"]
    reached = finding["message"].split("reached from ", 1)[1]
    assert reached.startswith(f"{HF_GPT2.relative_to(FIXTURES.parents[2])}:{user}:"), finding["message"]
    assert "attn_implementation='sdpa'" in finding["fix"]
    assert "(library code)" in printed
    bmm = next(o for o in record["profiler"]["op_lines"]["ops"] if o["name"] == "aten::bmm")
    file, _, at = (bmm["library_site"] or "").rpartition(":")
    assert file == str(library) and first <= int(at) <= last, bmm


@pytest.mark.slow
def test_hf_sdpa_twin_stays_silent(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    record, printed, _ = _profile(tmp_path, HF_GPT2, script_args=("--attn", "sdpa"))
    assert [f for f in record["findings"] if f["rule"] == "unfused-attention"] == []
    assert record["profiler"]["op_lines"]["ops"] and "unfused-attention" not in printed


COMPILED = FIXTURES / "compiled_attention.py"


@pytest.mark.slow
def test_a_compiled_model_is_not_measured_as_a_compiled_region(tmp_path):
    """model = torch.compile(model): the pass must not enter its torch function mode (dynamo's guards fail
    and the pass times a recompile and eager ops: 11.1 s for a 2 ms step, and "unfused-attention at 0.0%"
    plus "tiny ops: use torch.compile" for a model already compiled). backend="aot_eager" keeps the test
    cheap: dynamo and AOTAutograd run as with inductor, without inductor's C++ compile (inductor checked by
    hand: the same output)."""
    record, printed, out = _profile(tmp_path, COMPILED, script_args=("--backend", "aot_eager"))
    lines = record["profiler"]["op_lines"]
    assert lines["error"].startswith("compiled region: the script built "), lines
    assert lines["ops"] == [] and "compiled_share" in lines
    assert [f for f in record["findings"] if f["rule"] in ("unfused-attention", "tiny-ops")] == []
    assert "op lines: not measured: compiled region" in printed
    (step,) = [s for s in record["steps"] if s["index"] == lines["steps"][0]]
    assert step["op_lines"] and step["profiled"]
    assert check_invariants(load_record(out / "run.json")) == []
