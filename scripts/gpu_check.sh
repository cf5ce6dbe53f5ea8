#!/usr/bin/env bash
# The checks that need CUDA, as one prepared script for a lent GPU machine (see BENCHMARKS.md).
# Runs from the repository root with the machine's own python3 (which holds a CUDA torch) and
# this checkout's sources; each area's checks live in scripts/gpu_check.d/<area>.sh.
#   bash scripts/gpu_check.sh [AREA...]     (default: every area)
set -uo pipefail
cd "$(dirname "$0")/.."
export PY="${PY:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi unavailable"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || { echo "FAIL: no CUDA device visible"; exit 1; }

areas=("$@")
if [ ${#areas[@]} -eq 0 ]; then
  for f in scripts/gpu_check.d/*.sh; do areas+=("$(basename "$f" .sh)"); done
fi
failed=()
for area in "${areas[@]}"; do
  echo
  echo "== area: $area"
  start=$(date +%s)
  if timeout 300 bash "scripts/gpu_check.d/$area.sh"; then
    echo "== $area: PASS ($(( $(date +%s) - start )) s)"
  else
    echo "== $area: FAIL ($(( $(date +%s) - start )) s)"
    failed+=("$area")
  fi
done
echo
if [ ${#failed[@]} -gt 0 ]; then echo "gpu_check: FAILED areas: ${failed[*]}"; exit 1; fi
echo "gpu_check: all areas passed"
