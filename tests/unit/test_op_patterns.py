"""The op-pattern rules (trace/patterns.py) on events built here: each fires on its pattern, names the
line to change and its share of the step, and stays silent on the clean twin."""

from __future__ import annotations

from torchscalpel.trace.op_events import OpEvent, PassFacts, op_lines
from torchscalpel.trace.patterns import find_patterns

MODEL = "/home/u/nanogpt/model.py"
TRAIN = "/home/u/nanogpt/train.py"


def ev(name, line, start, self_us=100.0, *, file=MODEL, shapes=(), parent=None, **kw) -> OpEvent:
    return OpEvent(
        name=name,
        site=f"{file}:{line}",
        start_us=start,
        self_us=self_us,
        total_us=kw.pop("total_us", self_us),
        shapes=shapes,
        parent=parent,
        **kw,
    )


def attention_layer(t0: float, *, fused: bool = False) -> list[OpEvent]:
    """One layer of nanoGPT's CausalSelfAttention forward (lines 52-57), plus its projections and backward."""
    qkv = [ev("aten::linear", 45, t0, 50.0), ev("aten::addmm", 45, t0 + 1, 400.0, parent="aten::linear")]
    if fused:
        att = [ev("aten::scaled_dot_product_attention", 52, t0 + 10, 900.0, shapes=((8, 4, 128, 16),) * 3)]
    else:
        att = [
            ev("aten::transpose", 52, t0 + 10, 2.0),
            ev("aten::matmul", 52, t0 + 11, 20.0, shapes=((8, 4, 128, 16), (8, 4, 16, 128))),
            ev("aten::bmm", 52, t0 + 12, 700.0, parent="aten::matmul"),
            ev("aten::mul", 52, t0 + 20, 300.0),
            ev("aten::masked_fill", 53, t0 + 30, 250.0),
            ev("aten::softmax", 54, t0 + 40, 10.0, shapes=((8, 4, 128, 128), (), ())),
            ev("aten::_softmax", 54, t0 + 41, 500.0, parent="aten::softmax"),
            ev("aten::dropout", 55, t0 + 50, 5.0),
            ev("aten::matmul", 56, t0 + 60, 20.0, shapes=((8, 4, 128, 128), (8, 4, 128, 16))),
            ev("aten::bmm", 56, t0 + 61, 650.0, parent="aten::matmul"),
            ev("aten::bmm", 52, t0 + 5000, 900.0, backward=True),  # backward charged to its forward line
        ]
    return qkv + att + [ev("aten::linear", 58, t0 + 70, 300.0)]


def test_unfused_attention_names_the_score_line_and_its_share():
    events = attention_layer(0) + attention_layer(1000)
    findings = find_patterns(events, PassFacts(step_us=20_000.0))
    rules = {f.rule: f for f in findings}
    assert set(rules) == {"unfused-attention"}
    f = rules["unfused-attention"]
    assert (f.location.file, f.location.line) == (MODEL, 52)
    # lines 52-56, forward and backward, both layers: (2+20+700+300+250+10+500+5+20+650+900) * 2 = 6714 us
    assert "33.6% of the step" in f.message
    assert "scaled_dot_product_attention" in f.fix
    assert f.evidence[0].startswith("2 call(s) per 1 step(s): matmul at line 52, softmax, matmul at line 56")


def test_the_fused_twin_and_a_far_away_softmax_do_not_fire():
    assert find_patterns(attention_layer(0, fused=True), PassFacts(step_us=5_000.0)) == []
    # a classifier's softmax on logits 40 lines below the last matmul is not attention
    far = [
        ev("aten::matmul", 10, 0, 100.0, shapes=((8, 4, 16, 16), (8, 4, 16, 16))),
        ev("aten::softmax", 60, 10, 100.0, shapes=((8, 4, 16, 16),)),
        ev("aten::matmul", 61, 20, 100.0, shapes=((8, 4, 16, 16), (8, 4, 16, 16))),
    ]
    assert find_patterns(far, PassFacts(step_us=5_000.0)) == []


