"""The transform read from the run record: the runtime writes each DataLoader's dataset.transform down as plain
data (runtime.transform_snapshot via the provenance observer), and export --transform-from RUN recognises it
there, validating every field of the record before use; served raw pixels equal the training pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from fixtures import image_pipeline
from fixtures import tv_standins as T
from torchscalpel.errors import UsageError
from torchscalpel.record import RunRecord, save_record
from torchscalpel.runtime.provenance import ProvenanceObserver
from torchscalpel.runtime.transform_snapshot import dataset_transform, snapshot
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.backends import load_runner
from torchscalpel.ship.bundle import verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.transforms import from_record, training_batch

MODEL = Path(image_pipeline.__file__)
TRAIN = T.Compose([T.RandomHorizontalFlip(), T.Resize(20), T.CenterCrop(16), T.ToTensor()])


def _loader(transform, *, subset: bool = False):
    dataset = SimpleNamespace(transform=transform)
    if subset:
        dataset = SimpleNamespace(dataset=dataset)
    return SimpleNamespace(dataset=dataset, num_workers=0, generator=None, worker_init_fn=None)


def _record(tmp_path: Path, *transforms, subset: bool = False) -> Path:
    """A run record as a profiled run writes it: the provenance observer saw one batch from each loader."""
    obs = ProvenanceObserver()
    for t in transforms:
        obs.on_batch([np.zeros(1)], _loader(t, subset=subset))
    record = RunRecord(name="train")
    obs.on_finish(record)
    path = tmp_path / "run" / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_record(record, path)
    return path


def test_the_snapshot_is_plain_data():
    shot = snapshot(image_pipeline.EVAL)
    assert shot["class"] == "Compose" and [i["class"] for i in shot["items"]] == [
        "Resize",
        "CenterCrop",
        "ToTensor",
        "Normalize",
    ]
    assert shot["items"][0]["attrs"]["interpolation"] == "bilinear"  # the enum's value
    assert shot["items"][3]["attrs"] == {
        "mean": image_pipeline.MEAN,
        "std": image_pipeline.STD,
        "inplace": False,
    }
    json.dumps(shot)  # nothing but JSON
    fn = snapshot(T.Compose([T.Lambda(lambda x: x * 2), len]))
    assert fn["items"][0]["class"] == "Lambda" and "lambda" in fn["items"][0]["name"]
    assert fn["items"][1] == {"class": "function", "name": "len"}
    assert dataset_transform(SimpleNamespace(dataset=SimpleNamespace(transform=T.ToTensor())))[
        "transform"
    ] == {
        "class": "ToTensor",
        "attrs": {},
    }
    assert dataset_transform(SimpleNamespace()) is None


def test_the_provenance_observer_records_each_loaders_transform(tmp_path):
    path = _record(tmp_path, TRAIN, image_pipeline.EVAL)
    loaders = json.loads(path.read_text())["provenance"]["seeds"]["loaders"]
    assert [entry["transform"]["transform"]["items"][0]["class"] for entry in loaders] == [
        "RandomHorizontalFlip",
        "Resize",
    ]
    assert loaders[0]["transform"]["dataset"] == "SimpleNamespace"


@pytest.fixture(scope="module")
def recorded_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rec")
    run = _record(tmp, TRAIN, image_pipeline.EVAL)
    opts = ExportOptions(
        model=f"{MODEL}:make",
        examples=["float32[1,3,16,16]"],
        formats=("onnx",),
        max_batch=8,
        out=tmp / "bundle",
        transform_from=str(run.parent),
    )
    return export_bundle(opts, log=lambda _: None), run


def test_export_reads_the_transform_from_the_run(recorded_bundle):
    result, run = recorded_bundle
    m = result.manifest
    assert result.passed
    assert [s["op"] for s in m["preprocessing"]["steps"]] == [
        "resize",
        "center_crop",
        "to_tensor",
        "normalize",
    ]
    assert m["preprocessing"]["steps"][-1]["mean"] == image_pipeline.MEAN
    assert m["preprocessing_parity"]["reference"].startswith(f"the steps recorded in {run.parent}")
    b = verify_bundle(result.path)
    app = create_app(b, load_runner(b, "onnxruntime"), ServeConfig(max_batch=8, max_wait_ms=1))
    images = [np.random.default_rng(3).integers(0, 256, (25, 30, 3), dtype=np.uint8) for _ in range(2)]
    import torch

    with torch.inference_mode():
        want = image_pipeline.make().eval()(
            torch.from_numpy(training_batch(image_pipeline.EVAL, b.manifest["preprocessing"], images))
        )
    with TestClient(app) as client:
        r = client.post(
            "/v1/predict",
            content=json.dumps({"raw": {"x": [i.tolist() for i in images]}}),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(
            np.asarray(r.json()["outputs"]["output"]), want.numpy(), rtol=1e-4, atol=1e-5
        )


def test_a_loader_is_picked_by_index(tmp_path):
    run = _record(tmp_path, TRAIN, image_pipeline.EVAL, subset=True)
    obj, label = from_record(f"{run}:1")
    assert type(obj.transforms[0]).__name__ == "Resize" and "DataLoader over SimpleNamespace" in label
    obj, _ = from_record(f"{run}:0")
    assert type(obj.transforms[0]).__name__ == "RandomHorizontalFlip"
    with pytest.raises(
        UsageError, match="DataLoader 5 has no recorded transform; the record has one for 0, 1"
    ):
        from_record(f"{run}:5")


def _edit(run: Path, change) -> Path:
    doc = json.loads(run.read_text())
    change(doc["provenance"]["seeds"]["loaders"][0]["transform"]["transform"])
    run.write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize(
    ("transforms", "change", "words"),
    [
        (
            (T.Compose([T.ToTensor(), T.Lambda(lambda x: x)]),),
            None,
            r"The transform Lambda\(.*lambda.*\) \(step 1 of the chain\) is Python code",
        ),
        ((T.Compose([T.ToTensor(), abs]),), None, "The transform abs recorded in .* is Python code"),
        ((TRAIN,), None, "RandomHorizontalFlip .* is a random augmentation"),
        (
            (image_pipeline.EVAL,),
            lambda t: t["items"][3]["attrs"].update(weights=[1]),
            "has attributes of Normalize that are not plain numbers and names",
        ),
        (
            (image_pipeline.EVAL,),
            lambda t: t["items"][3].update({"class": "os.system"}),
            "names the class 'os.system', not a class name",
        ),
        (
            (image_pipeline.EVAL,),
            lambda t: t["items"][3]["attrs"].update(mean="abc"),
            "has a mean or std that is not a list of numbers",
        ),
        ((image_pipeline.EVAL,), lambda t: t.update(items={"a": 1}), "not a list of up to 32 steps"),
    ],
)
def test_what_the_record_holds_is_checked_before_use(tmp_path, transforms, change, words):
    run = _record(tmp_path, *transforms)
    if change is not None:
        _edit(run, change)
    with pytest.raises(UsageError, match=words) as info:
        export_bundle(
            ExportOptions(
                model=f"{MODEL}:make",
                examples=["float32[1,3,16,16]"],
                formats=("onnx",),
                out=tmp_path / "b",
                transform_from=str(run),
            ),
            log=lambda _: None,
        )
    assert "\n" not in str(info.value) and not (tmp_path / "b").exists()


def test_a_record_without_a_transform_says_what_to_do(tmp_path):
    run = _record(tmp_path)
    with pytest.raises(
        UsageError, match=r"holds no dataset transform .* pass --transform MODULE:NAME instead"
    ):
        from_record(str(run))
