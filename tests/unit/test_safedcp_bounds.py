"""DCP ``.metadata`` read within a budget of its size, with every field of its declared type (issue 41, items 1, 5).

A 22 KB ``.metadata`` naming one ``TensorStorageMetadata`` of 10^4 chunks from 100 keys cost DCP's planner 44 s
and 1 GB before a ``KeyError`` traceback; ``state_dict_metadata = "oops"`` set by BUILD gave an
``AttributeError`` traceback. Both are refused in one sentence naming the file, before DCP sees them; the fuzz
tests keep every other file to a ``Metadata`` or one ``CheckpointError``.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.distributed.safedcp import MetadataUnpickler, read_metadata
from torchscalpel.plaindata import TooMuchWork, work_budget

FUZZ = settings(
    max_examples=60,
    deadline=None,  # cost is bounded by the work budget, counted; a hang is pytest-timeout's (wall time is load)
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The ``.metadata`` torch writes for a model, its Adam state and plain values."""
    folder = tmp_path_factory.mktemp("dcp") / "ckpt"
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"step": 3, "tag": "x"}}
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process": it is
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return (folder / ".metadata").read_bytes()


def _bomb(keys: int) -> Metadata:
    """One TensorStorageMetadata of 10^4 chunks named from ``keys + 1`` keys: 22 KB for 100 keys."""
    chunk = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([1]))
    shared = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32), size=torch.Size([10**4]), chunks=[chunk] * 10**4
    )
    return Metadata(state_dict_metadata={f"k{i}": shared for i in range(keys + 1)}, storage_data={})


@pytest.mark.parametrize("keys", [100, 1000])
def test_a_memo_amplified_metadata_is_refused_within_its_budget(tmp_path: Path, keys: int) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_bomb(keys)))
    size = path.stat().st_size
    assert size < 40_000
    with pytest.raises(CheckpointError) as err:
        read_metadata(path)
    text = str(err.value)
    assert err.value.exit_code == 2  # a refused input file, as every reader refuses one
    assert text.startswith(f"Refusing to read {path}: it names its own parts over and over, more than ")
    assert f"{work_budget(size):,} objects from {size:,} bytes" in text and "\n" not in text
    # the count stopped at the budget: one fetch of the shared TensorStorageMetadata past it at most
    with path.open("rb") as fh:
        unpickler = MetadataUnpickler(fh, work_budget(size))
        with pytest.raises(TooMuchWork):
            unpickler.load()
    assert work_budget(size) < unpickler.counter.work <= work_budget(size) + 6 * 10**4


def _mutations() -> dict[str, Callable[[Metadata], None]]:
    def weight(m: Metadata) -> Any:
        return m.state_dict_metadata["model.weight"]

    return {
        "state_dict_metadata": lambda m: setattr(m, "state_dict_metadata", "oops"),
        "state_dict_metadata['model.weight']": lambda m: m.state_dict_metadata.__setitem__(
            "model.weight", "oops"
        ),
        "TensorStorageMetadata.chunks[0]": lambda m: setattr(weight(m), "chunks", [1]),
        "TensorStorageMetadata.size": lambda m: setattr(weight(m), "size", [3, 4]),
        "Metadata.storage_data": lambda m: setattr(m, "storage_data", "x"),
        "_StorageInfo.offset": lambda m: setattr(next(iter(m.storage_data.values())), "offset", "0"),
        "Metadata.version": lambda m: setattr(m, "version", 10**5000),
        "Metadata.planner_data['model.weight']": lambda m: m.planner_data.__setitem__(
            "model.weight", "model"
        ),
        "TensorProperties's state[0]": lambda m: setattr(weight(m).properties, "dtype", "float32"),
        ".chunks is not set": lambda m: delattr(weight(m), "chunks"),
        "StorageMeta.modules": lambda m: setattr(m.storage_meta, "modules", [1]),
    }


