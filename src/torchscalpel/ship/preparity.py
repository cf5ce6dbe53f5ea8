"""The training pipeline against the served bundle: same raw samples, the user's transform + eager model on
one side, the recorded spec + each exported form on the other.

This is what catches the train/deploy mismatch: a served model that does not see what the trained
model saw (a normalisation forgotten, a resize done differently) fails here at export, not in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError
from torchscalpel.ship.parity import ParityCheck, compare
from torchscalpel.ship.preprocess import PreprocessError, Preprocessor, check_spec, is_spec
from torchscalpel.ship.runners import Runner
from torchscalpel.ship.textprep import (
    HF_FILE,
    VOCAB_FILE,
    TextPreprocessor,
    check_text_spec,
    is_text_spec,
    looks_like_tokenizer,
    recognise_tokenizer,
    training_tokens,
)

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
    files: dict[str, bytes] = field(default_factory=dict)
    """Files the spec needs inside the bundle (a text spec's tokenizer.json or vocab.txt), by name."""
    reference: str | None = None
    """What the parity check's training side is when there is no transform object (a run record's steps)."""
    limit: int | None = None
    """A recognised tokenizer's own length limit (truncation or ``model_max_length``), if it sets one."""

    @property
    def text(self) -> bool:
        """True for tokenizer-style preprocessing (``ship.textprep``)."""
        return is_text_spec(self.spec)


def resolve(
    *,
    transform: str | None,
    preprocess: Any,
    in_names: list[str],
    shapes: dict[str, tuple[int, ...]],
    dynamic_dims: frozenset[int] = frozenset(),
    transform_from: str | None = None,
) -> Preprocessing:
    """--transform (recognised from the object) or --preprocess (a declared spec, or metadata).

    ``dynamic_dims`` are the positions ``--dynamic`` names: a tokenizer pads to the longest sample when
    dimension 1 (the sequence) is among them, to the example's length otherwise.
    """
    if transform_from is not None:
        from torchscalpel.ship.transforms import from_record, recognise

        if transform is not None or preprocess is not None:
            raise UsageError(
                "--transform-from reads the preprocessing from the run; drop --transform/--preprocess."
            )
        recorded, label = from_record(transform_from)
        name = in_names[0]
        spec = recognise(recorded, source=label, input_name=name, example_shape=shapes[name])
        return Preprocessing(manifest=spec, spec=spec, reference=f"the steps recorded in {label}")
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
        if looks_like_tokenizer(obj):
            shape = shapes[name]
            if len(shape) != 2:
                raise UsageError(
                    f"--transform {transform!r} is a tokenizer, but input {name!r} has shape {shape}, not "
                    "(batch, sequence)."
                )
            mask = next((n for n in in_names if n != name and "mask" in n.lower()), None)
            spec, files, limit = recognise_tokenizer(
                obj, source=label, input_name=name, mask=mask, seq=shape[1], dynamic_seq=1 in dynamic_dims
            )
            return Preprocessing(manifest=spec, spec=spec, transform=obj, files=files, limit=limit)
        spec = recognise(obj, source=label, input_name=name, example_shape=shapes[name])
        return Preprocessing(manifest=spec, spec=spec, transform=obj)
    if is_text_spec(preprocess):
        return _declared_text(preprocess, in_names)
    if is_spec(preprocess):
        spec = check_spec(preprocess, in_names)
        return Preprocessing(manifest=spec, spec=spec)
    return Preprocessing(manifest=preprocess)


def bound_text(pre: Preprocessing, seq_max: int) -> None:
    """Once the ``seq`` axis's bound is known: a recognised tokenizer pads to the longest sample and truncates
    at its own limit within the bound; a declared spec's ``max_length`` must fit the bound."""
    spec = pre.spec
    if spec is None or not pre.text or spec["padding"] != "longest":
        return
    if pre.transform is not None:
        from torchscalpel.ship.textprep import bounded

        pre.spec = pre.manifest = bounded(spec, pre.limit, seq_max)
    elif spec["max_length"] > seq_max:
        raise UsageError(
            f"text preprocessing: max_length {spec['max_length']} is beyond the seq axis's bound {seq_max}; "
            f"lower it, or export with --dynamic batch,seq:{spec['max_length']}."
        )


def check_fixed_text(pre: Preprocessing, seq: int) -> None:
    """A fixed sequence length: the tokenizer pads every text to exactly it."""
    spec = pre.spec
    if spec is None:
        return
    if spec["padding"] != "max_length" or spec["max_length"] != seq:
        raise UsageError(
            f"text preprocessing pads to {spec['padding']} (max_length {spec['max_length']}) but the model's "
            f'sequence is fixed at {seq}; declare "padding": "max_length", "max_length": {seq}, or export '
            "with --dynamic batch,seq."
        )


def _declared_text(preprocess: dict[str, Any], in_names: list[str]) -> Preprocessing:
    """A declared text spec: its ``tokenizer.file`` is a path here, copied into the bundle under a plain name."""
    tok = preprocess.get("tokenizer")
    if not isinstance(tok, dict) or not isinstance(tok.get("file"), str):
        raise UsageError(
            "text preprocessing: 'tokenizer' needs a 'file' (a tokenizer.json or a vocabulary, one token per line)."
        )
    path = Path(tok["file"])
    if not path.is_file():
        raise UsageError(f"text preprocessing: the tokenizer file {path} does not exist.")
    name = HF_FILE if tok.get("type") == "hf" else VOCAB_FILE
    spec = check_text_spec({**preprocess, "tokenizer": {**tok, "file": name}}, in_names)
    return Preprocessing(manifest=spec, spec=spec, files={name: path.read_bytes()})


def run_text_parity(
    pre: Preprocessing,
    texts: list[str],
    folder: Path,
    model_inputs: list[str],
    others: dict[str, np.ndarray],
    eager: Runner,
    runners: list[Runner],
    out_names: list[str],
    override: tuple[float | None, float | None],
) -> tuple[list[ParityCheck], dict[str, Any]]:
    """The user's tokenizer + eager vs the bundle's tokenizer files + each export, on the same raw texts.

    The token ids and masks must be equal (integers); then the outputs are compared as any parity check.
    """
    assert pre.spec is not None
    spec = pre.spec
    try:
        served = TextPreprocessor(spec, folder).apply_batch(texts)
    except PreprocessError as exc:
        raise UsageError(f"The raw parity texts do not fit the preprocessing ({exc}).") from None
    if pre.transform is not None:
        try:
            trained = training_tokens(pre.transform, spec, texts)
        except Exception as exc:  # the user's tokenizer on the raw texts: say so, with its first line
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise UsageError(f"The training tokenizer failed on the raw parity texts ({first}).") from None
        reference = "the training tokenizer"
    else:
        trained, reference = served, "the declared tokenizer (no training tokenizer given)"
    same = all(
        trained[k].shape == served[k].shape and bool(np.array_equal(trained[k], served[k])) for k in served
    )
    summary: dict[str, Any] = {
        "samples": len(texts),
        "reference": reference,
        "tokens_equal": same,
        "lengths": [int(v) for v in served[spec["mask"]].sum(axis=1)] if spec["mask"] else None,
        "width": int(served[spec["input"]].shape[1]),
    }
    if not same:
        shapes = {k: (trained[k].shape, served[k].shape) for k in served}
        return [
            ParityCheck(
                format="tokenize",
                batch=len(texts),
                output="*",
                max_abs=float("inf"),
                max_rel=float("inf"),
                atol=0.0,
                rtol=0.0,
                passed=False,
                note=f"token ids differ from the training tokenizer's (training vs bundle shapes {shapes})",
            )
        ], summary

    def feed(fed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [fed[n].astype(others[n].dtype, copy=False) if n in fed else others[n] for n in model_inputs]

    want = eager(feed(trained))
    checks: list[ParityCheck] = []
    for runner in runners:
        try:
            got = runner(feed(served))
        except Exception as exc:  # a form that cannot take the tokenized batch fails parity, with the reason
            checks.append(ParityCheck.failed_to_run(f"{runner.name}+pre", len(texts), exc))
            continue
        found = compare(f"{runner.name}+pre", len(texts), out_names, want, got, override)
        for c in found:
            c.sizes = f"seq={summary['width']}"
        checks.extend(found)
    return checks, summary


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
        trained, reference = served, pre.reference or "the declared steps (no training transform given)"
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
            checks.append(ParityCheck.failed_to_run(f"{runner.name}+pre", len(samples), exc))
            continue
        checks.extend(compare(f"{runner.name}+pre", len(samples), out_names, want, got, override))
    return checks, summary
