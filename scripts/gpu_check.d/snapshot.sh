#!/usr/bin/env bash
# GPU check for `scalpel memory SNAPSHOT`: a real torch.cuda.memory._dump_snapshot (history with Python and
# C++ frames) read by the native streaming reader and by the pure-Python one: the same explanation, the
# native reader actually used, and the reserved / allocated totals equal to torch.cuda.memory_stats at the
# dump. Run from the repo root with the machine's python as $PY (needs gcc or cc for the native reader). ~30 s.
set -euo pipefail
PY=${PY:-python}
OUT="${OUT:-$(mktemp -d)}/snapshot"
mkdir -p "$OUT"
PYTHONPATH=src "$PY" - "$OUT" <<'PYEOF'
import json, os, sys, torch
from pathlib import Path
out = Path(sys.argv[1])
assert torch.cuda.is_available(), "no CUDA device"
torch.cuda.memory._record_memory_history(max_entries=100_000)
keep = [torch.empty(int(1 << 20) * (1 + i % 7), device="cuda") for i in range(300)]
del keep[::3]
m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)]).cuda()
m(torch.randn(512, 1024, device="cuda")).sum().backward()
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
path = out / "snapshot.pickle"
torch.cuda.memory._dump_snapshot(str(path))
torch.cuda.memory._record_memory_history(enabled=None)
os.environ["TORCHSCALPEL_CACHE_DIR"] = str(out / "cache")
from torchscalpel.memory import snapshot as S
native = S.explain_snapshot(path)
os.environ["TORCHSCALPEL_NATIVE"] = "0"
python = S.explain_snapshot(path)
strip = ("reader", "reader_note", "scanner", "read_s")
same = {k: v for k, v in native.items() if k not in strip} == {k: v for k, v in python.items() if k not in strip}
res = {"bytes": path.stat().st_size, "native_reader": native["reader"], "note": native["reader_note"], "same": same,
       "reserved": native["reserved"], "stats_reserved": stats["reserved_bytes.all.current"],
       "allocated": native["allocated"], "stats_allocated": stats["allocated_bytes.all.current"],
       "trace_events": native["trace"]["events"], "sites": native["sites"][:3], "read_s": [native["read_s"], python["read_s"]]}
print(json.dumps(res)); (out / "snapshot.json").write_text(json.dumps(res, indent=1))
assert native["reader"] == "native", res
assert same, res
assert res["reserved"] == res["stats_reserved"] and res["allocated"] == res["stats_allocated"], res
assert res["trace_events"] > 300, res
PYEOF
