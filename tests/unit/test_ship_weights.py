"""Weights loading: formats, nesting, wrapper-prefix stripping, strict key checks, safe unpickling."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from fixtures.digits_model import make_model
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.ship.weights import load_weights, strip_prefixes


def trained_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return make_model(4).state_dict()


def assert_loaded(model, state):
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k])


def test_plain_state_dict_and_safetensors(tmp_path):
    state = trained_state()
    torch.save(state, tmp_path / "w.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    for name, source in (("w.pt", "state_dict"), ("w.safetensors", "safetensors")):
        model = make_model(4)
        info = load_weights(model, tmp_path / name)
        assert info.source == source and info.stripped == {}
        assert_loaded(model, state)


def test_ddp_compile_fsdp_prefixes_are_stripped_and_reported(tmp_path):
    state = trained_state()
    wrapped = {
        f"module._orig_mod.{k}".replace("features.", "features._checkpoint_wrapped_module."): v
        for k, v in state.items()
    }
    torch.save({"model": wrapped, "optim": {"step": 3}, "epoch": 2}, tmp_path / "ckpt.pt")
    model = make_model(4)
    info = load_weights(model, tmp_path / "ckpt.pt")
    assert info.nested_key == "model"
    assert info.stripped == {"module.": 6, "_orig_mod.": 6, "_checkpoint_wrapped_module.": 4}
    assert_loaded(model, state)


def test_module_prefix_kept_when_the_model_really_has_it():
    keys = {"module.weight", "other.bias"}
    out, counts = strip_prefixes({"module.weight": torch.zeros(1), "module.other.bias": torch.zeros(1)}, keys)
    # The model's own keys start with "module.", so nothing is stripped (a wrong guess would rename real keys).
    assert set(out) == {"module.weight", "module.other.bias"} and counts == {}


def test_missing_unexpected_and_shape_errors_list_keys(tmp_path):
    state = trained_state()
    broken = dict(state)
    broken.pop("head.bias")
    broken["extra.weight"] = torch.zeros(2)
    torch.save(broken, tmp_path / "bad.pt")
    with pytest.raises(ScalpelError) as info:
        load_weights(make_model(4), tmp_path / "bad.pt")
    msg = str(info.value)
    assert "missing 1: head.bias" in msg and "unexpected 1: extra.weight" in msg
    torch.save(trained_state(), tmp_path / "w4.pt")
    with pytest.raises(ScalpelError, match="wrong shape"):
        load_weights(make_model(8), tmp_path / "w4.pt")


class Opaque:
    """A pickled class: weights_only loading must refuse it."""

    def __init__(self):
        self.w = torch.ones(2)


def test_pickled_objects_need_trust(tmp_path):
    state = trained_state()
    torch.save({"model": state, "extra": Opaque()}, tmp_path / "pickled.pt")
    with pytest.raises(ScalpelError, match="--trust"):
        load_weights(make_model(4), tmp_path / "pickled.pt")
    model = make_model(4)
    load_weights(model, tmp_path / "pickled.pt", trust=True)
    assert_loaded(model, state)


def test_bad_paths(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_weights(make_model(4), tmp_path / "nope.pt")
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError, match=r"no \.metadata"):
        load_weights(make_model(4), tmp_path / "dir")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ScalpelError):
        load_weights(make_model(4), tmp_path / "junk.pt")


def test_dcp_folder(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = trained_state()
    dcp.save({"model": {f"module.{k}": v for k, v in state.items()}}, checkpoint_id=str(tmp_path / "step-1"))
    model = make_model(4)
    info = load_weights(model, tmp_path / "step-1")
    assert info.source == "dcp:step-1" and info.stripped == {"module.": 6}
    assert_loaded(model, state)


def test_checkpointer_root_picks_latest_committed_step(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torchscalpel.distributed import manifest

    root = tmp_path / "ckpts"
    states = {}
    for step in (1, 2, 3):
        torch.manual_seed(step)
        states[step] = make_model(4).state_dict()
        folder, tmp = manifest.step_dir(root, step), manifest.tmp_dir(root, step)
        dcp.save({"model": states[step], "optim": {"step": torch.tensor(step)}}, checkpoint_id=str(tmp))
        if step < 3:
            manifest.commit(tmp, folder, step)
        else:  # step 3 was interrupted before its manifest and COMMIT marker
            tmp.rename(folder)
    model = make_model(4)
    info = load_weights(model, root)
    assert info.source == "dcp:step-000000002" and info.nested_key == "model"
    assert any("step-000000003" in n for n in info.notes)
    assert_loaded(model, states[2])
    for step in (1, 2):
        (root / f"step-{step:09d}" / "COMMIT").unlink()
    with pytest.raises(ScalpelError, match="no checkpoint that verifies"):
        load_weights(make_model(4), root)
