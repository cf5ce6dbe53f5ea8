"""Reproducibility facts for the Run record: which code, data and seeds produced this result.

:class:`ProvenanceObserver` rides along every run (the runtime adds it) and fills
``record.provenance``:

- ``git``: ``commit``, ``branch``, ``dirty`` and ``diff_sha256`` (a hash of ``git diff HEAD``, the
  uncommitted change) of the repository holding the script; absent outside a repository;
- ``code``: ``script`` (``path``, ``sha256``) and ``modules``: every local module the script
  imported (a file under the script's folder or repository, not an installed package), by module
  name -> ``{"path", "sha256"}``;
- ``data``: the first training batch's fingerprint: ``dataset_len``, ``shapes``, ``dtypes`` and a
  ``sha256`` of its tensors' bytes (no batch, no fingerprint);
- ``seeds``: the seeds the script set (``torch.manual_seed``, ``random.seed``, ``numpy.random.seed``,
  in call order), ``torch_initial_seed`` at the end, and per DataLoader its ``num_workers``, whether
  it had a ``generator`` (its ``initial_seed``), a ``worker_init_fn``, and its dataset's ``transform`` as
  plain data (:mod:`torchscalpel.runtime.transform_snapshot`; read by ``scalpel export --transform-from``).

Everything here is best effort: a fact that cannot be read is left out, never the run.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr
from torchscalpel.runtime.transform_snapshot import dataset_transform

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord, StepRecord
    from torchscalpel.runtime.session import Session

GIT_TIMEOUT_S = 5.0
"""A git call that hangs (a network filesystem, a lock) must not hold the record back."""

MAX_HASH_BYTES = 64 << 20
"""Hash at most this much of the first batch (a huge batch is fingerprinted by its first 64 MiB)."""


def file_sha256(path: Path) -> str | None:
    """sha256 of a file's bytes, None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _git(cwd: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(cwd), *args], capture_output=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_facts(folder: Path) -> dict[str, Any]:
    """Commit, branch and uncommitted-diff hash of the repository holding ``folder`` ({} outside one)."""
    # One rev-parse for three facts (each git call costs tens of ms on a loaded machine).
    out = _git(folder, "rev-parse", "--show-toplevel", "HEAD", "--abbrev-ref", "HEAD")
    lines = out.decode().split("\n") if out is not None else []
    if len(lines) < 3:
        return {}
    facts: dict[str, Any] = {"commit": lines[1].strip(), "branch": lines[2].strip(), "root": lines[0].strip()}
    diff = _git(folder, "diff", "HEAD", "--no-color", "--no-ext-diff")
    if diff is not None:
        facts["dirty"] = bool(diff.strip())
        facts["diff_sha256"] = hashlib.sha256(diff).hexdigest()
    return facts


def _installed_roots() -> list[Path]:
    """Folders whose modules are installed packages or the standard library, not the user's code."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        value = sysconfig.get_paths().get(key)
        if value:
            roots.add(Path(value).resolve())
    roots.add(Path(torch.__file__).resolve().parent.parent)
    roots.add(Path(__file__).resolve().parent.parent)  # torchscalpel itself
    return sorted(roots)


def local_modules(root: Path, modules: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Modules in ``sys.modules`` whose file lies under ``root`` and outside installed packages."""
    root = root.resolve()
    installed = _installed_roots()
    found: dict[str, dict[str, Any]] = {}
    for name, module in sorted((modules if modules is not None else dict(sys.modules)).items()):
        file = getattr(module, "__file__", None)
        if not file or name == "__main__":
            continue
        try:
            path = Path(file).resolve()
        except (OSError, ValueError):
            continue
        if path.suffix != ".py" or not path.is_relative_to(root):
            continue
        if any(path.is_relative_to(r) and not root.is_relative_to(r) for r in installed):
            continue
        if "site-packages" in path.parts:
            continue
        digest = file_sha256(path)
        if digest is not None:
            found[name] = {"path": str(path.relative_to(root)), "sha256": digest}
    return found


def _tensors(obj: Any, out: list[torch.Tensor], depth: int = 0) -> None:
    if depth > 4 or len(out) > 64:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _tensors(obj[key], out, depth + 1)
    elif isinstance(obj, list | tuple):
        for item in obj:
            _tensors(item, out, depth + 1)
    elif hasattr(obj, "items") and callable(obj.items):  # BatchEncoding and other Mappings
        try:
            _tensors(dict(obj.items()), out, depth + 1)
        except Exception:
            pass


def batch_fingerprint(batch: Any, loader: Any = None) -> dict[str, Any]:
    """Dataset length, shapes, dtypes and a content hash of a batch's tensors."""
    tensors: list[torch.Tensor] = []
    _tensors(batch, tensors)
    facts: dict[str, Any] = {
        "shapes": [list(t.shape) for t in tensors],
        "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
    }
    try:
        facts["dataset_len"] = len(loader.dataset) if loader is not None else None
    except Exception:
        facts["dataset_len"] = None
    digest, budget = hashlib.sha256(), MAX_HASH_BYTES
    for t in tensors:
        if budget <= 0:
            break
        try:
            data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()[:budget]
        except Exception:
            data = repr(t.detach().cpu().tolist()).encode()[:budget]
        budget -= len(data)
        digest.update(data)
    facts["sha256"] = digest.hexdigest()
    return facts


