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
allowed only on instances of the admitted data classes, with only their declared fields, each of its declared
type (a ``state_dict_metadata`` that is a string is refused here, not met as an ``AttributeError`` in DCP).

Nor is refusing code enough: the memo lets a 22 KB ``.metadata`` name one ``TensorStorageMetadata`` of 10^4
chunks from 100 keys, and DCP's planner then walks 10^6 chunks (44 s, 1 GB, then a ``KeyError``). The
unpickler counts by :mod:`torchscalpel.plaindata`'s one rule, against :func:`~torchscalpel.plaindata.work_budget`
of the file's size: each memo fetch spends what the fetched object holds, again; so do the arguments of every
call (``set(list)`` and ``torch.Size(list)`` copy them); and the finished metadata is walked once with its
declared types, which also finds a field left unset or of the wrong type anywhere in it.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem as _dcp_fs
from torch.distributed.checkpoint import metadata as _dcp_meta
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.plaindata import TooMuchWork, WorkCounter, plain_children, spend_expanded, work_budget

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
_TUPLE_STATE: dict[type, tuple[Any, ...]] = {
    _dcp_meta.TensorProperties: (torch.dtype, torch.layout, bool, _dcp_meta._MEM_FORMAT_ENCODING, bool)
}
# Each field's type: the declared one, or for a field declared ``Any``, what DCP's default planner writes and
# the readers here need (FileSystemReader looks each chunk up in ``storage_data``; the load planner follows
# ``planner_data``'s paths).
_FIELD_TYPES: dict[type, dict[str, Any]] = {cls: typing.get_type_hints(cls) for cls in _BUILDABLE}
_FIELD_TYPES[_dcp_meta.Metadata].update(
    storage_data=dict[_dcp_meta.MetadataIndex, _dcp_fs._StorageInfo] | None,
    planner_data=dict[str, tuple[str | int, ...]] | None,
)


class MetadataRefused(CheckpointError):
    """A ``.metadata`` that is not what DCP writes (code, a wrong type, a memo bomb, a garbled pickle): an input
    file refused, exit 2 as for every refused file (a :class:`CheckpointError`, so callers that catch those still do)."""

    exit_code = 2


class _Refused(pickle.UnpicklingError):
    """What the metadata asked for and DCP never writes (the message completes "it ...")."""


class _WrongType(Exception):
    """A field that is not of its declared type (the message completes "its ...")."""


