#!/usr/bin/env bash
# GPU check for `scalpel env` (issue 9). Run from the repo root; $PY is the venv's python.
# What it shows on a GPU machine: torch sees the GPU(s), the driver / wheel CUDA comparison, the
# per-GPU matmul and bf16/fp16 speed vs fp32, a torch.compile through triton on cuda:0, and gloo
# and nccl all_reduce. Output: gpu-check-out/env/{env.txt,env.json}; paste env.txt into BENCHMARKS.md.
# Budget: ~1-2 minutes, under the 240 s gpu_check.sh gives an area (compile probe capped at 120 s).
set -euo pipefail
PY=${PY:-python}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}/env
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# 1. facts + checks only: must be fast and must see the GPU
"$PY" -m torchscalpel env --no-probe --json "$OUT_DIR/env-noprobe.json" > "$OUT_DIR/env-noprobe.txt"
# 2. everything, as a user runs it (exit 0 whatever is found; --fail-on is not used here on purpose)
"$PY" -m torchscalpel env --json "$OUT_DIR/env.json" --compile-timeout 120 --probe-timeout 45 | tee "$OUT_DIR/env.txt"

"$PY" - "$OUT_DIR/env.json" <<'PYEOF'
import json, sys
rep = json.load(open(sys.argv[1]))
facts = rep["facts"]
probes = {(p["name"], p["device"]): p for p in rep["probes"]}
problems = []
if not facts["cuda_available"] or not facts["gpus"]:
    problems.append("torch.cuda.is_available() is False on the GPU machine")
if facts["torch_build"]["kind"] != "cuda":
    problems.append(f"torch build is {facts['torch_build']['kind']}, expected cuda")
if not (facts["driver"].get("cuda_version") or (facts.get("nvidia_smi") or {}).get("cuda_version")):
    problems.append("driver CUDA version not found (neither cudaDriverGetVersion nor nvidia-smi)")
if (facts.get("nvidia_smi") or {}).get("error"):
    problems.append("nvidia-smi query failed: " + facts["nvidia_smi"]["error"])
for i, _ in enumerate(facts["gpus"]):
    for name in ("matmul", "lowp"):
        p = probes.get((name, f"cuda:{i}"))
        if not p or p["status"] != "ok":
            problems.append(f"{name} probe on cuda:{i}: {p and p['status']} {p and p['detail']}")
comp = probes.get(("compile", "cuda:0"))
if not comp or comp["status"] != "ok":
    problems.append(f"compile probe on cuda:0: {comp and comp['status']} {comp and comp['detail']}")
nccl = [p for p in rep["probes"] if p["name"] == "allreduce" and p["device"] == "cuda"]
if facts["distributed"].get("nccl") and (not nccl or nccl[0]["status"] != "ok"):
    problems.append(f"nccl all_reduce probe: {nccl and nccl[0]['status']} {nccl and nccl[0]['detail']}")
print("env findings:", [f["rule"] for f in rep["findings"]])
if problems:
    print("GPU CHECK env: FAILED")
    for p in problems:
        print("  -", p)
    sys.exit(1)
print("GPU CHECK env: OK")
PYEOF
