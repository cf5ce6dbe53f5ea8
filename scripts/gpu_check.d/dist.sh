#!/usr/bin/env bash
# GPU check for torchscalpel.distributed / scalpel launch (issue 7), one CUDA device. Budget ~2-3 minutes.
# 1. nccl + cuda:LOCAL_RANK setup, SyncBatchNorm conversion on CUDA, FSDP2 with a bf16 policy.
# 2. Exact resume on CUDA (CUDA RNG state restored, deterministic kernels): SIGKILL at step 8, relaunch,
#    compare losses and final state bit for bit with an uninterrupted run; DDP and FSDP2 (bf16).
set -euo pipefail
PY=${PY:-python3}
OUT_DIR=${OUT:-gpu-check-out}/dist
rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
export MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=4

"$PY" - <<'PYEOF'
import torch
from torch import nn
from torchscalpel import distributed as sd

ctx = sd.setup(seed=0)
assert ctx.backend == "nccl" and ctx.device.type == "cuda", ctx
model = sd.wrap(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)), "ddp", sample=torch.randn(4, 8))
assert any(isinstance(m, nn.SyncBatchNorm) for m in model.modules()), "SyncBatchNorm not converted on CUDA"
model(torch.randn(4, 8, device=ctx.device)).sum().backward()
fsdp = sd.wrap(nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]), "fsdp", mixed_precision="bf16")
out = fsdp(torch.randn(4, 64, device=ctx.device))
assert out.dtype == torch.bfloat16, out.dtype
out.float().sum().backward()
print("dist setup/wrap on CUDA: ok (nccl, SyncBatchNorm, FSDP2 bf16)")
sd.teardown()
PYEOF

run() {  # run DIR STRATEGY EXTRA...
  local dir=$1 strategy=$2; shift 2
  (cd "$OUT_DIR" && "$PY" -m torchscalpel launch --nproc 1 --out "$dir/launch" -- "$OLDPWD/examples/ddp_fsdp_transformer.py" \
    --strategy "$strategy" --steps 12 --save-every 5 --workers 2 --deterministic --ckpt "$dir/ckpt" --log "$dir/logs" \
    --final "$dir/final.pt" "$@")
}
for strategy in ddp fsdp; do
  extra=(); [ "$strategy" = fsdp ] && extra=(--bf16)
  run "ref-$strategy" "$strategy" "${extra[@]}" > "$OUT_DIR/ref-$strategy.txt" 2>&1
  run "kill-$strategy" "$strategy" "${extra[@]}" --die-at 8 > "$OUT_DIR/kill-$strategy.txt" 2>&1 && { echo "FAIL: --die-at did not kill"; exit 1; }
  run "kill-$strategy" "$strategy" "${extra[@]}" > "$OUT_DIR/resume-$strategy.txt" 2>&1
  "$PY" - "$OUT_DIR/ref-$strategy" "$OUT_DIR/kill-$strategy" <<'PYEOF'
import json, sys
from pathlib import Path
import torch

def losses(d):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in (Path(d) / "logs" / "losses-rank0.jsonl").read_text().splitlines()}

def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

ref, got = sys.argv[1], sys.argv[2]
assert losses(ref) == losses(got), "losses differ after resume on CUDA"
assert same(torch.load(f"{ref}/final.pt", weights_only=True), torch.load(f"{got}/final.pt", weights_only=True)), "final state differs"
print(f"{Path(ref).name}: resume after SIGKILL is bit-exact on CUDA")
PYEOF
done
