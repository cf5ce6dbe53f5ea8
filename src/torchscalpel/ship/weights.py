"""Trained weights into the user's model: safetensors, plain state_dict files, DCP folders.

Loading is safe by default: safetensors, or ``torch.load(weights_only=True)``; a file that needs
full unpickling loads only with ``trust=True``. Training wrappers leave prefixes in the keys
(``module.`` from DDP, ``_orig_mod.`` from torch.compile, ``_fsdp_wrapped_module.`` and
``_checkpoint_wrapped_module.`` from FSDP1 and activation checkpointing); they are stripped and
the mapping is reported. Missing, unexpected or mis-shaped keys are an error that lists them.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchscalpel.errors import ScalpelError, UsageError

WRAPPER_PARTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
"""Path components that only wrappers add: removed wherever they appear in a key."""
LEADING_PREFIXES = ("module.",)
"""Prefixes removed only at the start of a key, and only when the model itself has no such key."""
NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "net")
"""Keys under which training checkpoints commonly keep the model's state_dict."""
MAX_ABS_WEIGHT = 1e10
"""Largest magnitude a loaded floating-point value may have without ``allow_nonfinite``. No trained weight
or buffer nears it (attention masks use -1e9 at most, or -inf, which needs the flag anyway), while a flipped
high exponent bit in a float32 turns a weight of 0.05 into ~1.7e37."""