def _type_text(hint: Any) -> str:
    """``dict[str, TensorStorageMetadata | BytesStorageMetadata]``: a type as the sentence names it."""
    if hint is type(None) or hint is None:
        return "None"
    if hint is Any:
        return "anything"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_text(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(hint, "__qualname__", str(hint))


def _what(value: Any) -> str:
    name = type(value).__qualname__
    return "None" if value is None else f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _record_children(obj: Any) -> Iterable[Any] | None:
    """What a plain container or an instance of DCP's data classes holds (for counting)."""
    if type(obj) in _BUILDABLE:
        return list(vars(obj).values())
    return plain_children(obj)


def _check(value: Any, hint: Any, where: str, counter: WorkCounter, deep: bool) -> None:
    """Raise :class:`_WrongType` naming ``where`` when ``value`` is not of type ``hint``; spend what it walks.

    ``deep``: also check the fields of the data-class instances inside (the whole finished metadata); without
    it they are taken as they are (at BUILD, each is checked at its own BUILD and again at the end).
    """
    counter.spend(1)
    if hint is Any:
        spend_expanded(value, counter, _record_children)
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:  # the first alternative the value's own type matches decides, then its content
            if _matches_outside(value, arg):
                _check(value, arg, where, counter, deep)
                return
        raise _WrongType(f"{where} is {_what(value)} where DCP declares {_type_text(hint)}")
    if not _matches_outside(value, hint):
        raise _WrongType(f"{where} is {_what(value)} where DCP declares {_type_text(hint)}")
    if origin is dict:
        for k, v in value.items():
            _check(k, args[0], f"{where} key {_short(k)}", counter, deep)
            _check(v, args[1], f"{where}[{_short(k)}]", counter, deep)
    elif origin in (list, Sequence) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        for i, v in enumerate(value):
            _check(v, args[0], f"{where}[{i}]", counter, deep)
    elif origin is tuple:
        if len(value) != len(args):
            raise _WrongType(f"{where} has {len(value)} items where DCP declares {len(args)}")
        for i, (v, arg) in enumerate(zip(value, args, strict=True)):
            _check(v, arg, f"{where}[{i}]", counter, deep)
    elif isinstance(value, torch.Size):
        counter.spend(len(value))  # ints by construction
    elif deep and type(value) in _FIELD_TYPES:
        _check_fields(value, where, counter, deep=True)


def _short(key: Any) -> str:
    text = repr(key) if isinstance(key, str | int) else type(key).__qualname__
    return text if len(text) <= 60 else text[:57] + "..."


def _matches_outside(value: Any, hint: Any) -> bool:
    """``value``'s own type is ``hint``'s (its content aside)."""
    if hint is type(None) or hint is None:
        return value is None
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches_outside(value, a) for a in typing.get_args(hint))
    if origin is Sequence:
        return isinstance(value, list | tuple)
    if origin is not None:
        return type(value) is origin  # a plain dict, list or tuple, as pickle builds them
    if hint in (bool, int, str):
        return type(value) is hint  # True is not a length, nor 3 a path
    if hint is os.PathLike:
        return isinstance(value, os.PathLike)
    return isinstance(hint, type) and isinstance(value, hint)


_MISSING = object()
_FACTORIES: dict[type, dict[str, Any]] = {
    cls: {
        f.name: f.default_factory
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
    }
    for cls in _BUILDABLE
}


def _check_fields(obj: Any, where: str, counter: WorkCounter, deep: bool) -> None:
    """Every declared field of a data-class instance is set and of its type."""
    for name, hint in _FIELD_TYPES[type(obj)].items():
        value = getattr(obj, name, _MISSING)  # a field left out of the state keeps its class default
        if value is _MISSING:
            factory = _FACTORIES[type(obj)].get(name)
            if factory is None:
                raise _WrongType(f"{where}.{name} is not set where DCP declares {_type_text(hint)}")
            # a field added in a later torch (StorageMeta.modules): an older checkpoint gets its default
            value = factory()
            object.__setattr__(obj, name, value)
        _check(value, hint, f"{where}.{name}", counter, deep)


_Load = typing.Callable[[Any], None]


def _counted_fetch(load: _Load) -> _Load:
    """A memo fetch opcode that then spends what the fetched object holds: a second reference is counted
    again, with its whole content, as every later walk of the metadata meets it."""

    def fetch(self: MetadataUnpickler) -> None:
        load(self)
        spend_expanded(self.stack[-1], self.counter, _record_children)  # type: ignore[attr-defined]

    return fetch


def _counted_call(load: _Load) -> _Load:
    """A call opcode (REDUCE, NEWOBJ) that first spends its arguments: ``set(...)`` and ``torch.Size(...)``
    copy what they are given, so a fetched list given to many calls is many lists."""

    def call(self: MetadataUnpickler) -> None:
        spend_expanded(self.stack[-1], self.counter, _record_children)  # type: ignore[attr-defined]
        load(self)

    return call


