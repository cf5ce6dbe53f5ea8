#!/usr/bin/env bash
# GPU check for `scalpel analyze`: profile a short CUDA training loop with torch.profiler, then analyse
# the trace and check the GPU-side figures (steps, kernel launches, breakdown sums, CUDA memory peak).
# Run from the repo root with the venv's python as $PY (scripts/gpu_check.sh does this). ~30 s.
set -euo pipefail
PY=${PY:-python}
OUT="${OUT:-$(mktemp -d)}/analyze"  # gpu_check.sh exports OUT; the trace and reports stay there
mkdir -p "$OUT"
"$PY" - "$OUT" <<'PYEOF'
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule
out = sys.argv[1]
assert torch.cuda.is_available(), "no CUDA device"
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(256, 1024, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
             schedule=schedule(wait=1, warmup=1, active=4),
             on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank-0.json")) as prof:
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        m(x).square().mean().backward()
        opt.step()
        prof.step()
torch.cuda.synchronize()
PYEOF
PYTHONPATH=src "$PY" -m torchscalpel analyze "$OUT/rank-0.json" --json "$OUT/r.json" --html "$OUT/r.html"
PYTHONPATH=src "$PY" - "$OUT/r.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["ranks"][0]
assert r["device"] == "gpu", r["device"]
assert len(r["steps"]) == 4, len(r["steps"])
for s in r["steps"]:
    assert s["compute_us"] > 0, s
    parts = s["compute_us"] + s["communication_us"] + s["memcpy_us"] + s["memset_us"] + s["gpu_idle_us"]
    assert abs(parts - s["dur_us"]) < 1e-3 * s["dur_us"] + 1, s
    waits = s["host_wait_us"] + s["kernel_wait_us"] + s["other_wait_us"]
    assert abs(waits - s["gpu_idle_us"]) < 1e-3 * s["dur_us"] + 1, s
assert r["launch"]["kernels"] > 0 and r["launch"]["launches_matched"] >= 0.95 * r["launch"]["kernels"], r["launch"]
assert r["gpu"]["compute_us"] > 0
assert any(k["category"] == "matmul" for k in d["top_kernels"]), [k["name"] for k in d["top_kernels"]]
mem = d["memory"]
assert mem and mem["peak_by_device"].get("cuda", 0) > 256 * 4096 * 4, mem and mem["peak_by_device"]
print("analyze GPU check OK:", r["steps"][0]["gpu_busy_pct"], "% busy in step 1;", len(d["top_kernels"]), "kernels")
PYEOF
