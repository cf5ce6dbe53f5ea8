#!/usr/bin/env bash
# GPU check for the hang watch with NCCL and its flight recorder (issue 18). Budget ~1-3 minutes.
# 1. One GPU: a 1-rank NCCL launch all-reduces for 6 steps, then stalls outside any collective; the watch
#    must declare the hang (exit 124), get the rank's flight recorder dump and read it (its all_reduces
#    recorded), and leave no process behind.
# 2. Two or more GPUs: 2 NCCL ranks, rank 1 skips an all_reduce at step 5 (the CPU suite's planted hang):
#    the diagnosis names both ranks and lines (a 2-rank tie, as on CPU), and rank 0's recorder says it
#    waits in that all_reduce. (Dry-run on CPU with gloo: same summary and mismatch; no recorder there.)
set -euo pipefail
PY=${PY:-python3}
OUT_DIR=${OUT:-gpu-check-out}/hang
rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
export MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=4

cat > "$OUT_DIR/stall.py" <<'PYEOF'
import os, time
import torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Linear(8, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    loss = model(torch.randn(16, 8, device="cuda")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    torch.cuda.synchronize()
    if step == 5 and rank == int(os.environ.get("STALL_RANK", "0")) and os.environ.get("MODE") == "stall":
        time.sleep(3600)  # PLANTED: stuck outside any collective
    if step == 5 and rank != 1 and os.environ.get("MODE") == "skip":
        dist.all_reduce(loss.detach())  # PLANTED: rank 1 skips this
    dist.barrier()
dist.destroy_process_group()
PYEOF

check() {  # check OUT EXPECT_EXIT PYTHON-ASSERTIONS
  "$PY" - "$1" <<PYEOF
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
hang = json.loads((out / "hang.json").read_text())
print("summary:", hang["summary"])
print("nccl_summary:", json.dumps(hang.get("nccl_summary"))[:800])
$2
PYEOF
}

set +e
(cd "$OUT_DIR" && MODE=stall timeout 200 "$PY" -m torchscalpel launch --nproc 1 --hang-timeout 10 --out one -- stall.py \
  > one.txt 2>&1); code=$?
set -e
[ "$code" = 124 ] || { echo "FAIL: 1-rank stall exited $code, not 124"; tail -30 "$OUT_DIR/one.txt"; exit 1; }
check "$OUT_DIR/one" '
s = hang["nccl_summary"]["0"]
assert "error" not in s, s
assert s["entries"] >= 3 and any(e["op"] == "all_reduce" for e in s["last"]), s
print("1 GPU: hang declared, the NCCL flight recorder dumped and read: ok")'
if pgrep -f "$OUT_DIR/stall.py" >/dev/null; then echo "FAIL: a rank is left behind"; exit 1; fi

ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -lt 2 ]; then
  echo "SKIP: the 2-rank NCCL hang needs 2 GPUs (this machine has $ngpu)"
  exit 0
fi
set +e
(cd "$OUT_DIR" && MODE=skip timeout 200 "$PY" -m torchscalpel launch --nproc 2 --hang-timeout 10 --check-collectives \
  --out two -- stall.py > two.txt 2>&1); code=$?
set -e
[ "$code" = 124 ] || { echo "FAIL: 2-rank skip exited $code, not 124"; tail -30 "$OUT_DIR/two.txt"; exit 1; }
check "$OUT_DIR/two" '
# two ranks in two different collectives are a tie (both named), as on CPU
assert "rank 0 is in all_reduce" in hang["summary"] and "from stall.py:19" in hang["summary"], hang["summary"]
assert "rank 1 is in barrier" in hang["summary"] and "from stall.py:20" in hang["summary"], hang["summary"]
assert hang["mismatch"]["seq"] == 18, hang["mismatch"]
w = hang["nccl_summary"]["0"]["waiting_in"]
assert w and w["op"] == "all_reduce", hang["nccl_summary"]
print("2 GPUs: both ranks and lines named; rank 0 waits in all_reduce per its recorder: ok")'
if pgrep -f "$OUT_DIR/stall.py" >/dev/null; then echo "FAIL: a rank is left behind"; exit 1; fi
