#!/usr/bin/env bash
# profile on CUDA: both examples, CUDA-event timing, per-step allocator peaks, breakdown sums, MFU.
set -euo pipefail
for ex in "char_transformer.py --steps 200 --dim 256 --layers 4 --batch-size 64" "digits_cnn.py --epochs 5"; do
  name=${ex%%.py*}
  $PY -m torchscalpel profile --out "$OUT/profile-$name" --warmup 3 --steps 20 --profile-steps 3 --module-times \
    -- examples/$ex --device cuda
  $PY - "$OUT/profile-$name" <<'PYEOF'
import sys
from torchscalpel.record import load_record
r = load_record(sys.argv[1])
s = r.summary
assert r.config["clock"] == "cuda-events", r.config
assert r.config["device"].startswith("cuda"), r.config
assert s["breakdown_max_error"] < 0.05, s["breakdown_max_error"]
assert all(st.cuda_allocated_peak and st.cuda_reserved_peak for st in r.steps), "missing CUDA peaks"
print(f"{r.name}: median step {s['median_step_ms']:.2f} ms; shares",
      {k: round(v, 3) for k, v in s["phase_share"].items()},
      f"alloc peak {s['cuda_allocated_peak'] / 2**20:.1f} MiB reserved {s['cuda_reserved_peak'] / 2**20:.1f} MiB",
      f"achieved {s.get('achieved_flops_per_s', 0) / 1e12:.2f} TFLOP/s", "MFU", s.get("mfu"))
PYEOF
done
