#!/usr/bin/env bash
# GPU check for `scalpel export` / `scalpel serve` (issue 8). Run from the repo root; $PY is the python.
# What it shows on a GPU machine: a checkpoint written from a CUDA model (tensors on cuda:0, DDP and
# torch.compile prefixes) exports on the CPU with its prefixes stripped and parity passing; the CUDA
# eager model agrees with the exported program; a served request answers like the CUDA model.
# Output: gpu-check-out/ship/{export.txt,check.txt}. Budget: ~1 minute.
set -euo pipefail
PY=${PY:-python}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}/ship
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$OUT_DIR/bundle"

"$PY" - "$OUT_DIR" <<'PYEOF'
import sys, torch
sys.path.insert(0, "tests")
from fixtures.digits_model import make_model, train
out = sys.argv[1]
model = make_model()
train(model, epochs=1)
model = model.cuda()
state = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
assert all(v.is_cuda for v in state.values())
torch.save({"model": state}, f"{out}/cuda_ckpt.pt")
print("saved a CUDA checkpoint with", len(state), "tensors")
PYEOF

formats=exported
if "$PY" -c "import onnx, onnxruntime, onnxscript" 2>/dev/null; then formats=onnx,exported; fi
"$PY" -m torchscalpel export --model tests/fixtures/digits_model.py:make_model --weights "$OUT_DIR/cuda_ckpt.pt" \
  --example 'float32[1,1,8,8]' --formats "$formats" --output-names logits --out "$OUT_DIR/bundle" | tee "$OUT_DIR/export.txt"
grep -q "parity passed" "$OUT_DIR/export.txt"
grep -q "'module.' from 6 keys" "$OUT_DIR/export.txt"

"$PY" - "$OUT_DIR" "$formats" <<'PYEOF' | tee "$OUT_DIR/check.txt"
import sys, torch, numpy as np
sys.path.insert(0, "tests")
from fixtures.digits_model import load_digits_tensors, make_model
out, formats = sys.argv[1], sys.argv[2]
ckpt = torch.load(f"{out}/cuda_ckpt.pt", map_location="cuda", weights_only=True)["model"]
model = make_model().cuda().eval()
model.load_state_dict({k.replace("module._orig_mod.", ""): v for k, v in ckpt.items()})
x, _ = load_digits_tensors()
x = x[:32]  # the export's dynamic batch goes up to --max-batch (32)
with torch.no_grad():
    want = model(x.cuda()).cpu().numpy()
program = torch.export.load(f"{out}/bundle/model.pt2").module()
got = program(x).detach().numpy()
err = float(np.abs(got - want).max())
print(f"exported program (CPU) vs CUDA eager: max abs {err:.3g}, argmax equal {bool((got.argmax(1) == want.argmax(1)).all())}")
assert err < 1e-3 and (got.argmax(1) == want.argmax(1)).all()
if "onnx" in formats:
    from torchscalpel.serve.selfcheck import serve_check
    res = serve_check(__import__("pathlib").Path(f"{out}/bundle"), x.numpy(), want)
    print("served vs CUDA eager:", res)
    assert res["all_200"] and res["same_argmax"]
print("ship GPU check OK")
PYEOF
