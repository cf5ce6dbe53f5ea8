"""Preprocessing as data: the recogniser (duck typing on torchvision-style stand-ins), the spec checks,
and the numpy/PIL/torch application against the stand-ins' own behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures import tv_standins as T
from torchscalpel.errors import UsageError
from torchscalpel.ship.preprocess import PreprocessError, Preprocessor, check_spec, crop_box, resized_size
from torchscalpel.ship.transforms import load_transform, recognise, training_batch


class Sharpen:
    """A transform torchscalpel does not know."""

    def __call__(self, x):
        return x


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _image_chain():
    return T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize(MEAN, STD)])


def test_recognise_reads_the_chain_as_data():
    spec = recognise(_image_chain(), source="t:EVAL", input_name="x", example_shape=(1, 3, 16, 16))
    assert [s["op"] for s in spec["steps"]] == ["resize", "center_crop", "to_tensor", "normalize"]
    assert spec["steps"][0] == {
        "op": "resize",
        "size": [20],
        "interpolation": "bilinear",
        "antialias": True,
        "max_size": None,
    }
    assert spec["steps"][1]["size"] == [16, 16] and spec["steps"][3]["mean"] == MEAN
    assert spec["raw"] == {"dtype": "uint8", "layout": "HWC", "channels": 3, "size": None}
    # without a resize or crop the raw size is the model input's
    plain = recognise(
        T.Compose([T.ToTensor(), T.Normalize([0.5], [0.2])]),
        source="s",
        input_name="x",
        example_shape=(1, 1, 8, 8),
    )
    assert plain["raw"]["size"] == [8, 8] and plain["raw"]["channels"] == 1


@pytest.mark.parametrize("hw", [(25, 23), (16, 40), (9, 9)])
def test_image_chain_matches_the_training_transform(hw):
    chain = _image_chain()
    spec = recognise(chain, source="t", input_name="x", example_shape=(1, 3, 16, 16))
    rng = np.random.default_rng(hw[0])
    samples = [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for _ in range(3)]
    want = training_batch(chain, spec, samples)
    got = Preprocessor(spec).apply_batch(samples)
    assert got.shape == want.shape == (3, 3, 16, 16) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_tensor_chain_matches_the_training_transform():
    chain = T.Compose(
        [T.ConvertImageDtype(torch.float32), T.Resize([12, 10]), T.CenterCrop(8), T.Normalize([0.5], [0.25])]
    )
    spec = recognise(chain, source="t", input_name="x", example_shape=(1, 1, 8, 8))
    assert spec["raw"]["layout"] == "CHW" and spec["raw"]["dtype"] == "uint8"
    samples = [np.random.default_rng(i).integers(0, 256, (1, 30, 17), dtype=np.uint8) for i in range(2)]
    want = training_batch(chain, spec, samples)
    got = Preprocessor(spec).apply_batch(samples)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_geometry_follows_torchvision():
    assert resized_size(480, 640, [256], None) == (256, 341)
    assert resized_size(640, 480, [256], None) == (341, 256)
    assert resized_size(480, 640, [256], 300) == (225, 300)
    assert resized_size(10, 10, [4, 6], None) == (4, 6)
    assert crop_box(10, 11, [4, 4]) == (3, 4, 0, 0)  # round(3.0), round(3.5) = 4 (banker's, as torchvision)
    spec = check_spec(
        {"raw": {"layout": "CHW", "dtype": "float32"}, "steps": [{"op": "center_crop", "size": [4]}]}
    )
    out = Preprocessor(spec).apply(np.ones((1, 2, 3), np.float32))
    assert out.shape == (1, 4, 4) and out.sum() == 6 and out[0, 1:3, 0:3].sum() == 6  # zero padded around


@pytest.mark.parametrize(
    ("transform", "named"),
    [
        (T.Compose([T.ToTensor(), T.Lambda(lambda t: t * 2)]), "Lambda(<lambda>)"),
        (T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]), "RandomHorizontalFlip"),
        (T.Compose([T.ToTensor(), Sharpen()]), "Sharpen"),
    ],
)
def test_unrecordable_transforms_are_refused_by_name(transform, named):
    with pytest.raises(UsageError) as err:
        recognise(transform, source="t", input_name="x", example_shape=(1, 3, 8, 8))
    msg = str(err.value)
    assert named in msg and "cannot be recorded as data" in msg and "\n" not in msg


def test_a_plain_function_is_refused(tmp_path):
    mod = tmp_path / "tf.py"
    mod.write_text("def prep(x):\n    return x / 255\n\ndef build():\n    return [prep]\n")
    with pytest.raises(UsageError, match="prep is a Python function"):
        load_transform(f"{mod}:prep")
    obj, _ = load_transform(f"{mod}:build")  # a builder is called; what it builds is still refused
    with pytest.raises(UsageError, match=r"prep .*is Python code"):
        recognise(obj, source="b", input_name="x", example_shape=(1, 1, 4, 4))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"steps": [{"op": "sharpen"}]}, "not one of"),
        ({"steps": [{"op": "normalize", "mean": [0.5], "std": [0]}]}, "no zero std"),
        ({"steps": [{"op": "to_tensor", "scale": 2}]}, "takes no scale"),
        (
            {"steps": [{"op": "normalize", "mean": [0.5], "std": [1]}, {"op": "to_tensor"}]},
            "works on tensors",
        ),
        ({"steps": [{"op": "resize", "size": [0]}]}, "size must be"),
        ({"steps": []}, "1 to 32 steps"),
        ({"steps": [{"op": "to_tensor"}], "input": "y"}, "not a model input"),
    ],
)
def test_bad_specs_are_one_sentence(spec, words):
    with pytest.raises(UsageError, match=words):
        check_spec(spec, ["x"])


def test_raw_sample_errors_name_the_field():
    spec = recognise(_image_chain(), source="t", input_name="img", example_shape=(1, 3, 16, 16))
    pre = Preprocessor(spec)
    with pytest.raises(PreprocessError, match=r"raw input 'img' sample 1 has 4 channels; expected 3"):
        pre.apply_batch([np.zeros((20, 20, 3), np.uint8), np.zeros((20, 20, 4), np.uint8)])
    with pytest.raises(PreprocessError, match=r"'img' sample 0 has values outside \[0, 255\]"):
        pre.apply_batch([np.full((20, 20, 3), 300)])
    fixed = Preprocessor(recognise(T.ToTensor(), source="t", input_name="x", example_shape=(1, 3, 8, 8)))
    with pytest.raises(PreprocessError, match="is 9x8; expected 8x8"):
        fixed.apply(np.zeros((9, 8, 3), np.uint8))


class ToImage:
    """torchvision.transforms.v2.ToImage's reading: HWC image to CHW tensor, dtype kept."""

    def __call__(self, pic):
        return torch.from_numpy(np.ascontiguousarray(np.asarray(pic).transpose(2, 0, 1)))


class ToDtype:
    """torchvision.transforms.v2.ToDtype(torch.float32, scale=True)."""

    dtype = torch.float32
    scale = True

    def __call__(self, t):
        return t.to(self.dtype) / 255.0


def test_v2_to_image_and_to_dtype():
    chain = T.Compose([ToImage(), ToDtype(), T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])])
    spec = recognise(chain, source="v2", input_name="x", example_shape=(1, 3, 8, 8))
    assert [s["op"] for s in spec["steps"]] == ["pil_to_tensor", "convert_dtype", "normalize"]
    samples = [np.random.default_rng(3).integers(0, 256, (8, 8, 3), dtype=np.uint8)]
    np.testing.assert_allclose(
        Preprocessor(spec).apply_batch(samples), training_batch(chain, spec, samples), atol=1e-6
    )
