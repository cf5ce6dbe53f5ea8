"""DCP ``.metadata`` may BUILD only instances of DCP's data classes, with their declared fields (issue 30, item 6).

pickle's BUILD sets attributes on whatever sits on the stack; with only an allow-list of globals, a crafted
``.metadata`` set attributes on ``pathlib.PosixPath`` and DCP's ``Metadata`` class for the whole process and then
loaded normally.
"""

from __future__ import annotations

import pathlib
import struct

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.distributed.safedcp import read_metadata


def _text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _build_then_real(real: bytes, module: str, name: str, attr: str, slot: bool) -> bytes:
    """A pickle that BUILDs ``module.name`` (the global itself) with ``{attr: 1}``, drops it, then is ``real``."""
    state = _text(attr) + b"K\x01s"  # {attr: 1}
    state = (b"N}" + state + b"\x86") if slot else (b"}" + state)  # (None, {attr: 1}) or {attr: 1}
    assert real[:1] == b"\x80"
    return real[:2] + f"c{module}\n{name}\n".encode() + state + b"b0" + real[2:]


@pytest.fixture
def real_metadata(tmp_path) -> bytes:
    dcp.save({"w": torch.ones(3), "n": 3}, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    return (tmp_path / "plain" / ".metadata").read_bytes()


@pytest.mark.parametrize(
    ("module", "name", "cls"),
    [
        ("pathlib", "PosixPath", pathlib.PosixPath),
        ("torch.distributed.checkpoint.metadata", "Metadata", Metadata),
    ],
)
@pytest.mark.parametrize("slot", [True, False])
def test_build_on_an_admitted_class_is_refused(tmp_path, real_metadata, module, name, cls, slot):
    before = dict(vars(cls))
    path = tmp_path / "evil.metadata"
    path.write_bytes(_build_then_real(real_metadata, module, name, "scalpel_evil", slot))
    with pytest.raises(CheckpointError) as info:
        read_metadata(path)
    message = str(info.value)
    assert message.startswith(f"Refusing to read {path}: it sets attributes on {name},"), message
    assert message.count(". ") == 0 and "\n" not in message, message  # one sentence
    assert not hasattr(cls, "scalpel_evil")
    assert dict(vars(cls)) == before


def test_build_of_an_undeclared_field_is_refused(tmp_path, real_metadata):
    """An instance of an admitted data class may get its declared fields only (a renamed key is refused)."""
    meta = read_metadata_bytes(tmp_path, real_metadata)
    assert isinstance(meta, Metadata)
    # Metadata's state dict in the real pickle starts with its first field's key; rename that key.
    key = b"state_dict_metadata"
    short = b"\x8c" + bytes([len(key)]) + key  # SHORT_BINUNICODE, how protocol 4+ writes a short key
    assert real_metadata.count(short) == 1
    evil = real_metadata.replace(short, short[:-1] + b"X")  # same length: protocol 4 frames carry lengths
    path = tmp_path / "field.metadata"
    path.write_bytes(evil)
    with pytest.raises(
        CheckpointError, match=r"sets 'state_dict_metadatX' on Metadata, which is not one of its fields"
    ):
        read_metadata(path)


def test_truncated_metadata_is_not_called_code(tmp_path, real_metadata):
    path = tmp_path / "short.metadata"
    path.write_bytes(real_metadata[: len(real_metadata) // 2])
    with pytest.raises(CheckpointError) as info:
        read_metadata(path)
    assert "is not valid DCP checkpoint metadata" in str(info.value) and "run code" not in str(info.value)


def read_metadata_bytes(tmp_path: pathlib.Path, data: bytes) -> Metadata:
    path = tmp_path / "ok.metadata"
    path.write_bytes(data)
    return read_metadata(path)
