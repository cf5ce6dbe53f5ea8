"""The bundle: a folder with the weights, the exported files and ``manifest.json``.

The manifest carries a ``format_version`` (``MAJOR.MINOR``; readers reject a newer major), the
model's input and output names, shapes (``null`` for dynamic dims), dtypes, dynamic dims, optional
preprocessing metadata, the parity figures, latency, and the SHA-256 of every file, which
:func:`verify_bundle` checks before anything is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.errors import RecordVersionError, ScalpelError, UsageError
from torchscalpel.fileio import atomic_write_text, sha256_file

MANIFEST = "manifest.json"
FORMAT = "torchscalpel-bundle"
FORMAT_VERSION = "1.0"
ARTIFACT_FILES = {
    "weights": "model.safetensors",
    "onnx": "model.onnx",
    "onnx_int8": "model.int8.onnx",
    "exported": "model.pt2",
    "torchscript": "model.torchscript.pt",
}
"""Artifact kind -> file name inside the bundle."""
CODE_ARTIFACTS = ("exported", "torchscript")
"""Artifacts that unpickle code when loaded: serve loads them only with ``--trust``."""


def hash_files(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in ``folder`` except the manifest (relative POSIX paths)."""
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` atomically (a crash never leaves half a manifest)."""
    path = folder / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


@dataclass(kw_only=True, slots=True)
class Bundle:
    """A verified bundle: its folder and parsed manifest."""

    path: Path
    manifest: dict[str, Any]

    def file(self, kind: str) -> Path | None:
        """Path of an artifact kind (``onnx``, ``exported``...) if the bundle has it."""
        name = self.manifest.get("artifacts", {}).get(kind)
        return self.path / name if name else None

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Input specs: name, dtype, shape (``None`` for dynamic dims)."""
        return list(self.manifest["inputs"])

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """Output specs: name, dtype, shape."""
        return list(self.manifest["outputs"])

    @property
    def max_batch(self) -> int:
        """Largest batch the export was checked at."""
        return int(self.manifest.get("max_batch", 1))


def read_manifest(folder: Path) -> dict[str, Any]:
    """Parse and version-check ``manifest.json`` (no hashing)."""
    if not folder.is_dir():
        raise UsageError(f"Bundle {folder} is not a folder; pass the --out folder of 'scalpel export'.")
    path = folder / MANIFEST
    if not path.is_file():
        raise UsageError(f"{folder} has no {MANIFEST}; pass a folder written by 'scalpel export'.")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ScalpelError(f"{path} is not valid JSON ({exc}); re-run 'scalpel export'.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ScalpelError(f"{path} is not a torchscalpel bundle manifest; re-run 'scalpel export'.")
    version = str(manifest.get("format_version", "0.0"))
    if int(version.split(".")[0]) > int(FORMAT_VERSION.split(".")[0]):
        raise RecordVersionError(
            f"Bundle format {version} is newer than this torchscalpel reads ({FORMAT_VERSION}); upgrade torchscalpel."
        )
    return manifest


def verify_bundle(folder: Path) -> Bundle:
    """Read the manifest and check every listed file's SHA-256; raise naming each mismatch."""
    manifest = read_manifest(folder)
    files = manifest.get("files") or {}
    problems = []
    for rel, want in files.items():
        target = (folder / rel).resolve()
        if folder.resolve() not in target.parents:
            problems.append(f"{rel} points outside the bundle")
        elif not target.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(target) != want:
            problems.append(f"{rel} has changed")
    for kind, name in (manifest.get("artifacts") or {}).items():
        if name not in files:
            problems.append(f"{kind} file {name} has no hash in the manifest")
    if problems:
        raise ScalpelError(
            f"Bundle {folder} failed verification ({'; '.join(problems)}); re-export it rather than serving modified files."
        )
    if not (manifest.get("parity") or {}).get("passed", False):
        raise ScalpelError(f"Bundle {folder} did not pass its parity check at export; fix the export first.")
    return Bundle(path=folder, manifest=manifest)