@dataclass(kw_only=True, slots=True)
class LoadedWeights:
    """The state_dict ready for ``load_state_dict`` and how it was obtained."""

    state_dict: dict[str, torch.Tensor]
    source: str
    """``safetensors``, ``state_dict`` or ``dcp:<folder>`` (the DCP folder read)."""
    nested_key: str | None = None
    """The key the model's weights were found under (e.g. ``model``), if nested."""
    stripped: dict[str, int] = field(default_factory=dict)
    """Prefix removed -> number of keys it was removed from."""
    notes: list[str] = field(default_factory=list)
    """What the reader decided on the way (e.g. a newer step passed over because it does not verify)."""
    source_verified: bool = False
    """True when the files were checked against a torchscalpel checkpoint's manifest (SHA-256 of each)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        return {
            "source": self.source,
            "source_verified": self.source_verified,
            "nested_key": self.nested_key,
            "stripped_prefixes": dict(self.stripped),
        }


def read_checkpoint(
    path: Path, *, trust: bool = False, notes: list[str] | None = None, sign_key: Path | None = None
) -> tuple[dict[str, Any], str, bool]:
    """Read a checkpoint into a (possibly nested) dict and say which kind it was.

    A torchscalpel checkpoint (``step-N`` with ``MANIFEST.json`` and ``COMMIT``) is verified against
    its manifest before any of its files is parsed, by the same check ``Checkpointer.load`` runs; a
    checkpoint root gives its newest verified step (what was passed over is appended to ``notes``).
    The third value says whether the files were verified against such a manifest.
    """
    if not path.exists():
        raise UsageError(f"--weights {path} does not exist; check the path.")
    if path.is_dir():
        notes = notes if notes is not None else []
        path, verified = _dcp_folder(path, notes, sign_key)
        if not verified:
            notes.append(
                f"{path} is a plain DCP folder with no manifest: its files were not verified against hashes "
                "(a flipped bit would go unnoticed); save with torchscalpel.distributed.Checkpointer to have "
                "them checked"
            )
        return _read_dcp(path), f"dcp:{path.name}", verified
    if sign_key is not None:
        raise UsageError(
            f"--sign-key checks a torchscalpel checkpoint's signed manifest; {path} is a single file "
            "with none, so drop --sign-key or point --weights at the checkpoint folder."
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path))), "safetensors", False
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ScalpelError(f"Cannot read {path} as safetensors ({exc}).") from None
    return _torch_load(path, trust=trust), "state_dict", False


def _dcp_folder(path: Path, notes: list[str], sign_key: Path | None = None) -> tuple[Path, bool]:
    """The DCP folder to read for ``--weights path``, verified when it carries a manifest (then True)."""
    from torchscalpel.distributed import manifest

    key = manifest.read_key(sign_key) if sign_key is not None else None
    has_manifest = (path / manifest.COMMIT).exists() or (path / manifest.MANIFEST).exists()
    if has_manifest:
        manifest.verify(path, action="export", key=key)
        return path, True
    if (path / ".metadata").exists():
        if key is not None:
            raise ScalpelError(
                f"{path} is a plain DCP folder with no signed manifest, and a signing key was given; "
                "refusing to export it."
            )
        return path, False  # a plain DCP folder (no manifest to check); its metadata is still read safely
    return latest_committed_step(path, notes, key), True


def latest_committed_step(root: Path, notes: list[str] | None = None, key: bytes | None = None) -> Path:
    """The newest ``step-N`` folder of a torchscalpel checkpoint root whose files match its manifest.

    torchscalpel.distributed.Checkpointer writes ``step-N/`` (DCP files plus ``MANIFEST.json`` and
    ``COMMIT``); a folder without ``COMMIT`` is an interrupted save and is never picked, nor is one
    whose files differ from the manifest (each newer step passed over gets a line in ``notes``).
    """
    from torchscalpel.distributed import manifest

    steps = manifest.committed_steps(root)
    if not steps:
        raise UsageError(
            f"--weights folder {root} is neither a torch.distributed.checkpoint folder (no .metadata) nor a "
            "torchscalpel checkpoint root (no step-N folders); point it at a checkpoint or a weights file."
        )
    chosen, skipped = manifest.newest_verified(root, key)
    if chosen is None:
        raise ScalpelError(
            f"{root} holds no checkpoint that verifies against its manifest (newest: {skipped[0]}); "
            "point --weights at a step folder explicitly if you accept an interrupted save."
        )
    if notes is not None and skipped:
        notes.extend(f"skipped {line}" for line in skipped)
        notes.append(f"exporting {chosen.name}, the newest step whose files match its manifest")
    return chosen


def _torch_load(path: Path, *, trust: bool) -> dict[str, Any]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        first = str(exc).splitlines()[0]
        # torch says "Weights only load failed" for both; only a pickle that names a class or function
        # ("Unsupported global", "was not an allowed global") would load with --trust. Text and other
        # files that are not pickles fail on an opcode ("Unsupported operand 119").
        if not trust and "global" in str(exc):
            raise ScalpelError(
                f"{path} holds pickled objects beyond tensors, which can run code ({first}); "
                "re-save only model.state_dict(), or pass --trust if you trust where the file came from."
            ) from None
        # not a pickle at all (text, a truncated or foreign file): --trust would not help
        raise ScalpelError(
            f"Cannot read {path} as a torch state_dict file (it is not a file torch.save wrote); give a "
            ".pt/.pth written by torch.save, a .safetensors file or a DCP checkpoint folder."
        ) from None
    except Exception as exc:  # corrupt files surface as struct.error, EOFError, RuntimeError...
        raise ScalpelError(
            f"Cannot read {path} as a torch state_dict file ({str(exc).splitlines()[0]})."
        ) from None
    if isinstance(obj, torch.nn.Module):
        return dict(obj.state_dict())
    if not isinstance(obj, dict):
        raise ScalpelError(f"{path} holds a {type(obj).__name__}, not a state_dict; save model.state_dict().")
    return obj


def _read_dcp(path: Path) -> dict[str, Any]:
    from torchscalpel.distributed.manifest import CheckpointError
    from torchscalpel.distributed.safedcp import load_all

    try:
        return load_all(path)
    except CheckpointError:
        raise
    except Exception as exc:  # DCP raises CheckpointException and friends with long messages
        raise ScalpelError(
            f"Cannot consolidate the DCP checkpoint in {path} ({str(exc).splitlines()[0]})."
        ) from None


def _find_state_dict(obj: dict[str, Any]) -> tuple[dict[str, torch.Tensor], str | None]:
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    for key in NESTED_KEYS:
        inner = obj.get(key)
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            return inner, key
        if isinstance(inner, dict) and inner:
            found, sub = _find_state_dict(inner)
            return found, f"{key}.{sub}" if sub else key
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if tensors:
        return tensors, None
    raise ScalpelError(
        f"No model weights found in the checkpoint (top-level keys: {', '.join(list(obj)[:10])}); "
        f"save model.state_dict() or nest it under one of {', '.join(NESTED_KEYS)}."
    )


def strip_prefixes(
    state_dict: dict[str, torch.Tensor], model_keys: set[str]
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Remove wrapper prefixes from keys; return the new dict and prefix -> count removed."""
    counts: Counter[str] = Counter()
    out: dict[str, torch.Tensor] = {}
    model_has_leading = {p for p in LEADING_PREFIXES if any(k.startswith(p) for k in model_keys)}
    for key, value in state_dict.items():
        new = key
        for part in WRAPPER_PARTS:
            if part in new:
                counts[part] += 1
                new = new.replace(part, "")
        for prefix in LEADING_PREFIXES:
            if prefix in model_has_leading:
                continue
            while new.startswith(prefix) and new not in model_keys:
                counts[prefix] += 1
                new = new[len(prefix) :]
        out[new] = value
    return out, dict(counts)