def test_syncs_are_named_by_line_on_cuda_and_a_cpu_tensor_item_is_not_one():
    events = [
        ev("aten::item", 90, 0, 5.0, file=TRAIN, total_us=2_005.0),
        ev(
            "aten::_local_scalar_dense",
            90,
            1,
            5.0,
            file=TRAIN,
            total_us=2_000.0,
            parent="aten::item",
            kernels=("Memcpy DtoH (Device -> Pageable)",),
        ),
        ev("cudaStreamSynchronize", 90, 2, 1_990.0, file=TRAIN, parent="aten::_local_scalar_dense"),
        ev("aten::_local_scalar_dense", 85, 3, 2.0, file=TRAIN, parent="aten::item"),  # a CPU index tensor
        ev("cudaDeviceSynchronize", 95, 4, 1_000.0, file=TRAIN),
    ]
    (f,) = find_patterns(events, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(9, 0)))
    assert f.rule == "sync-in-step" and f.severity.name == "WARNING"
    assert f.location.line == 90 and "30.0% of the step" in f.message
    assert f.evidence[0].startswith("train.py:90: 1 call(s) (.item()), 2.00 ms, 20.0% of the step") or (
        f.evidence[0].endswith("train.py:90: 1 call(s) (.item()), 2.00 ms, 20.0% of the step")
    )
    assert not any(":85:" in e for e in f.evidence)
    # on a CPU run an .item() waits for nothing: silent below 1% of the step
    cpu = [ev("aten::_local_scalar_dense", 90, 0, 3.0, file=TRAIN, parent="aten::item")]
    assert find_patterns(cpu, PassFacts(step_us=10_000.0)) == []


def test_conversions_in_the_loop():
    events = [
        ev("aten::to", 70, 0, 5.0, file=TRAIN, total_us=3_000.0),
        ev("aten::_to_copy", 70, 1, 5.0, file=TRAIN, parent="aten::to"),
        ev("aten::copy_", 70, 2, 2_990.0, file=TRAIN, parent="aten::_to_copy"),
        ev("aten::addmm", 45, 10, 100.0, parent="aten::linear"),
        ev("aten::copy_", 45, 11, 900.0, parent="aten::addmm"),  # inside an op: not the user's conversion
    ]
    (f,) = find_patterns(events, PassFacts(step_us=10_000.0))
    assert f.rule == "conversions-in-loop" and f.location.line == 70 and "30.0% of the step" in f.message
    small = [ev("aten::to", 70, 0, 5.0, file=TRAIN, total_us=500.0)]
    assert find_patterns(small, PassFacts(step_us=10_000.0)) == []


def test_fp32_matmuls_on_a_gpu_with_tensor_cores():
    sgemm = ("ampere_sgemm_128x64_tn",)
    events = [ev("aten::mm", 45, 0, 10.0, device_us=4_000.0, kernels=sgemm)]
    (f,) = find_patterns(events, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(8, 0)))
    assert f.rule == "fp32-matmul" and "allow_tf32" in f.fix and "40.0%" in f.message
    (v100,) = find_patterns(events, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(7, 0)))
    assert "float16" in v100.fix
    tf32 = [ev("aten::mm", 45, 0, 10.0, device_us=4_000.0, kernels=("sm80_xmma_gemm_f32f32_tf32f32_f32_tn",))]
    assert find_patterns(tf32, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(8, 0))) == []
    assert find_patterns(events, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(6, 1))) == []


