"""The training pipeline against the served bundle: same raw samples, the user's transform + eager model on
one side, the recorded spec + each exported form on the other.

This is what catches the train/deploy mismatch: a served model that does not see what the trained
model saw (a normalisation forgotten, a resize done differently) fails here at export, not in production.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError
from torchscalpel.ship.parity import ParityCheck, compare
from torchscalpel.ship.preprocess import PreprocessError, Preprocessor, check_spec, is_spec
from torchscalpel.ship.runners import Runner

RAW_SAMPLES = 8
"""Raw samples made when no --raw-example is given."""


@dataclass(kw_only=True, slots=True)
class Preprocessing:
    """What export records in ``manifest["preprocessing"]`` and what parity runs."""

    manifest: dict[str, Any] | None
    """The spec (applied by serve) or the user's free-form metadata (shown, not applied), or None."""
    spec: dict[str, Any] | None = None
    """The checked spec when there is one."""
    transform: Any = None
    """The user's own transform object (the parity reference), when it came from --transform."""


def resolve(
    *, transform: str | None, preprocess: Any, in_names: list[str], shapes: dict[str, tuple[int, ...]]
) -> Preprocessing:
    """--transform (recognised from the object) or --preprocess (a declared spec, or metadata)."""
    if transform is not None:
        from torchscalpel.ship.transforms import load_transform, recognise

        name, sep, ref = transform.partition("=")
        if not sep or ":" in name:
            name, ref = in_names[0], transform
        if name not in in_names:
            raise UsageError(
                f"--transform {transform!r} names input {name!r}; the model takes {', '.join(in_names)}."
            )
        if preprocess is not None:
            raise UsageError("--transform records the preprocessing itself; drop --preprocess.")
        obj, label = load_transform(ref)
        spec = recognise(obj, source=label, input_name=name, example_shape=shapes[name])
        return Preprocessing(manifest=spec, spec=spec, transform=obj)
    if is_spec(preprocess):
        spec = check_spec(preprocess, in_names)
        return Preprocessing(manifest=spec, spec=spec)
    return Preprocessing(manifest=preprocess)


def raw_samples(
    spec: dict[str, Any], path: Path | None, example_shape: tuple[int, ...], seed: int
) -> list[np.ndarray]:
    """Raw samples for the parity run: the rows of ``path`` (a plain .npy), or random ones the spec accepts."""
    if path is not None:
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise UsageError(f"Cannot read --raw-example {path} as a plain .npy array ({exc}).") from None
        if arr.ndim < 3 or arr.shape[0] < 1:
            raise UsageError(
                f"--raw-example {path} has shape {arr.shape}; it needs a first dimension of samples, e.g. (N, H, W, C)."
            )
        return [arr[i] for i in range(min(arr.shape[0], 64))]
    raw = spec["raw"]
    rng = np.random.default_rng(seed)
    per = example_shape[1:]
    if raw["size"] is not None:
        h, w = raw["size"]
    else:  # any size is resized or cropped: use one the model input is not, so the steps do work
        h, w = (per[-2] * 3 // 2 + 1, per[-1] * 5 // 4 + 3) if len(per) >= 2 else (17, 23)
    chans = raw["channels"] or (per[0] if len(per) == 3 else 3)
    shape = (h, w, chans) if raw["layout"] == "HWC" else (chans, h, w)
    if raw["dtype"] == "uint8":
        return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(RAW_SAMPLES)]
    if np.dtype(raw["dtype"]).kind in "iu":
        return [rng.integers(0, 100, shape).astype(raw["dtype"]) for _ in range(RAW_SAMPLES)]
    return [rng.random(shape).astype(raw["dtype"]) for _ in range(RAW_SAMPLES)]


def run_preprocess_parity(
    pre: Preprocessing,
    samples: list[np.ndarray],
    model_inputs: list[str],
    others: dict[str, np.ndarray],
    eager: Runner,
    runners: list[Runner],
    out_names: list[str],
    override: tuple[float | None, float | None],
    input_dtype: np.dtype,
) -> tuple[list[ParityCheck], dict[str, Any]]:
    """Training transform + eager vs recorded spec + each export, on the same raw samples.

    ``others`` holds the batch of every model input the spec does not feed. Returns the checks and a
    summary for the manifest (how far the two preprocessed tensors are apart).
    """
    assert pre.spec is not None
    spec = pre.spec
    try:
        served = Preprocessor(spec).apply_batch(samples)
    except PreprocessError as exc:
        raise UsageError(f"The raw parity samples do not fit the preprocessing ({exc}).") from None
    if pre.transform is not None:
        from torchscalpel.ship.transforms import training_batch

        trained = training_batch(pre.transform, spec, samples)
        reference = "the training transform"
    else:
        trained, reference = served, "the declared steps (no training transform given)"
    summary: dict[str, Any] = {
        "samples": len(samples),
        "raw_shape": list(samples[0].shape),
        "reference": reference,
    }
    if trained.shape != served.shape:
        summary["input_max_abs"] = None
        note = f"preprocessed shape {served.shape[1:]} vs training {trained.shape[1:]}"
        fail = ParityCheck(
            format="preprocess",
            batch=len(samples),
            output="*",
            max_abs=float("inf"),
            max_rel=float("inf"),
            atol=0.0,
            rtol=0.0,
            passed=False,
            note=note,
        )
        return [fail], summary
    summary["input_max_abs"] = float(np.max(np.abs(trained.astype(np.float64) - served.astype(np.float64))))

    def feed(x: np.ndarray) -> list[np.ndarray]:
        # serve casts the preprocessed batch to the manifest's input dtype; the reference gets the same cast
        return [x.astype(input_dtype, copy=False) if n == spec["input"] else others[n] for n in model_inputs]

    checks: list[ParityCheck] = []
    try:
        want = eager(feed(trained))
    except Exception as exc:  # the model refused what the training transform makes: name the shapes
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise UsageError(
            f"The model fails on the training transform's output of shape {trained.shape[1:]} ({first}); check "
            "--example against what the transform makes."
        ) from None
    for runner in runners:
        try:
            got = runner(feed(served))
        except (
            Exception
        ) as exc:  # a form that cannot take the preprocessed batch fails parity, with the reason
            checks.append(
                ParityCheck(
                    format=f"{runner.name}+pre",
                    batch=len(samples),
                    output="*",
                    max_abs=float("inf"),
                    max_rel=float("inf"),
                    atol=0.0,
                    rtol=0.0,
                    passed=False,
                    note=f"failed to run: {str(exc).splitlines()[0][:200]}",
                )
            )
            continue
        checks.extend(compare(f"{runner.name}+pre", len(samples), out_names, want, got, override))
    return checks, summary
