#!/usr/bin/env bash
# GPU check for `scalpel memory`: the tracker's category totals at the peak against torch.cuda.memory_stats,
# a real CUDA out-of-memory under torch.cuda.set_per_process_memory_fraction explained with a snapshot, and
# the cost of the tracker on a CUDA step. Run from the repo root with the venv's python as $PY. ~60 s.
set -euo pipefail
PY=${PY:-python}
OUT="${OUT:-$(mktemp -d)}/memory"
mkdir -p "$OUT"
PYTHONPATH=src "$PY" - "$OUT" <<'PYEOF'
import json, sys, time, torch
from torch import nn
from torchscalpel.runtime.alloc_tracker import AllocationTracker
out = sys.argv[1]
assert torch.cuda.is_available(), "no CUDA device"
m = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(4096, 2048, device="cuda")
def step():
    m(x).square().mean().backward(); opt.step(); opt.zero_grad(set_to_none=True)
step(); torch.cuda.synchronize()
base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
tr = AllocationTracker(device_kind="cuda"); tr.start()
tr.adopt(m.parameters(), "parameters"); tr.adopt([v for s in opt.state.values() for v in s.values()], "optimizer_state")
tr.peak = tr.total
step(); torch.cuda.synchronize(); tr.stop()
stats_peak = torch.cuda.max_memory_allocated() - base
err = abs((tr.peak - tr.total) - stats_peak) / stats_peak
ts = []
for tracked in (False, True) * 3:
    t = AllocationTracker(device_kind="cuda") if tracked else None
    if t: t.start()
    torch.cuda.synchronize(); t0 = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append((tracked, time.perf_counter() - t0))
    if t: t.stop()
plain = min(d for k, d in ts if not k); trk = min(d for k, d in ts if k)
res = {"tracker_peak_above_end": tr.peak - tr.total, "cuda_peak_above_base": stats_peak, "error": err, "cost_ratio": trk / plain}
print(json.dumps(res)); json.dump(res, open(f"{out}/accuracy.json", "w"))
assert err < 0.10, res
PYEOF
cat > "$OUT/oom.py" <<'PYEOF'
import torch
from torch import nn
torch.cuda.set_per_process_memory_fraction(0.02)
m = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.Adam(m.parameters())
for _ in range(3):
    m(torch.randn(8192, 4096, device="cuda")).square().mean().backward(); opt.step(); opt.zero_grad()
PYEOF
PYTHONPATH=src "$PY" -m torchscalpel memory --steps all --out "$OUT/oomrun" --json "$OUT/oom.json" -- "$OUT/oom.py" || true
PYTHONPATH=src "$PY" - "$OUT" <<'PYEOF'
import json, sys
m = json.load(open(f"{sys.argv[1]}/oom.json"))
assert m["oom"]["request"]["device_error"], m.get("oom")
assert m["oom"]["snapshot"].get("cuda_snapshot"), m["oom"]["snapshot"]
print("cuda oom:", m["top_cause"], m["oom"]["request"])
PYEOF
PYTHONPATH=src "$PY" -m torchscalpel memory "$OUT/oomrun/memory-snapshot.pickle"