def test_pageable_host_to_device_copies():
    pageable = [
        ev(
            "aten::copy_",
            80,
            0,
            10.0,
            file=TRAIN,
            total_us=900.0,
            device_us=800.0,
            kernels=("Memcpy HtoD (Pageable -> Device)",),
        )
    ]
    (f,) = find_patterns(pageable, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(9, 0)))
    assert f.rule == "pageable-h2d" and "pin_memory=True" in f.fix and f.location.line == 80
    pinned = [
        ev(
            "aten::copy_",
            80,
            0,
            10.0,
            file=TRAIN,
            total_us=900.0,
            device_us=800.0,
            kernels=("Memcpy HtoD (Pinned -> Device)",),
        )
    ]
    assert find_patterns(pinned, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(9, 0))) == []


def test_tiny_ops_cpu_and_launch_bound_gpu():
    tiny = [ev("aten::add", 30 + i % 3, i, 4.0) for i in range(600)]
    (f,) = find_patterns(tiny, PassFacts(step_us=5_000.0))
    assert f.rule == "tiny-ops" and "torch.compile" in f.fix
    big = [ev("aten::mm", 30, i, 400.0) for i in range(20)] + tiny[:100]
    assert find_patterns(big, PassFacts(step_us=8_500.0)) == []
    kernels = [ev("aten::add", 30, i, 4.0, device_us=3.0) for i in range(600)]
    (g,) = find_patterns(kernels, PassFacts(step_us=10_000.0, cuda=True, compute_capability=(9, 0)))
    assert "launch-bound" in g.message and "reduce-overhead" in g.fix


def test_op_lines_keep_the_heaviest_line_per_op():
    rows = op_lines(attention_layer(0))
    bmm = next(r for r in rows if r["name"] == "aten::bmm")
    assert bmm["site"] == f"{MODEL}:52" and bmm["calls"] == 2
    assert abs(bmm["site_share"] - 1600 / 2250) < 1e-9
    assert rows[0]["name"] == "aten::bmm"


HF = "/venv/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py"


def test_attention_inside_transformers_names_the_library_line_and_the_users_line():
    """HF eager attention: every op's user line is the ``model(...)`` call; the chain is found in the
    library's lines (59 matmul, 64 softmax, 70 matmul), and the fix is attn_implementation, not an edit."""

    def lib(name, line, start, self_us=100.0, **kw):
        return ev(name, 27, start, self_us, file=TRAIN, library_site=f"{HF}:{line}", **kw)

    layer = [
        lib("aten::linear", 300, 0, 400.0),
        lib("aten::matmul", 59, 10, 20.0, shapes=((8, 4, 128, 16), (8, 4, 16, 128))),
        lib("aten::bmm", 59, 11, 700.0, parent="aten::matmul"),
        lib("aten::softmax", 64, 20, 500.0, shapes=((8, 4, 128, 128), (), ())),
        lib("aten::dropout", 68, 30, 100.0),
        lib("aten::matmul", 70, 40, 680.0, shapes=((8, 4, 128, 128), (8, 4, 128, 16))),
        lib("aten::bmm", 59, 5000, 900.0, backward=True),
        ev("aten::mm", 27, 6000, 2000.0, file=TRAIN),  # the model's other work, also at the user's line
    ]
    (f,) = find_patterns(layer, PassFacts(step_us=10_000.0))
    assert f.rule == "unfused-attention"
    assert (f.location.file, f.location.line) == (TRAIN, 27)
    assert "transformers/models/gpt2/modeling_gpt2.py:59-70 (library code), reached from" in f.message
    assert "train.py:27" in f.message
    # lines 59-70 only: 20+700+500+100+680+900 = 2900 us, not the 2400 us of other work at line 27
    assert "29.0% of the step" in f.message
    assert "attn_implementation='sdpa'" in f.fix and "scaled_dot_product_attention(q" not in f.fix
    row = next(r for r in op_lines(layer) if r["name"] == "aten::bmm")
    assert row["site"] == f"{TRAIN}:27" and row["library_site"] == f"{HF}:59"
    assert next(r for r in op_lines(layer) if r["name"] == "aten::mm")["library_site"] is None