def check_values(state: dict[str, Any], path: Path) -> None:
    """Refuse (one sentence) a state_dict with NaN, infinity or a magnitude over :data:`MAX_ABS_WEIGHT`."""
    bad: list[tuple[float, str]] = []
    for key, value in state.items():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        data = value.detach()
        if data.dtype not in (torch.float32, torch.float64):
            data = data.float()
        finite = torch.isfinite(data)
        worst = float("inf") if not bool(finite.all()) else float(data.abs().max())
        if worst > MAX_ABS_WEIGHT:
            bad.append((worst, key))
    if bad:
        worst, key = max(bad)
        what = "NaN or infinity" if worst == float("inf") else f"a value of magnitude {worst:.3g}"
        raise ScalpelError(
            f"The weights in {path} are corrupt or not trained weights: {len(bad)} tensor(s) hold NaN, infinity "
            f"or magnitudes over {MAX_ABS_WEIGHT:g} ({key!r} holds {what}); pass --allow-nonfinite if they "
            "are meant to be there."
        )


def load_weights(
    model: torch.nn.Module,
    path: Path,
    *,
    trust: bool = False,
    sign_key: Path | None = None,
    allow_nonfinite: bool = False,
) -> LoadedWeights:
    """Load ``path`` into ``model`` strictly; raise listing every missing/unexpected/mis-shaped key.

    Values are checked too (:func:`check_values`) unless ``allow_nonfinite``.
    """
    notes: list[str] = []
    raw, source, verified = read_checkpoint(path, trust=trust, notes=notes, sign_key=sign_key)
    found, nested = _find_state_dict(raw)
    expected = model.state_dict()
    state, stripped = strip_prefixes(found, set(expected))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(state) & set(expected)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {_few(unexpected)}")
        if shapes:
            parts.append(f"wrong shape {len(shapes)}: {_few(shapes)}")
        raise ScalpelError(
            f"The weights in {path} do not fit the model ({'; '.join(parts)}); "
            "check --model and --factory-args build the same architecture that was trained."
        )
    if not allow_nonfinite:
        check_values(state, path)
    model.load_state_dict(state, strict=True)
    return LoadedWeights(
        state_dict=state,
        source=source,
        nested_key=nested,
        stripped=stripped,
        notes=notes,
        source_verified=verified,
    )


def _few(items: list[str], limit: int = 8) -> str:
    more = f", ... (+{len(items) - limit})" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
