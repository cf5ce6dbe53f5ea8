"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

torch's ``FileSystemReader.read_metadata`` calls ``pickle.load`` on ``.metadata``, and DCP's
planners read byte items with ``torch.load(weights_only=False)``: a crafted checkpoint runs code
on load. :class:`SafeFileSystemReader` reads ``.metadata`` through :class:`MetadataUnpickler`,
which admits only what DCP writes there (found by listing the globals of the metadata torch 2.13
saves for model, optimizer and plain states: the ``torch.distributed.checkpoint.metadata``
dataclasses, ``_StorageInfo``, ``torch.Size``, dtypes, layouts, ``PosixPath``, plain containers,
numbers and strings); the planners here read byte items with ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from torchscalpel.distributed.manifest import CheckpointError

_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo", "_StoragePrefix"}),
    "torch.serialization": frozenset({"_get_layout"}),  # looks a layout up by name, nothing else
    "torch": frozenset({"Size"}),  # and every torch dtype, checked below
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "complex", "slice"}),
}


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals DCP's metadata is made of."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id")


def read_metadata(path: Path) -> Metadata:
    """Unpickle the DCP metadata file ``path`` with :class:`MetadataUnpickler`; refuse anything else."""
    try:
        with open(path, "rb") as fh:
            metadata = MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"Refusing to read {path}: it references {exc}, which DCP checkpoint metadata never holds "
            "(a pickled object that could run code)."
        ) from None
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path} ({exc.strerror or exc}).") from None
    except Exception as exc:  # truncated or garbled pickles raise EOFError, ValueError, TypeError...
        raise CheckpointError(
            f"{path} is not valid DCP checkpoint metadata ({type(exc).__name__}: {exc})."
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP checkpoint metadata.")
    for info in (metadata.storage_data or {}).values() if isinstance(metadata.storage_data, dict) else ():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or Path(rel).name != rel or rel in (".", ".."):
            raise CheckpointError(
                f"Refusing to read {path}: it points at {rel!r}, which is not a file of the checkpoint folder."
            )
    return metadata


class SafeFileSystemReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` cannot run code (see :func:`read_metadata`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyBytes:
    """Byte items (non-tensor state: optimizer hyper-parameters, counters) load with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"Refusing to load checkpoint entry {read_item.dest_index.fqn!r}: it holds pickled objects beyond "
                f"tensors and plain values ({str(exc).splitlines()[0]})."
            ) from None
        if self.flatten_state_dict:  # type: ignore[attr-defined]
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)  # type: ignore[attr-defined]
        else:
            self.state_dict[read_item.dest_index.fqn] = obj  # type: ignore[attr-defined]


class WeightsOnlyLoadPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner, without code execution for byte items."""


class WeightsOnlyEmptyPlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state from the metadata, without code execution."""


def load_all(folder: Path) -> dict[str, Any]:
    """Every entry of the DCP checkpoint in ``folder``, nested as saved, read in this process."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # what dcp_to_torch_save uses

    read_metadata(folder / ".metadata")  # refused here in one sentence, before DCP wraps the error
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        _load_state_dict(
            state,
            storage_reader=SafeFileSystemReader(str(folder)),
            planner=WeightsOnlyEmptyPlanner(),
            no_dist=True,
        )
    return state
