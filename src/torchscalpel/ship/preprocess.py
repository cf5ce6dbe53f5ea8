"""Preprocessing as data: the transform the model was trained behind, recorded in the bundle and applied by serve.

A spec is plain JSON (``manifest["preprocessing"]``), never code::

    {"input": "x",
     "raw": {"dtype": "uint8", "layout": "HWC", "channels": 3, "size": [32, 32] | null},
     "steps": [{"op": "resize", "size": [36], "interpolation": "bilinear", "antialias": true, "max_size": null},
               {"op": "center_crop", "size": [32, 32]},
               {"op": "to_tensor"},
               {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}],
     "source": "Compose(Resize, CenterCrop, ToTensor, Normalize) from train.py:EVAL"}

One raw sample goes through the steps in order; the results are stacked into the model's batch.
The semantics are torchvision's (v1 functional): ``to_tensor`` HWC -> CHW and uint8 / 255;
``pil_to_tensor`` HWC -> CHW, dtype kept; ``convert_dtype`` int -> float divides by the int type's
maximum; ``resize`` before ``to_tensor`` is PIL's resampling (as torchvision does on PIL images),
after it ``torch.nn.functional.interpolate`` (as on tensors; torch is imported only then);
``center_crop`` pads with zeros when the crop is larger, and rounds the offset as torchvision does;
``normalize`` subtracts and divides per channel in the tensor's own dtype.

Every failure on a raw sample raises :class:`PreprocessError` whose message names the input field;
serve turns it into 422.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError

OPS = ("to_tensor", "pil_to_tensor", "convert_dtype", "resize", "center_crop", "normalize")
"""Step kinds a spec may hold."""
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "hamming", "lanczos")
TENSOR_INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic")
"""Modes ``torch.nn.functional.interpolate`` has (the others exist only as PIL filters)."""
RAW_DTYPES = ("uint8", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_SIDE = 8192
"""Largest height or width of one raw sample (a 64-megapixel image); beyond is refused before any work."""
MAX_STEPS = 32


class PreprocessError(ValueError):
    """A raw sample the spec cannot take; the message names the input field and says what is wrong."""


@dataclass(frozen=True, slots=True)
class RawSpec:
    """What one raw sample looks like."""

    dtype: str
    layout: str
    """``HWC`` (an image: height, width, channels; ``HW`` accepted for one channel) or ``CHW`` (a tensor)."""
    channels: int | None
    size: tuple[int, int] | None
    """Fixed (height, width), or ``None`` when a resize or crop makes any size acceptable."""


def _fail(where: str, what: str) -> UsageError:
    return UsageError(f"preprocessing {where}: {what}; re-export, or fix the --preprocess JSON.")


def _size_list(value: Any, where: str, *, allow_one: bool = True) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) not in ((1, 2) if allow_one else (2,))
        or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in value)
    ):
        raise _fail(where, f"size must be one or two whole numbers from 1 to {MAX_SIDE}, not {value!r:.60}")
    return list(value)


def _numbers(value: Any, where: str, name: str) -> list[float]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= 64
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
        )
    ):
        raise _fail(where, f"{name} must be a list of 1 to 64 finite numbers")
    return [float(v) for v in value]


def check_step(step: Any, index: int) -> dict[str, Any]:
    """One step, checked and normalised (unknown keys refused: a typo must not be ignored silently)."""
    where = f"step {index}"
    if not isinstance(step, dict) or step.get("op") not in OPS:
        op = step.get("op") if isinstance(step, dict) else step
        raise _fail(where, f"op {str(op)[:40]!r} is not one of {', '.join(OPS)}")
    op = step["op"]
    allowed = {
        "to_tensor": set(),
        "pil_to_tensor": set(),
        "convert_dtype": {"dtype", "scale"},
        "resize": {"size", "interpolation", "antialias", "max_size"},
        "center_crop": {"size"},
        "normalize": {"mean", "std"},
    }[op]
    extra = set(step) - allowed - {"op"}
    if extra:
        raise _fail(where, f"{op} takes no {', '.join(sorted(map(str, extra)))[:80]}")
    out: dict[str, Any] = {"op": op}
    if op == "convert_dtype":
        if step.get("dtype") not in ("float16", "float32", "float64"):
            raise _fail(where, "convert_dtype converts to float16, float32 or float64")
        if not isinstance(step.get("scale", True), bool):
            raise _fail(where, "convert_dtype's scale is true or false")
        out.update(dtype=step["dtype"], scale=step.get("scale", True))
    elif op == "resize":
        interp = step.get("interpolation", "bilinear")
        if interp not in INTERPOLATIONS:
            raise _fail(
                where, f"interpolation {str(interp)[:30]!r} is not one of {', '.join(INTERPOLATIONS)}"
            )
        max_size = step.get("max_size")
        if max_size is not None and (
            not isinstance(max_size, int) or isinstance(max_size, bool) or not 1 <= max_size <= MAX_SIDE
        ):
            raise _fail(where, f"max_size must be a whole number from 1 to {MAX_SIDE} or null")
        if not isinstance(step.get("antialias", True), bool):
            raise _fail(where, "antialias is true or false")
        size = _size_list(step.get("size"), where)
        if max_size is not None and (len(size) != 1 or max_size <= size[0]):
            raise _fail(where, "max_size needs a single size smaller than it")
        out.update(size=size, interpolation=interp, antialias=step.get("antialias", True), max_size=max_size)
    elif op == "center_crop":
        size = _size_list(step.get("size"), where)
        out["size"] = size * 2 if len(size) == 1 else size
    elif op == "normalize":
        mean, std = _numbers(step.get("mean"), where, "mean"), _numbers(step.get("std"), where, "std")
        if len(mean) != len(std) or any(s == 0 for s in std):
            raise _fail(where, "normalize needs mean and std of the same length and no zero std")
        out.update(mean=mean, std=std)
    return out


def check_spec(spec: Any, input_names: list[str] | None = None) -> dict[str, Any]:
    """A spec checked and normalised; raises :class:`UsageError` (one sentence) naming the first problem."""
    if not isinstance(spec, dict):
        raise _fail("spec", "must be a JSON object with 'steps'")
    extra = set(spec) - {"input", "raw", "steps", "source"}
    if extra:
        raise _fail("spec", f"has unknown keys {', '.join(sorted(map(str, extra)))[:80]}")
    steps = spec.get("steps")
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise _fail("spec", f"'steps' must be a list of 1 to {MAX_STEPS} steps")
    checked = [check_step(s, i) for i, s in enumerate(steps)]
    tensor_ops = [i for i, s in enumerate(checked) if s["op"] in ("to_tensor", "pil_to_tensor")]
    if len(tensor_ops) > 1:
        raise _fail("spec", "has more than one to_tensor/pil_to_tensor step")
    image_stage = checked[: tensor_ops[0]] if tensor_ops else []
    for i, s in enumerate(image_stage):
        if s["op"] not in ("resize", "center_crop"):
            raise _fail(f"step {i}", f"{s['op']} works on tensors; put it after to_tensor")
    for i, s in enumerate(checked):
        if (
            s["op"] == "resize"
            and (not tensor_ops or i > tensor_ops[0])
            and s["interpolation"] not in TENSOR_INTERPOLATIONS
        ):
            raise _fail(
                f"step {i}", f"{s['interpolation']} resampling exists only for images before to_tensor"
            )
    raw = spec.get("raw") or {}
    if not isinstance(raw, dict) or set(raw) - {"dtype", "layout", "channels", "size"}:
        raise _fail("raw", "must be an object with dtype, layout, channels, size")
    layout = raw.get("layout", "HWC" if tensor_ops else "CHW")
    if layout != ("HWC" if tensor_ops else "CHW"):
        raise _fail("raw", "layout is HWC when a to_tensor step exists and CHW otherwise")
    dtype = raw.get("dtype", "uint8" if tensor_ops else "float32")
    if dtype not in RAW_DTYPES or (image_stage and dtype != "uint8"):
        raise _fail(
            "raw",
            f"dtype {str(dtype)[:20]!r} is not one of {', '.join(RAW_DTYPES)} (uint8 for resized images)",
        )
    channels = raw.get("channels")
    if channels is not None and (
        not isinstance(channels, int) or isinstance(channels, bool) or not 1 <= channels <= 64
    ):
        raise _fail("raw", "channels must be a whole number from 1 to 64 or null")
    if image_stage and channels not in (None, 1, 3, 4):
        raise _fail("raw", "an image resized before to_tensor has 1, 3 or 4 channels")
    size = raw.get("size")
    if size is not None:
        size = _size_list(size, "raw", allow_one=False)
    name = spec.get("input")
    if name is not None and not isinstance(name, str):
        raise _fail("spec", "'input' must be the name of a model input")
    if input_names is not None:
        name = name if name is not None else input_names[0]
        if name not in input_names:
            raise _fail("spec", f"'input' {name[:60]!r} is not a model input ({', '.join(input_names)})")
    source = spec.get("source")
    out: dict[str, Any] = {
        "input": name,
        "raw": {"dtype": dtype, "layout": layout, "channels": channels, "size": size},
        "steps": checked,
    }
    if source is not None:
        out["source"] = str(source)[:300]
    return out


def is_spec(value: Any) -> bool:
    """True for an applied spec (a dict with ``steps``); anything else in ``preprocessing`` is client metadata."""
    return isinstance(value, dict) and "steps" in value


def resized_size(height: int, width: int, size: list[int], max_size: int | None) -> tuple[int, int]:
    """torchvision's output size of a resize: one number matches the shorter edge, two are (height, width)."""
    if len(size) == 2:
        return size[0], size[1]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size[0], int(size[0] * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


def crop_box(height: int, width: int, crop: list[int]) -> tuple[int, int, int, int]:
    """(top, left, pad_top, pad_left) of torchvision's center crop; a crop larger than the image pads zeros."""
    ch, cw = crop
    pad_top = (ch - height) // 2 if ch > height else 0
    pad_left = (cw - width) // 2 if cw > width else 0
    padded_h = height + (ch - height if ch > height else 0)
    padded_w = width + (cw - width if cw > width else 0)
    return round((padded_h - ch) / 2.0), round((padded_w - cw) / 2.0), pad_top, pad_left


def _center_crop(arr: np.ndarray, crop: list[int], *, channels_last: bool) -> np.ndarray:
    height, width = (arr.shape[0], arr.shape[1]) if channels_last else (arr.shape[-2], arr.shape[-1])
    top, left, pad_top, pad_left = crop_box(height, width, crop)
    if pad_top or pad_left or crop[0] > height or crop[1] > width:
        ph, pw = max(crop[0], height), max(crop[1], width)
        shape = (ph, pw, *arr.shape[2:]) if channels_last else (*arr.shape[:-2], ph, pw)
        padded = np.zeros(shape, dtype=arr.dtype)
        if channels_last:
            padded[pad_top : pad_top + height, pad_left : pad_left + width] = arr
        else:
            padded[..., pad_top : pad_top + height, pad_left : pad_left + width] = arr
        arr = padded
    if channels_last:
        return arr[top : top + crop[0], left : left + crop[1]]
    return arr[..., top : top + crop[0], left : left + crop[1]]


_PIL_FILTERS = {
    "nearest": 0,
    "nearest-exact": 0,
    "lanczos": 1,
    "bilinear": 2,
    "bicubic": 3,
    "box": 4,
    "hamming": 5,
}
"""torchvision's InterpolationMode -> PIL filter number (what ``F.resize`` passes to ``Image.resize``)."""


def _resize_image(arr: np.ndarray, step: dict[str, Any]) -> np.ndarray:
    from PIL import Image

    h, w = resized_size(arr.shape[0], arr.shape[1], step["size"], step["max_size"])
    image = Image.fromarray(arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
    out = np.asarray(image.resize((w, h), _PIL_FILTERS[step["interpolation"]]))
    return out[:, :, None] if arr.ndim == 3 and out.ndim == 2 else out


def _resize_tensor(arr: np.ndarray, step: dict[str, Any]) -> np.ndarray:
    import torch

    h, w = resized_size(arr.shape[-2], arr.shape[-1], step["size"], step["max_size"])
    mode = step["interpolation"]
    smooth = mode in ("bilinear", "bicubic")
    t = torch.from_numpy(np.ascontiguousarray(arr))
    lead = t.shape[:-2]
    work = t.reshape(1, -1, *t.shape[-2:])
    if not work.is_floating_point():
        work = work.to(torch.float32)
    out = torch.nn.functional.interpolate(
        work,
        size=[h, w],
        mode=mode,
        align_corners=False if smooth else None,
        antialias=bool(step["antialias"]) and smooth,
    )
    if not t.is_floating_point():
        if mode == "bicubic":
            out = out.clamp(0, 255) if t.dtype == torch.uint8 else out
        out = out.round().to(t.dtype)
    return out.reshape(*lead, h, w).numpy()


class Preprocessor:
    """Applies a checked spec to raw samples (numpy; PIL for image resizes, torch for tensor resizes)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = check_spec(spec)
        self.input: str | None = self.spec["input"]
        raw = self.spec["raw"]
        size = raw["size"]
        self.raw = RawSpec(
            dtype=raw["dtype"],
            layout=raw["layout"],
            channels=raw["channels"],
            size=(size[0], size[1]) if size else None,
        )
        self.steps: list[dict[str, Any]] = self.spec["steps"]

    @property
    def field(self) -> str:
        """The input field this spec feeds (for error messages)."""
        return self.input or "input"

    def check_raw(self, arr: np.ndarray, where: str) -> np.ndarray:
        """A raw sample's rank, size, channels and dtype against the spec; the sample in the raw dtype."""
        raw = self.raw
        if arr.dtype.kind not in "fiub":
            raise PreprocessError(f"raw input {where} must hold numbers")
        if raw.layout == "HWC":
            if arr.ndim == 2:
                arr = arr[:, :, None]
            if arr.ndim != 3:
                raise PreprocessError(
                    f"raw input {where} has {arr.ndim} dimensions; expected (height, width, channels)"
                )
            height, width, chans = arr.shape
        else:
            if arr.ndim < 2:
                raise PreprocessError(
                    f"raw input {where} has {arr.ndim} dimensions; expected (channels, height, width)"
                )
            height, width = arr.shape[-2:]
            chans = arr.shape[0] if arr.ndim == 3 else None
        if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
            raise PreprocessError(f"raw input {where} is {height}x{width}; each side must be 1 to {MAX_SIDE}")
        if raw.channels is not None and chans is not None and chans != raw.channels:
            raise PreprocessError(f"raw input {where} has {chans} channels; expected {raw.channels}")
        if raw.size is not None and (height, width) != raw.size:
            raise PreprocessError(
                f"raw input {where} is {height}x{width}; expected {raw.size[0]}x{raw.size[1]} (height x width)"
            )
        want = np.dtype(raw.dtype)
        if want.kind in "iu":
            if arr.dtype.kind == "f" and arr.size and not np.all(np.floor(arr) == arr):
                raise PreprocessError(f"raw input {where} must hold whole numbers ({raw.dtype} pixels)")
            info = np.iinfo(want)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise PreprocessError(
                    f"raw input {where} has values outside [{info.min}, {info.max}] ({raw.dtype})"
                )
        elif arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr)):
            raise PreprocessError(f"raw input {where} contains NaN or infinity")
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(want)
        if want.kind == "f" and arr.size and not np.all(np.isfinite(out)):
            raise PreprocessError(f"raw input {where} has values too large for {raw.dtype}")
        return out

    def apply(self, sample: np.ndarray, where: str | None = None) -> np.ndarray:
        """One raw sample through every step; the model's per-sample input (no batch dimension)."""
        where = where or repr(self.field)
        arr = self.check_raw(sample, where)
        channels_last = self.raw.layout == "HWC"
        for step in self.steps:
            op = step["op"]
            if op == "resize":
                arr = _resize_image(arr, step) if channels_last else _resize_tensor(arr, step)
            elif op == "center_crop":
                arr = _center_crop(arr, step["size"], channels_last=channels_last)
            elif op in ("to_tensor", "pil_to_tensor"):
                arr = np.ascontiguousarray(arr.transpose(2, 0, 1))
                channels_last = False
                if op == "to_tensor" and arr.dtype == np.uint8:
                    arr = arr.astype(np.float32) / np.float32(255)
            elif op == "convert_dtype":
                want = np.dtype(step["dtype"])
                if arr.dtype.kind in "iu" and step["scale"]:
                    arr = arr.astype(want) / want.type(np.iinfo(arr.dtype).max)
                else:
                    arr = arr.astype(want)
            elif op == "normalize":
                if arr.dtype.kind != "f":
                    raise PreprocessError(
                        f"raw input {where} reaches normalize as {arr.dtype.name}, not floats"
                    )
                mean = np.asarray(step["mean"], dtype=arr.dtype)
                std = np.asarray(step["std"], dtype=arr.dtype)
                if len(mean) not in (1, arr.shape[0]):
                    raise PreprocessError(
                        f"raw input {where} has {arr.shape[0]} channels at normalize; its mean has {len(mean)}"
                    )
                arr = (arr - mean[:, None, None]) / std[:, None, None]
        return np.ascontiguousarray(arr)

    def apply_batch(self, samples: list[np.ndarray]) -> np.ndarray:
        """Every raw sample through the steps, stacked into one batch (every result must have one shape)."""
        outs = [self.apply(s, f"{self.field!r} sample {i}") for i, s in enumerate(samples)]
        shapes = {o.shape for o in outs}
        if len(shapes) > 1:
            raise PreprocessError(
                f"raw input {self.field!r} gives samples of different shapes {sorted(shapes)[:3]} after preprocessing; "
                "send samples of one size"
            )
        return np.stack(outs)
