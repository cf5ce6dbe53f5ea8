#!/usr/bin/env bash
# GPU check for `scalpel tune` / `scalpel run` (issue 5). Run from the repo root; $PY is the python.
# What it shows on a GPU machine: the tune search on examples/char_transformer.py on cuda (AMP
# bf16, TF32 matmul precision, fused optimizer, data loading, compile of the repeated blocks), the
# recommendation confirmed in interleaved runs, then an independent interleaved re-measurement of
# the recommended settings against the baseline (2 rounds), and `scalpel run` applying them.
# Output: gpu-check-out/tune/{tune.txt,bench.txt,run.txt,tune/}; paste the figures into BENCHMARKS.md.
# Budget: ~4 minutes (tune 150 s + re-measure 45 s + run 40 s), under the 300 s gpu_check.sh gives an area.
set -euo pipefail
PY=${PY:-python}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}/tune
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
SCRIPT_ARGS=(examples/char_transformer.py --device cuda --steps 400 --batch-size 64 --log-every 1000)

"$PY" -m torchscalpel tune --budget 150s --steps 10 --warmup 3 --confirm 1 \
  --knobs amp,matmul,optimizer,dataloader,compile \
  --out "$OUT_DIR/tune" --config "$OUT_DIR/scalpel.toml" -- "${SCRIPT_ARGS[@]}" 2>&1 | tee "$OUT_DIR/tune.txt"

"$PY" - "$OUT_DIR/tune/run.json" <<'PYEOF'
import json, sys
tune = json.load(open(sys.argv[1]))["sections"]["tune"]
facts = tune["facts"]
problems = []
if facts.get("device") != "cuda":
    problems.append(f"the baseline model ran on {facts.get('device')}, expected cuda")
labels = {t["label"]: t for t in tune["trials"]}
if not any(l.startswith("amp=bf16") for l in labels):
    problems.append("no AMP trial ran on CUDA")
if "matmul_precision=high" not in labels:
    problems.append("no TF32 (matmul_precision=high) trial ran on CUDA")
for t in tune["trials"]:
    print(f"{t['label']:45s} {t['verdict']:12s} {t.get('median_ms') or 0:8.2f} ms  {t.get('cause') or t.get('note') or ''}")
if tune["winner"] and tune["confirmed_speedup"] < tune["required_speedup"]:
    problems.append("a winner was recommended below the required speedup")
print("winner:", tune["winner"] and tune["winner"]["label"], "confirmed", tune["confirmed_speedup"])
if problems:
    print("FAIL:", "; ".join(problems))
    sys.exit(1)
PYEOF

timeout 45 "$PY" benchmarks/tune.py --config "$OUT_DIR/scalpel.toml" --device cuda --rounds 2 --steps 10 \
  --out "$OUT_DIR/bench" 2>&1 | tail -8 | tee "$OUT_DIR/bench.txt" || echo "re-measure did not finish in 45 s"
timeout 40 "$PY" -m torchscalpel run --config "$OUT_DIR/scalpel.toml" --show -- \
  examples/char_transformer.py --device cuda --steps 20 --log-every 10 2>&1 | tee "$OUT_DIR/run.txt"
echo "tune gpu check done"
