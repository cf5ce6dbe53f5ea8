"""Read a training script's transform chain into a preprocessing spec (data), or refuse it in one sentence.

torchvision is not a dependency (and not installed where this was written), so the known transforms
are recognised by duck typing: the class name **and** the attributes torchvision's classes keep
(``Normalize.mean/.std``, ``Resize.size/.interpolation/.max_size/.antialias``, ``CenterCrop.size``,
``ConvertImageDtype.dtype``, ``v2.ToDtype.dtype/.scale``, ``Compose.transforms``). A class with a
known name but without those attributes, a ``Lambda``, a random augmentation or any other callable is
refused: it cannot be written down as data, and pickling it would ship code. ``nn.Sequential``, lists
and tuples are chains like ``Compose``; an object with a ``.transform`` attribute (a Dataset) is read
through it. The parity check then runs the user's own object on the same raw samples as the recorded
spec, so a transform whose behaviour differs from its recorded reading is caught there.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError
from torchscalpel.runtime.transform_snapshot import ATTRS
from torchscalpel.ship.preprocess import check_spec

_RANDOM_PREFIXES = ("Random", "ColorJitter", "AutoAugment", "RandAugment", "TrivialAugment", "AugMix")


def _refuse(obj: Any, index: int, why: str) -> UsageError:
    name = type(obj).__name__
    return UsageError(
        f"The transform {name} (step {index} of the chain) {why}; it cannot be recorded as data "
        "(transforms are never pickled): use Normalize/Resize/CenterCrop/ToTensor/ConvertImageDtype, "
        "or declare the steps with --preprocess JSON."
    )


def _dtype_name(value: Any) -> str | None:
    text = str(value).removeprefix("torch.")
    return text if text in ("float16", "float32", "float64") else None


def _interpolation(value: Any) -> str | None:
    text = getattr(value, "value", value)
    if isinstance(text, int) and not isinstance(text, bool):
        text = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}.get(text)
    return text if isinstance(text, str) else None


def _sizes(value: Any) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value) and len(value) in (1, 2):
        return list(value)
    return None


def _floats(value: Any) -> list[float] | None:
    try:
        flat = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    return [float(v) for v in flat] if flat.size else None


def _step(obj: Any, index: int) -> list[dict[str, Any]]:
    """The spec steps of one transform object (a chain gives several)."""
    name = type(obj).__name__
    if name == "Compose" and isinstance(getattr(obj, "transforms", None), (list, tuple)):
        return _chain(list(obj.transforms))
    if name == "Sequential" and hasattr(obj, "children"):
        return _chain(list(obj.children()))
    if name == "Identity":
        return []
    if name.startswith(_RANDOM_PREFIXES):
        raise _refuse(
            obj, index, "is a random augmentation (pass the evaluation transform, not the training one)"
        )
    if name == "Lambda" or inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        inner = getattr(getattr(obj, "lambd", None), "__qualname__", "")
        label = getattr(obj, "__qualname__", None) or (f"Lambda({inner})" if inner else "")
        raise UsageError(
            f"The transform {label or name} (step {index} of the chain) is Python code; it cannot be recorded as "
            "data (transforms are never pickled): replace it with known transforms, or declare the steps "
            "with --preprocess JSON."
        )
    if name == "ToTensor":
        return [{"op": "to_tensor"}]
    if name in ("PILToTensor", "ToImage"):  # v2.ToImage: HWC image to a CHW tensor, dtype kept
        return [{"op": "pil_to_tensor"}]
    if name == "Normalize" and hasattr(obj, "mean") and hasattr(obj, "std"):
        mean, std = _floats(obj.mean), _floats(obj.std)
        if mean is None or std is None:
            raise _refuse(obj, index, "has a mean or std that is not a list of numbers")
        return [{"op": "normalize", "mean": mean, "std": std}]
    if name in ("ConvertImageDtype", "ToDtype") and hasattr(obj, "dtype"):
        target = obj.dtype
        if isinstance(target, dict):  # v2.ToDtype({tv_tensors.Image: torch.float32, ...})
            target = next((v for k, v in target.items() if "Image" in getattr(k, "__name__", str(k))), None)
        dtype = _dtype_name(target)
        if dtype is None:
            raise _refuse(obj, index, f"converts to {str(obj.dtype)[:40]}, not a float dtype")
        return [{"op": "convert_dtype", "dtype": dtype, "scale": bool(getattr(obj, "scale", True))}]
    if name == "Resize" and hasattr(obj, "size") and hasattr(obj, "interpolation"):
        size, interp = _sizes(obj.size), _interpolation(obj.interpolation)
        if size is None or interp is None:
            raise _refuse(obj, index, "has a size or interpolation that is not plain numbers and a mode name")
        antialias = getattr(obj, "antialias", True)
        return [
            {
                "op": "resize",
                "size": size,
                "interpolation": interp,
                "antialias": True if antialias is None else bool(antialias),
                "max_size": getattr(obj, "max_size", None),
            }
        ]
    if name == "CenterCrop" and hasattr(obj, "size"):
        size = _sizes(obj.size)
        if size is None:
            raise _refuse(obj, index, "has a size that is not one or two whole numbers")
        return [{"op": "center_crop", "size": size}]
    raise _refuse(obj, index, "is not a transform torchscalpel knows")


def _chain(items: list[Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        steps.extend(_step(item, i))
    return steps


def recognise(obj: Any, *, source: str, input_name: str, example_shape: tuple[int, ...]) -> dict[str, Any]:
    """The spec for a transform object (or a Dataset holding one in ``.transform``), checked.

    ``example_shape`` is the model input's example (batch first): it gives the raw sample's channels
    and, when no step resizes or crops, its fixed size.
    """
    if not _looks_known(obj) and hasattr(obj, "transform") and obj.transform is not None:
        obj = obj.transform
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    steps = _chain(items)
    if not steps:
        raise UsageError(f"The transform {source} does nothing to the input; drop --transform.")
    tensor_at = next((i for i, s in enumerate(steps) if s["op"] in ("to_tensor", "pil_to_tensor")), None)
    shape = example_shape[1:]
    channels = shape[0] if len(shape) == 3 else None
    sized = any(s["op"] in ("resize", "center_crop") for s in steps)
    size = [shape[-2], shape[-1]] if len(shape) >= 2 and not sized else None
    scaled = any(s["op"] == "convert_dtype" and s["scale"] for s in steps)
    raw_dtype = "uint8" if tensor_at is not None or scaled else "float32"
    names = ", ".join(type(i).__name__ for i in _flat(items))
    spec = {
        "input": input_name,
        "raw": {
            "dtype": raw_dtype,
            "layout": "HWC" if tensor_at is not None else "CHW",
            "channels": channels,
            "size": size,
        },
        "steps": steps,
        "source": f"{names} from {source}",
    }
    return check_spec(spec)


def _looks_known(obj: Any) -> bool:
    """A transform or chain itself (callable, or a list of transforms), not a Dataset holding one."""
    return callable(obj) or isinstance(obj, (list, tuple))


def _flat(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        inner = getattr(item, "transforms", None) if type(item).__name__ == "Compose" else None
        out.extend(_flat(list(inner)) if isinstance(inner, (list, tuple)) else [item])
    return out


def load_transform(ref: str) -> tuple[Any, str]:
    """``MODULE:NAME`` -> the transform object (a zero-argument function or class is called, e.g. one returning
    the evaluation Dataset, whose ``.transform`` is read) and its label."""
    from torchscalpel.loading import load_callable

    try:
        obj: Any = load_callable(ref, flag="--transform")
    except UsageError as exc:
        if "not callable" not in str(exc):
            raise
        # a tokenizers.Tokenizer (not callable) named directly: the loader takes callables only
        raise UsageError(
            f"--transform {ref} names an object that is not callable (a tokenizers.Tokenizer?); name a "
            "zero-argument function that returns it, e.g. 'def make_tokenizer(): return TOKENIZER'."
        ) from None
    if inspect.isfunction(obj) and _required_params(obj):
        raise UsageError(
            f"--transform {ref} is a Python function that takes the input; it cannot be recorded as data "
            "(transforms are never pickled): name a torchvision-style transform object, a function that builds "
            "one without arguments, or declare the steps with --preprocess JSON."
        )
    if inspect.isfunction(obj) or inspect.isclass(obj):
        try:
            obj = obj()
        except TypeError as exc:
            raise UsageError(
                f"--transform {ref}: calling it with no arguments failed ({exc}); name the transform object, or a "
                "function that builds it without arguments."
            ) from None
    return obj, ref


def _required_params(fn: Any) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        1 for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def training_batch(obj: Any, spec: dict[str, Any], samples: list[np.ndarray]) -> np.ndarray:
    """The user's own transform on each raw sample, as their Dataset applied it, stacked (the parity reference).

    Images reach it as PIL images when a step works on images before ``to_tensor`` (as an image
    Dataset hands them over), as HWC arrays otherwise; tensors as ``torch.Tensor``.
    """
    import torch

    if not _looks_known(obj) and hasattr(obj, "transform") and obj.transform is not None:
        obj = obj.transform
    fn = _as_callable(obj)
    pil = spec["raw"]["layout"] == "HWC" and spec["steps"][0]["op"] in ("resize", "center_crop")
    outs = []
    for sample in samples:
        if pil:
            from PIL import Image

            value: Any = Image.fromarray(
                sample[:, :, 0] if sample.ndim == 3 and sample.shape[2] == 1 else sample
            )
        elif spec["raw"]["layout"] == "HWC":
            value = sample
        else:
            value = torch.from_numpy(np.ascontiguousarray(sample))
        try:
            out = fn(value)
        except Exception as exc:  # the user's transform on a raw sample: say which, with its first line
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise UsageError(
                f"The training transform failed on a raw sample of shape {sample.shape} ({first}); give real raw "
                "samples with --raw-example."
            ) from None
        arr = out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
        outs.append(arr)
    return np.stack(outs)


def _as_callable(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        chain = [_as_callable(o) for o in obj]

        def run(x: Any) -> Any:
            for fn in chain:
                x = fn(x)
            return x

        return run
    return obj


class _Recorded:
    """A transform read back from a run record: its class name and plain attributes, nothing callable."""


def _bad_record(source: str, what: str) -> UsageError:
    return UsageError(
        f"The transform recorded in {source} {what}; re-run the script under 'scalpel profile', or pass --transform."
    )


def _plain_ok(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list) and depth < 3 and len(value) <= 64:
        return all(_plain_ok(v, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 3 and len(value) <= 8:
        return all(isinstance(k, str) and _plain_ok(v, depth + 1) for k, v in value.items())
    return False


def _revive(node: Any, source: str, depth: int = 0) -> Any:
    """A recorded node (``{"class", "attrs"}`` or ``{"class": "Compose", "items"}``) as an attribute holder whose
    type is named after the class, checked field by field (the record is data from disk)."""
    if not isinstance(node, dict) or depth > 4:
        raise _bad_record(source, "is not a transform snapshot")
    cls = node.get("class")
    if not isinstance(cls, str) or not cls.isidentifier() or len(cls) > 80:
        raise _bad_record(source, f"names the class {str(cls)[:40]!r}, not a class name")
    if cls == "function":
        name = node.get("name")
        raise UsageError(
            f"The transform {str(name)[:80] if isinstance(name, str) else 'function'} recorded in {source} is Python "
            "code; it cannot be recorded as data (transforms are never pickled): replace it with known transforms, "
            "or declare the steps with --preprocess JSON."
        )
    obj = type(cls, (_Recorded,), {})()
    if cls == "Compose":
        items = node.get("items")
        if not isinstance(items, list) or len(items) > 32:
            raise _bad_record(source, "has a chain that is not a list of up to 32 steps")
        obj.transforms = [_revive(i, source, depth + 1) for i in items]
        return obj
    attrs = node.get("attrs", {})
    if not isinstance(attrs, dict) or set(attrs) - set(ATTRS) or not _plain_ok(attrs):
        raise _bad_record(source, f"has attributes of {cls} that are not plain numbers and names")
    for key, value in attrs.items():
        setattr(obj, key, value)
    if cls == "Lambda":
        name = node.get("name")
        obj.lambd = type("lambd", (), {"__qualname__": name if isinstance(name, str) else "lambda"})
    return obj


def from_record(ref: str) -> tuple[Any, str]:
    """``RUN[:N]`` (a run folder or its run.json; N picks the DataLoader, in the order the script iterated
    them) -> the recorded transform, revived as data, and its label. Without N, the first loader whose
    transform has no random step (the evaluation transform, when both were iterated)."""
    from pathlib import Path

    from torchscalpel.record import load_record

    path_text, sep, index_text = ref.rpartition(":")
    if not sep or not index_text.isdigit():
        path_text, index_text = ref, ""
    where = Path(path_text)
    if not (where / "run.json" if where.is_dir() else where).is_file():
        raise UsageError(
            f"--transform-from {ref}: there is no run record at {where}; pass the run folder of a 'scalpel "
            "profile/doctor/run' of the training script, or its run.json."
        )
    record = load_record(where)
    loaders = ((record.provenance or {}).get("seeds") or {}).get("loaders") or []
    found = [
        (i, e["transform"])
        for i, e in enumerate(loaders)
        if isinstance(e, dict) and isinstance(e.get("transform"), dict)
    ]
    if not found:
        raise UsageError(
            f"The run record {path_text} holds no dataset transform (no DataLoader with a dataset.transform was "
            "iterated, or it was recorded by an older torchscalpel); pass --transform MODULE:NAME instead."
        )
    if index_text:
        want = int(index_text)
        match = [t for i, t in found if i == want]
        if not match:
            raise UsageError(
                f"--transform-from {ref}: DataLoader {want} has no recorded transform; the record has one for "
                f"{', '.join(str(i) for i, _ in found)}."
            )
        picked = match[0]
    else:
        picked = next((t for _, t in found if not _has_random(t.get("transform"))), found[0][1])
    label = f"{path_text} (DataLoader over {str(picked.get('dataset', 'a dataset'))[:60]})"
    return _revive(picked.get("transform"), label), label


def _has_random(node: Any, depth: int = 0) -> bool:
    if not isinstance(node, dict) or depth > 4:
        return False
    if str(node.get("class", "")).startswith(_RANDOM_PREFIXES):
        return True
    items = node.get("items")
    return isinstance(items, list) and any(_has_random(i, depth + 1) for i in items)
