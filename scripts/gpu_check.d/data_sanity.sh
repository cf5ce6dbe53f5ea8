#!/usr/bin/env bash
# GPU check for issue 40's doctor rules and the evaluation loss. Run from the repo root; $PY is the venv's python.
# Shows on CUDA: every evaluation pass's loss is recorded (sections.eval) while the values stay on the device
# until the run ends; label-out-of-range is reported before the device-side assert a CUDA cross_entropy raises;
# input-unnormalised reads CUDA inputs; train-in-eval-mode on a CUDA model. Output: gpu-check-out/data_sanity/.
# Budget: ~1 min.
set -euo pipefail
PY=${PY:-python}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}/data_sanity
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

cat > "$OUT_DIR/cuda_eval.py" <<'PYEOF'
import sys
import torch
from torch import nn

torch.manual_seed(0)
dev = "cuda"
model = nn.Sequential(nn.Linear(13, 64), nn.Dropout(0.2), nn.ReLU(), nn.Linear(64, 3)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(512, 13, device=dev) * torch.logspace(0, 3, 13, device=dev)  # unnormalised columns
y = torch.randint(0, 3, (512,), device=dev)
bad = "--bad-labels" in sys.argv
model.train()
for step in range(40):
    i = step % 8 * 64
    labels = y[i:i + 64] + (3 if bad and step == 5 else 0)
    loss = nn.functional.cross_entropy(model(x[i:i + 64]), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 4 == 3:
        model.eval()
        with torch.no_grad():
            val = nn.functional.cross_entropy(model(x[:128]), y[:128])
PYEOF

"$PY" -m torchscalpel doctor --out "$OUT_DIR/eval" --json "$OUT_DIR/eval.json" -- "$OUT_DIR/cuda_eval.py" | tee "$OUT_DIR/eval.txt"
set +e
"$PY" -m torchscalpel doctor --out "$OUT_DIR/labels" --json "$OUT_DIR/labels.json" -- "$OUT_DIR/cuda_eval.py" --bad-labels > "$OUT_DIR/labels.txt" 2>&1
set -e

"$PY" - "$OUT_DIR" <<'PYEOF'
import json, math, sys
out = sys.argv[1]
def rules(name):
    return {f["rule"] for f in json.load(open(f"{out}/{name}.json"))["findings"]}
record = json.load(open(f"{out}/eval/run.json"))
passes = record.get("sections", {}).get("eval", {}).get("passes", [])
problems = []
if [p["step"] for p in passes] != [4 * (k + 1) for k in range(10)] or not all(math.isfinite(p["loss"]) for p in passes):
    problems.append(f"evaluation passes on CUDA not recorded as expected: {passes}")
for rule in ("input-unnormalised", "train-in-eval-mode"):
    if rule not in rules("eval"):
        problems.append(f"{rule} did not fire on CUDA: {rules('eval')}")
if "label-out-of-range" not in rules("labels"):
    problems.append(f"label-out-of-range did not fire before the device-side assert: {rules('labels')}")
print("data_sanity gpu check:", "OK" if not problems else "FAILED")
for p in problems:
    print("  -", p)
sys.exit(1 if problems else 0)
PYEOF
