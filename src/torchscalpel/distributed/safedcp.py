"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

torch's ``FileSystemReader.read_metadata`` calls ``pickle.load`` on ``.metadata``, and DCP's
planners read byte items with ``torch.load(weights_only=False)``: a crafted checkpoint runs code
on load. :class:`SafeFileSystemReader` reads ``.metadata`` through :class:`MetadataUnpickler`,
which admits only what DCP writes there (found by listing the globals of the metadata torch 2.13
saves for model, optimizer and plain states: the ``torch.distributed.checkpoint.metadata``
dataclasses, ``_StorageInfo``, ``torch.Size``, dtypes, layouts, ``PosixPath``, plain containers,
numbers and strings); the planners here read byte items with ``weights_only=True``.

Admitting a global is not enough: pickle's BUILD opcode sets attributes on whatever is on the stack, so a
``.metadata`` could set attributes on an admitted *class or function* (``PosixPath``, ``Metadata``,
``torch.serialization._get_layout``'s cache) and change them for the whole process. BUILD is therefore
allowed only on instances of the admitted data classes, with only their declared fields.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem as _dcp_fs
from torch.distributed.checkpoint import metadata as _dcp_meta
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


# The data classes DCP's metadata is made of, with the fields BUILD may set on their instances.
_BUILDABLE: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls))
    for cls in (
        _dcp_meta.Metadata,
        _dcp_meta.MetadataIndex,
        _dcp_meta.StorageMeta,
        _dcp_meta.TensorProperties,
        _dcp_meta.TensorStorageMetadata,
        _dcp_meta.BytesStorageMetadata,
        _dcp_meta.ChunkStorageMetadata,
        _dcp_fs._StorageInfo,
        _dcp_fs._StoragePrefix,
    )
}
# TensorProperties pickles its five fields as a tuple, unpacked by its own ``__setstate__``.
_TUPLE_STATE: dict[type, int] = {_dcp_meta.TensorProperties: 5}


class _Refused(pickle.UnpicklingError):
    """What the metadata asked for and DCP never writes (the message completes "it ...")."""


class MetadataUnpickler(pickle._Unpickler):
    """An unpickler that resolves only the globals DCP's metadata is made of, and builds only its data classes.

    The pure-Python unpickler, because the C one's BUILD cannot be checked: the ``.metadata`` of 3000
    tensors (0.56 MB) reads in 0.9 s against the C unpickler's 0.1 s on a loaded 2-core machine.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"references {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("references a persistent id")

    def _checked_build(self) -> None:
        target, state = self.stack[-2], self.stack[-1]  # type: ignore[attr-defined]
        cls = type(target)
        fields = _BUILDABLE.get(cls)
        if fields is None:  # a class, a function, a set...: BUILD on it would change it for the process
            what = getattr(target, "__qualname__", None) or cls.__qualname__
            raise _Refused(f"sets attributes on {what}")
        if cls in _TUPLE_STATE:
            if not (isinstance(state, tuple) and len(state) == _TUPLE_STATE[cls]):
                raise _Refused(f"gives {cls.__qualname__} a state that is not its {_TUPLE_STATE[cls]} fields")
        else:
            parts = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
            for part in parts:
                if part is None:
                    continue
                if not isinstance(part, dict):
                    raise _Refused(f"gives {cls.__qualname__} a {type(part).__name__} as its state")
                extra = [k for k in part if k not in fields]
                if extra:
                    raise _Refused(f"sets {extra[0]!r} on {cls.__qualname__}, which is not one of its fields")
        super().load_build()  # type: ignore[misc]

    dispatch[pickle.BUILD[0]] = _checked_build  # type: ignore[assignment]


def read_metadata(path: Path) -> Metadata:
    """Unpickle the DCP metadata file ``path`` with :class:`MetadataUnpickler`; refuse anything else."""
    try:
        with open(path, "rb") as fh:
            metadata = MetadataUnpickler(fh).load()
    except _Refused as exc:
        raise CheckpointError(
            f"Refusing to read {path}: it {exc}, which DCP checkpoint metadata never does "
            "(a pickled object that could run code or change other objects)."
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
