#!/usr/bin/env bash
# The whole GPU check in about four minutes of wall time, for a short device lease: three lanes run
# side by side on the one GPU. Lane A: env (alone first, so its speed probes see an idle GPU), then
# profile, analyze, doctor, data_sanity, ship. Lane B: plan, dist (memory and exactness checks, not timings).
# Lane C: tune, started once env is done. Logs: $OUT/lane-{a,b,c}.log; artefacts: $OUT/gpu-check.tgz.
#   OUT=/some/dir bash scripts/gpu_check_lanes.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL="${OUT:-$PWD/gpu-check-out}"
WORK="$(mktemp -d)/gc"
mkdir -p "$FINAL" "$WORK"
( OUT=$WORK bash scripts/gpu_check.sh env > "$FINAL/lane-a.log" 2>&1; touch "$WORK/env.done"
  OUT=$WORK bash scripts/gpu_check.sh profile analyze doctor data_sanity ship >> "$FINAL/lane-a.log" 2>&1 ) &
( OUT=$WORK bash scripts/gpu_check.sh plan dist > "$FINAL/lane-b.log" 2>&1 ) &
( while [ ! -e "$WORK/env.done" ]; do sleep 2; done
  OUT=$WORK bash scripts/gpu_check.sh tune > "$FINAL/lane-c.log" 2>&1 ) &
wait
# Small artefacts only (records, reports, JSON): the lease returns few files, 16 MiB each at most.
(cd "$WORK/.." && find gc -type f -size -3M ! -name '*.pt' ! -name '*.pt2' ! -name '*.onnx' -print0 \
  | tar czf "$FINAL/gpu-check.tgz" --null -T -)
grep -h "^== .*: \(PASS\|FAIL\)\|^gpu_check:" "$FINAL"/lane-*.log
