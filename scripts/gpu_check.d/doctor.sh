#!/usr/bin/env bash
# GPU check for `scalpel doctor` (issue 3). Run from the repo root; $PY is the venv's python.
# Shows on CUDA: host-device-copy-bound fires on a script copying a pageable 256 MiB tensor each
# step (the profiler window is on under CUDA), empty-cache-in-loop fires, and the digits example
# on cuda:0 gets no warning or error. Output: gpu-check-out/doctor/*.json|*.txt. Budget: ~1-2 min.
set -euo pipefail
PY=${PY:-python}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}/doctor
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
F=tests/fixtures/doctor

"$PY" -m torchscalpel doctor --steps 20 --out "$OUT_DIR/copy" --json "$OUT_DIR/copy.json" -- "$F/gpu_host_device_copy.py" | tee "$OUT_DIR/copy.txt"
"$PY" -m torchscalpel doctor --steps 10 --out "$OUT_DIR/cache" --json "$OUT_DIR/cache.json" -- "$F/empty_cache_in_loop.py" | tee "$OUT_DIR/cache.txt"
"$PY" -m torchscalpel doctor --steps 20 --out "$OUT_DIR/digits" --json "$OUT_DIR/digits.json" -- examples/digits_cnn.py --epochs 1 --device cuda | tee "$OUT_DIR/digits.txt"

"$PY" - "$OUT_DIR" <<'PYEOF'
import json, sys
out = sys.argv[1]
def loud(name):
    return {f["rule"] for f in json.load(open(f"{out}/{name}.json"))["findings"] if f["severity"] != "info"}
problems = []
if "host-device-copy-bound" not in loud("copy"):
    problems.append(f"host-device-copy-bound did not fire on the pageable-copy script: {loud('copy')}")
if "empty-cache-in-loop" not in loud("cache"):
    problems.append("empty-cache-in-loop did not fire on CUDA")
if loud("digits"):
    problems.append(f"the digits example on CUDA got warnings/errors: {loud('digits')}")
print("doctor gpu check:", "OK" if not problems else "FAILED")
for p in problems:
    print(" -", p)
sys.exit(1 if problems else 0)
PYEOF