def torch_seed_state() -> dict[str, Any]:
    """torch's default-generator seed now, and whether a call set it (``set``): torch draws its startup
    seed from 64 random bits, so a seed below 2**32 was set by ``torch.manual_seed`` (a 1 in 4 billion
    chance of a false yes; a seed set to a larger number reads as not set). For an in-process block it is
    read before the block starts: a notebook seeds in an earlier cell, which no wrapped call sees."""
    seed = int(torch.initial_seed())
    return {"torch_initial_seed": seed, "set": seed < 2**32}


class ProvenanceObserver(Observer):
    """Records the code, data and seeds of a run into ``record.provenance`` (see the module doc)."""

    name = "provenance"

    def __init__(self, script: str | None = None, *, module: str | None = None) -> None:
        self.script = Path(script).resolve() if script else None
        self.module = module
        self.seeds: list[dict[str, Any]] = []
        self.data: dict[str, Any] | None = None
        self.loaders: dict[int, dict[str, Any]] = {}
        self._restore: list[Undo] = []
        self._first: tuple[Any, Any] | None = None

    def on_start(self, session: Session) -> None:
        """Wrap the seed setters the script may call (undone at the end)."""
        self._wrap(torch, "manual_seed", "torch")
        self._wrap(random, "seed", "random")
        np = sys.modules.get("numpy")
        if np is None:
            try:
                import numpy as np
            except ImportError:
                np = None
        if np is not None:
            self._wrap(np.random, "seed", "numpy")

    def _wrap(self, owner: Any, attr: str, label: str) -> None:
        if getattr(owner, attr, None) is None:
            return
        seeds = self.seeds

        def make(original: Any) -> Any:
            def seeded(*args: Any, **kwargs: Any) -> Any:
                value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                try:
                    value = int(value) if value is not None else None
                except (TypeError, ValueError):
                    value = repr(value)
                seeds.append({"source": label, "seed": value})
                return original(*args, **kwargs)

            return seeded

        self._restore.append(wrap_attr(owner, attr, make))

    def on_batch(self, batch: Any, loader: Any) -> None:
        """Fingerprint the first batch; note each loader's worker seeding."""
        if loader is not None and id(loader) not in self.loaders:
            generator = getattr(loader, "generator", None)
            entry: dict[str, Any] = {
                "num_workers": getattr(loader, "num_workers", None),
                "generator": generator is not None,
                "worker_init_fn": getattr(loader, "worker_init_fn", None) is not None,
            }
            if generator is not None:
                try:
                    entry["generator_seed"] = int(generator.initial_seed())
                except Exception:
                    pass
            # the dataset's transform as plain data, for 'scalpel export --transform-from RUN'
            seen = dataset_transform(getattr(loader, "dataset", None))
            if seen is not None:
                entry["transform"] = seen
            self.loaders[id(loader)] = entry
        if self.data is None and self._first is None:
            # Hashed when the step closes (on_step_end runs between steps, outside any step's time),
            # not here inside the step's data wait: a large batch costs ~5 ms per MB to hash.
            self._first = (batch, loader)

    def on_step_end(self, step: StepRecord) -> None:
        """Fingerprint the first batch, outside the measured time."""
        self._fingerprint()

    def _fingerprint(self) -> None:
        if self._first is not None:
            batch, loader = self._first
            self._first = None
            self.data = batch_fingerprint(batch, loader)

    def on_finish(self, record: RunRecord) -> None:
        """Undo the seed wrappers and write ``record.provenance``."""
        self._fingerprint()  # a run that ended inside its first step
        undo_all(self._restore)()
        self._restore = []
        script = self.script if self.script is not None else module_file(self.module)
        record.provenance = collect(
            script, seeds=self.seeds, data=self.data, loaders=list(self.loaders.values())
        )


def module_file(module: str | None) -> Path | None:
    """The file ``python -m MODULE`` ran (a package's ``__main__.py``), None when it cannot be found."""
    if not module:
        return None
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None


def collect(
    script: Path | None,
    *,
    seeds: list[dict[str, Any]] | None = None,
    data: dict[str, Any] | None = None,
    loaders: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The provenance dict for a run of ``script`` (None: in-process, no script file)."""
    prov: dict[str, Any] = {}
    if script is not None and script.is_file():
        git = git_facts(script.parent)
        if git:
            prov["git"] = git
        root = Path(git["root"]) if git.get("root") else script.parent
        code: dict[str, Any] = {"script": {"path": script.name, "sha256": file_sha256(script)}}
        code["modules"] = local_modules(root)
        prov["code"] = code
    if data is not None:
        prov["data"] = data
    prov["seeds"] = {
        "calls": list(seeds or []),
        "torch_initial_seed": int(torch.initial_seed()),
        "loaders": list(loaders or []),
    }
    return prov
