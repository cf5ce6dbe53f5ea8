"""A real recorded run feeds export: `scalpel profile` of a training script whose DataLoaders hold a training and
an evaluation transform, then `scalpel export --transform-from RUN` records the evaluation chain the runtime saw
on the dataset, and the bundle's preprocessing equals the training pipeline on raw pixels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, run_cli

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import torch
from PIL import Image
from fixtures import image_pipeline
from fixtures import tv_standins as T

class Pictures(torch.utils.data.Dataset):
    def __init__(self, transform):
        self.transform = transform
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, (24, 20, 3), dtype=np.uint8) for _ in range(8)]
    def __len__(self):
        return len(self.images)
    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), i % 5

train_tf = T.Compose([T.RandomHorizontalFlip(), T.Resize(20), T.CenterCrop(16), T.ToTensor()])
train = torch.utils.data.DataLoader(Pictures(train_tf), batch_size=4)
evaluation = torch.utils.data.DataLoader(Pictures(image_pipeline.EVAL), batch_size=4)
model = image_pipeline.make()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in train:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
with torch.no_grad():
    for x, _ in evaluation:
        model(x)
"""


def test_profile_then_export_from_the_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests")), encoding="utf-8")
    run = tmp_path / "run"
    proc = run_cli(
        "profile", "--out", str(run), "--warmup", "0", "--steps", "10", "--profile-steps", "0", str(script),
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaders = json.loads((run / "run.json").read_text())["provenance"]["seeds"]["loaders"]
    assert [entry["transform"]["dataset"] for entry in loaders] == ["Pictures", "Pictures"]
    out = tmp_path / "bundle"
    model = tmp_path / "model.py"
    model.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nfrom fixtures.image_pipeline import make\n",
        encoding="utf-8",
    )
    proc = run_cli(
        "export", "--model", f"{model}:make",
        "--example", "float32[1,3,16,16]", "--formats", "onnx", "--max-batch", "4",
        "--transform-from", str(run), "--out", str(out), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    pre = manifest["preprocessing"]
    assert [s["op"] for s in pre["steps"]] == ["resize", "center_crop", "to_tensor", "normalize"]
    assert pre["source"].startswith("Resize, CenterCrop, ToTensor, Normalize from ")
    assert manifest["preprocessing_parity"]["reference"].startswith("the steps recorded in ")
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from fixtures import image_pipeline
    from torchscalpel.ship.preprocess import Preprocessor
    from torchscalpel.ship.transforms import training_batch

    raw = [np.random.default_rng(5).integers(0, 256, (31, 22, 3), dtype=np.uint8) for _ in range(3)]
    np.testing.assert_allclose(
        Preprocessor(pre).apply_batch(raw), training_batch(image_pipeline.EVAL, pre, raw), atol=1e-6
    )