@pytest.mark.parametrize("where", list(_mutations()))
def test_a_field_of_the_wrong_type_is_refused_in_one_sentence(
    tmp_path: Path, real: bytes, where: str
) -> None:
    metadata = pickle.loads(real)  # torch's own objects, changed as a crafted file would
    _mutations()[where](metadata)
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError) as err:
        read_metadata(path)
    text = str(err.value)
    assert text.startswith(f"Refusing to read {path}: its ") and where in text, text
    assert err.value.exit_code == 2
    assert "DCP declares" in text and text.count(". ") == 0 and "\n" not in text


def test_an_item_without_stored_data_is_refused_before_dcp_raises_a_key_error(
    tmp_path: Path, real: bytes
) -> None:
    metadata = pickle.loads(real)
    metadata.storage_data.pop(next(k for k in metadata.storage_data if k.fqn == "model.weight"))
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(
        CheckpointError, match=r"lists no stored data for 'model\.weight' at offset \[0, 0\]\.$"
    ):
        read_metadata(path)


def test_the_real_metadata_is_read_whole_and_far_within_its_budget(tmp_path: Path, real: bytes) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(real)
    metadata = read_metadata(path)
    assert metadata.state_dict_metadata.keys() == pickle.loads(real).state_dict_metadata.keys()
    with path.open("rb") as fh:
        unpickler = MetadataUnpickler(fh, work_budget(len(real)))
        unpickler.load()
    assert unpickler.counter.work < len(real)  # under one unit per byte; the budget is 4 per byte + 10^6


# ---- fuzz: any file is a Metadata or one CheckpointError ---------------------------------------------------


def _outcome(path: Path) -> Metadata | None:
    try:
        metadata = read_metadata(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
        return None
    assert isinstance(metadata, Metadata)
    return metadata


@FUZZ
@given(data=st.data())
def test_fuzz_byte_edits_of_a_real_metadata_read_or_refused(
    tmp_path_factory, real: bytes, data: st.DataObject
) -> None:
    blob = bytearray(real)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if how == "flip":
            blob[at] = data.draw(st.integers(0, 255))
        elif how == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif how == "delete":
            del blob[at : at + data.draw(st.integers(1, 4))]
        else:
            del blob[at:]
        if not blob:
            blob = bytearray(b"\x80")
    path = tmp_path_factory.mktemp("edit") / ".metadata"
    path.write_bytes(bytes(blob))
    _outcome(path)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=4),
    st.just(10**5000),
    st.builds(torch.Size, st.lists(st.integers(0, 9), max_size=3)),
    st.lists(st.integers(0, 3), max_size=3),
)


@FUZZ
@given(data=st.data())
def test_fuzz_shared_and_retyped_metadata_is_read_within_budget_or_refused(
    tmp_path_factory, real: bytes, data: st.DataObject
) -> None:
    """torch's objects with fields swapped for values of other types and parts shared many times over."""
    metadata = pickle.loads(real)
    items = list(metadata.state_dict_metadata.items())
    for _ in range(data.draw(st.integers(0, 3))):  # name one part from many keys (the memo shares it)
        fqn, item = data.draw(st.sampled_from(items))
        times = data.draw(st.sampled_from([2, 50, 1000]))
        metadata.state_dict_metadata.update({f"{fqn}.copy{i}": item for i in range(times)})
        if isinstance(item, TensorStorageMetadata) and data.draw(st.booleans()):
            item.chunks = item.chunks * data.draw(st.sampled_from([2, 500]))
    objects = [metadata, metadata.storage_meta, *metadata.storage_data.values(), *metadata.storage_data]
    objects += [v for _, v in items] + [
        v.properties for _, v in items if isinstance(v, TensorStorageMetadata)
    ]
    for _ in range(data.draw(st.integers(0, 2))):  # a field of the wrong type
        target = data.draw(st.sampled_from(objects))
        names = sorted(vars(target))
        if names:
            object.__setattr__(target, data.draw(st.sampled_from(names)), data.draw(VALUES))
    try:
        blob = pickle.dumps(copy.copy(metadata))
    except Exception:  # a value torch's own classes cannot pickle (a memory format it does not know)
        return
    path = tmp_path_factory.mktemp("typed") / ".metadata"
    path.write_bytes(blob)
    _outcome(path)