class MetadataUnpickler(pickle._Unpickler):
    """An unpickler that resolves only the globals DCP's metadata is made of, and builds only its data classes,
    with their declared fields of their declared types, within ``budget`` (see the module's docstring).

    The pure-Python unpickler, because the C one's BUILD cannot be checked: the ``.metadata`` of 3000
    tensors (0.56 MB) reads in 0.9 s against the C unpickler's 0.1 s on a loaded 2-core machine.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, budget: int | None = None) -> None:
        super().__init__(file)
        self.counter = WorkCounter(budget)

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"references {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("references a persistent id")

    for _op in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET):
        dispatch[_op[0]] = _counted_fetch(dispatch[_op[0]])
    dispatch[pickle.REDUCE[0]] = _counted_call(dispatch[pickle.REDUCE[0]])
    dispatch[pickle.NEWOBJ[0]] = _counted_call(dispatch[pickle.NEWOBJ[0]])
    del _op

    def _instantiate(self, klass: Any, args: Any) -> None:  # INST and OBJ
        spend_expanded(args, self.counter, _record_children)
        super()._instantiate(klass, args)  # type: ignore[misc]

    def _checked_build(self) -> None:
        target, state = self.stack[-2], self.stack[-1]  # type: ignore[attr-defined]
        cls = type(target)
        fields = _BUILDABLE.get(cls)
        if fields is None:  # a class, a function, a set...: BUILD on it would change it for the process
            what = getattr(target, "__qualname__", None) or cls.__qualname__
            raise _Refused(f"sets attributes on {what}")
        if cls in _TUPLE_STATE:
            want = _TUPLE_STATE[cls]
            if not (isinstance(state, tuple) and len(state) == len(want)):
                raise _Refused(f"gives {cls.__qualname__} a state that is not its {len(want)} fields")
            for i, (value, hint) in enumerate(zip(state, want, strict=True)):
                _check(value, hint, f"{cls.__qualname__}'s state[{i}]", self.counter, deep=False)
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
                hints = _FIELD_TYPES[cls]
                for name, value in part.items():
                    _check(value, hints[name], f"{cls.__qualname__}.{name}", self.counter, deep=False)
        super().load_build()  # type: ignore[misc]

    dispatch[pickle.BUILD[0]] = _checked_build  # type: ignore[assignment]

    def load(self) -> Any:
        """The metadata, refused (:class:`_Refused`, :class:`_WrongType`, :class:`TooMuchWork`) as it is read and
        once more as a whole: every field of every data class in it set and of its type, within the budget."""
        metadata = super().load()
        if isinstance(metadata, Metadata):
            _check_fields(metadata, "Metadata", self.counter, deep=True)
        return metadata


def _storage_missing(metadata: Metadata) -> str | None:
    """The first item with no storage entry (what DCP's reader would raise a ``KeyError`` on), or None."""
    storage = metadata.storage_data or {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, _dcp_meta.TensorStorageMetadata):
            for chunk in item.chunks:
                if _dcp_meta.MetadataIndex(fqn, chunk.offsets) not in storage:
                    return f"{fqn!r} at offset {list(chunk.offsets)}"
        elif _dcp_meta.MetadataIndex(fqn) not in storage:
            return repr(fqn)
    return None


# A stored chunk holds at least its raw bytes (torch.save adds a header) unless DCP compressed it; zstd on weights
# gains under 2x and reaches ~1000x only on constant buffers, so a transformed chunk may declare up to this many raw
# bytes per stored byte. Past it, a 35 KB file could make ``consolidate`` allocate terabytes before reading a byte.
_MOST_PER_STORED_BYTE = 1024


def _declared_beyond_stored(metadata: Metadata, folder: Path) -> str | None:
    """What a tensor entry declares beyond the data stored for it, or None.

    A chunk lies inside its tensor, its raw bytes are within what its storage entry holds (times
    :data:`_MOST_PER_STORED_BYTE` when DCP transformed it), and a storage entry lies inside its file where the
    file exists. ``consolidate`` allocates each tensor at its declared size before DCP reads a chunk, so the
    size is checked against the stored data here, not met as an out-of-memory there."""
    storage = metadata.storage_data or {}
    file_sizes: dict[str, int | None] = {}
    for info in storage.values():
        rel = info.relative_path
        if rel not in file_sizes:
            try:
                file_sizes[rel] = (folder / rel).stat().st_size
            except OSError:
                file_sizes[rel] = None  # a missing file is DCP's own one-sentence error, at load
        if info.offset < 0 or info.length < 0:
            return (
                f"a storage entry in {rel!r} has a negative offset or length ({info.offset}, {info.length})"
            )
        held = file_sizes[rel]
        if held is not None and info.offset + info.length > held:
            return (
                f"it places {info.length:,} bytes at offset {info.offset:,} of {rel!r}, "
                f"which holds {held:,} bytes"
            )
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, _dcp_meta.TensorStorageMetadata):
            continue
        itemsize = item.properties.dtype.itemsize
        if any(dim < 0 for dim in item.size):
            return f"{fqn!r} declares a negative size {list(item.size)}"
        covered = 0
        for chunk in item.chunks:
            if len(chunk.offsets) != len(item.size) or len(chunk.sizes) != len(item.size):
                return f"a chunk of {fqn!r} has {len(chunk.sizes)} dimensions where the tensor has {len(item.size)}"
            if any(
                o < 0 or n < 0 or o + n > d
                for o, n, d in zip(chunk.offsets, chunk.sizes, item.size, strict=True)
            ):
                return (
                    f"a chunk of {fqn!r} at {list(chunk.offsets)} reaches outside its size {list(item.size)}"
                )
            raw = itemsize * _product(chunk.sizes)
            info = storage[_dcp_meta.MetadataIndex(fqn, chunk.offsets)]  # present: _storage_missing ran first
            most = info.length * (_MOST_PER_STORED_BYTE if info.transform_descriptors else 1)
            if raw > most:
                return (
                    f"a chunk of {fqn!r} declares {raw:,} bytes of {item.properties.dtype} where "
                    f"{info.length:,} bytes are stored for it (a size the stored data cannot fill)"
                )
            covered += raw
        if itemsize * _product(item.size) > covered:
            return (
                f"{fqn!r} declares {itemsize * _product(item.size):,} bytes ({list(item.size)}) where its chunks "
                f"hold {covered:,}"
            )
    return None


