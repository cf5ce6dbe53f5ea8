#!/usr/bin/env bash
# plan on CUDA: measured torch.cuda.max_memory_allocated of real AdamW steps (fp32, bf16-mixed, block
# checkpointing) for MLP / CNN / GPT / Llama vs the plan simulated on fake CUDA tensors; target ±10%.
# Then the CLI against a named device. ~2-3 minutes on one GPU.
set -euo pipefail
$PY benchmarks/plan_accuracy.py --cuda --json "$OUT/plan-accuracy-cuda.json" --max-error 0.10
$PY -m torchscalpel plan --model benchmarks/plan_models.py:gpt --factory-args '{"d": 768, "layers": 6, "heads": 12, "vocab": 32000, "ctx": 512}' \
  --batch "idx=int64[16,512]:32000,y=int64[16,512]:32000" --world-size 8 --device H100-80GB --precision bf16-mixed \
  --out "$OUT/plan-gpt" --json "$OUT/plan-gpt.json"