def test_a_field_an_older_torch_did_not_write_gets_its_default(tmp_path: Path, real: bytes) -> None:
    """``StorageMeta.modules`` (a default factory, no class default) is absent from older torch's metadata."""
    metadata = pickle.loads(real)
    del vars(metadata.storage_meta)["modules"]
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    assert read_metadata(path).storage_meta.modules == []


def _saved(tmp_path: Path) -> tuple[Path, Metadata]:
    folder = tmp_path / "ckpt"
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process": it is
        dcp.save({"model": torch.nn.Linear(4, 3).state_dict()}, checkpoint_id=str(folder), no_dist=True)
    return folder, read_metadata(folder / ".metadata")


def _rewrite(folder: Path, metadata: Metadata) -> Path:
    path = folder / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    return path


def test_a_real_checkpoint_declares_no_more_than_it_stores(tmp_path: Path) -> None:
    _folder, metadata = _saved(tmp_path)
    weight = metadata.state_dict_metadata["model.weight"]
    assert isinstance(weight, TensorStorageMetadata) and list(weight.size) == [3, 4]


def test_a_tensor_declared_larger_than_its_stored_chunks_is_refused(tmp_path: Path) -> None:
    """``consolidate`` allocates each tensor at its declared size: 10^12 elements from a few hundred stored bytes
    would be an out-of-memory, not a sentence."""
    folder, metadata = _saved(tmp_path)
    weight = metadata.state_dict_metadata["model.weight"]
    assert isinstance(weight, TensorStorageMetadata)
    weight.size = torch.Size([10**6, 10**6])
    path = _rewrite(folder, metadata)
    with pytest.raises(CheckpointError) as err:
        read_metadata(path)
    text = str(err.value)
    assert text.startswith(f"Refusing to read {path}: 'model.weight' declares 4,000,000,000,000 bytes")
    assert "where its chunks hold 48" in text and "\n" not in text


def test_a_chunk_larger_than_its_stored_bytes_is_refused(tmp_path: Path) -> None:
    folder, metadata = _saved(tmp_path)
    weight = metadata.state_dict_metadata["model.weight"]
    assert isinstance(weight, TensorStorageMetadata)
    index = next(k for k in (metadata.storage_data or {}) if k.fqn == "model.weight")
    del metadata.storage_data[index]  # type: ignore[union-attr]
    weight.size = torch.Size([3000, 4])
    weight.chunks[0].sizes = torch.Size([3000, 4])
    metadata.storage_data[_dcp_index("model.weight", weight.chunks[0].offsets)] = index_info = _info(  # type: ignore[index]
        folder, length=64
    )
    assert index_info.length == 64
    path = _rewrite(folder, metadata)
    with pytest.raises(
        CheckpointError,
        match=r"a chunk of 'model.weight' declares 48,000 bytes of torch.float32 "
        r"where 64 bytes are stored for it",
    ):
        read_metadata(path)


def test_a_storage_entry_past_its_files_end_is_refused(tmp_path: Path) -> None:
    folder, metadata = _saved(tmp_path)
    info = next(iter((metadata.storage_data or {}).values()))
    held = (folder / info.relative_path).stat().st_size
    info.offset = held
    path = _rewrite(folder, metadata)
    with pytest.raises(CheckpointError, match=rf"which holds {held:,} bytes\.$"):
        read_metadata(path)


def test_a_chunk_outside_its_tensor_is_refused(tmp_path: Path) -> None:
    folder, metadata = _saved(tmp_path)
    weight = metadata.state_dict_metadata["model.weight"]
    assert isinstance(weight, TensorStorageMetadata)
    weight.size = torch.Size([1, 4])  # the stored chunk is [3, 4]
    path = _rewrite(folder, metadata)
    with pytest.raises(CheckpointError, match=r"reaches outside its size \[1, 4\]"):
        read_metadata(path)


def _dcp_index(fqn: str, offsets: torch.Size) -> Any:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return MetadataIndex(fqn, offsets)


def _info(folder: Path, length: int) -> Any:
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    name = next(p.name for p in folder.iterdir() if p.suffix == ".distcp")
    return _StorageInfo(relative_path=name, offset=0, length=length)