def _product(dims: Iterable[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def read_metadata(path: Path) -> Metadata:
    """Unpickle the DCP metadata file ``path`` with :class:`MetadataUnpickler`; refuse anything else."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            metadata = MetadataUnpickler(fh, work_budget(size)).load()
    except _Refused as exc:
        raise MetadataRefused(
            f"Refusing to read {path}: it {exc}, which DCP checkpoint metadata never does "
            "(a pickled object that could run code or change other objects)."
        ) from None
    except _WrongType as exc:
        raise MetadataRefused(f"Refusing to read {path}: its {exc}.") from None
    except TooMuchWork as exc:
        raise MetadataRefused(
            f"Refusing to read {path}: it names its own parts over and over, more than {exc.budget:,} objects "
            f"from {size:,} bytes, which DCP checkpoint metadata never does."
        ) from None
    except RecursionError:
        raise MetadataRefused(
            f"Refusing to read {path}: it nests its parts deeper than DCP ever does."
        ) from None
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path} ({exc.strerror or exc}).") from None
    except Exception as exc:  # truncated or garbled pickles raise EOFError, ValueError, TypeError...
        raise MetadataRefused(
            f"{path} is not valid DCP checkpoint metadata ({type(exc).__name__}: {_first_line(exc)})."
        ) from None
    if not isinstance(metadata, Metadata):
        raise MetadataRefused(f"{path} holds a {type(metadata).__name__}, not DCP checkpoint metadata.")
    for info in (metadata.storage_data or {}).values():
        rel = info.relative_path
        if not rel or Path(rel).name != rel or rel in (".", ".."):
            raise MetadataRefused(
                f"Refusing to read {path}: it points at {rel!r}, which is not a file of the checkpoint folder."
            )
    missing = _storage_missing(metadata)
    if missing is not None:
        raise MetadataRefused(
            f"{path} is not valid DCP checkpoint metadata: it lists no stored data for {missing}."
        )
    beyond = _declared_beyond_stored(metadata, path.parent)
    if beyond is not None:
        raise MetadataRefused(f"Refusing to read {path}: {beyond}.")
    return metadata


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= 200 else text[:197] + "..."


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
