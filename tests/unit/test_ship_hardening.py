"""Issue 30 items 9, 10 and 11 (export and serve parts): unverified sources are said so, corrupt weights are
refused, --sign-key is checked before any work, a corrupt model.pt2 and a text --weights get one right sentence."""

from __future__ import annotations

import logging
import struct

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from fixtures.digits_model import make_model
from torchscalpel.cli.main import main
from torchscalpel.errors import ScalpelError
from torchscalpel.ship.bundle import Bundle
from torchscalpel.ship.weights import MAX_ABS_WEIGHT, load_weights

MODEL = "tests/fixtures/digits_model.py:make_model"


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return make_model(4).state_dict()


def _flip_high_exponent_bit(t: torch.Tensor) -> None:
    """What one flipped bit in a float32 weight does: bit 30 turns 0.05 into ~1.7e37."""
    flat = t.view(-1)
    bits = struct.unpack("<I", struct.pack("<f", float(flat[0])))[0] ^ (1 << 30)
    flat[0] = struct.unpack("<f", struct.pack("<I", bits))[0]


def test_a_plain_dcp_folder_is_unverified_and_a_flipped_bit_is_refused(tmp_path):
    state = _state()
    dcp.save(state, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    info = load_weights(make_model(4), tmp_path / "plain")
    assert info.source_verified is False and info.to_dict()["source_verified"] is False
    assert any("were not verified against hashes" in n for n in info.notes), info.notes

    bad = {k: v.clone() for k, v in state.items()}
    _flip_high_exponent_bit(bad["features.0.weight"])
    assert bad["features.0.weight"].abs().max() > 1e30
    dcp.save(bad, checkpoint_id=str(tmp_path / "flipped"), no_dist=True)
    with pytest.raises(ScalpelError) as err:
        load_weights(make_model(4), tmp_path / "flipped")
    message = str(err.value)
    assert "'features.0.weight' holds a value of magnitude" in message and "--allow-nonfinite" in message
    assert f"over {MAX_ABS_WEIGHT:g}" in message and "\n" not in message
    load_weights(make_model(4), tmp_path / "flipped", allow_nonfinite=True)  # the user's call


def test_nan_weights_are_refused(tmp_path):
    state = {k: v.contiguous() for k, v in _state().items()}
    state["head.bias"] = state["head.bias"].clone()
    state["head.bias"][0] = float("nan")
    save_file(state, str(tmp_path / "w.safetensors"))
    with pytest.raises(ScalpelError, match=r"'head\.bias' holds NaN or infinity"):
        load_weights(make_model(4), tmp_path / "w.safetensors")


@pytest.mark.parametrize("text", ["weights go here\n", "x = 1\n", "{}\n"])
def test_a_text_file_as_weights_is_not_told_to_pass_trust(tmp_path, text):
    path = tmp_path / "notes.pt"
    path.write_text(text)
    with pytest.raises(ScalpelError) as err:
        load_weights(make_model(4), path)
    assert "--trust" not in str(err.value) and "Cannot read" in str(err.value), str(err.value)


def test_sign_key_is_checked_before_any_work(tmp_path, capsys):
    dcp.save(_state(), checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    base = ["export", "--model", MODEL, "--example", "float32[1,1,8,8]", "--formats", "onnx"]
    out = tmp_path / "bundle"
    rc = main(
        [
            *base,
            "--weights",
            str(tmp_path / "ck"),
            "--sign-key",
            str(tmp_path / "nosuch.key"),
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("scalpel: error: Cannot read the signing key") and "\n" not in err, err
    assert not out.exists()
    key = tmp_path / "k.key"
    key.write_bytes(b"k" * 32)
    rc = main([*base, "--sign-key", str(key), "--out", str(out)])  # no checkpoint to check
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "point --weights at the checkpoint folder" in err and not out.exists(), err


def test_serve_torch_backend_on_a_corrupt_pt2_is_one_sentence(tmp_path, caplog):
    from torchscalpel.serve.backends import load_runner

    (tmp_path / "model.pt2").write_bytes(b"PK\x03\x04" + b"not a zip archive" * 10)
    bundle = Bundle(path=tmp_path, manifest={"artifacts": {"exported": "model.pt2"}})
    with caplog.at_level(logging.WARNING), pytest.raises(ScalpelError) as err:
        load_runner(bundle, "torch", trust=True)
    assert str(err.value).startswith(f"Cannot load {tmp_path / 'model.pt2'} as a torch.export program")
    assert "Traceback" not in caplog.text
