"""Checkpoint integrity (issue 19): no code runs from a checkpoint, readers verify before parsing,
a broken newest step is moved aside, a second writer is refused."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import run_cli
from torchscalpel import distributed as sd
from torchscalpel.distributed import manifest

pytestmark = pytest.mark.dist  # these tests start a one-rank process group

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "digits_model.py"


class _Payload:
    """Unpickling this creates ``marker``: what a malicious ``.metadata`` would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def recommit(folder: Path) -> None:
    """Rewrite ``folder``'s manifest over its current files, as someone who can write the folder can."""
    step = int(folder.name.split("-")[1])
    tmp = folder.with_name(".re-" + folder.name)
    os.rename(folder, tmp)
    (tmp / manifest.MANIFEST).unlink()
    (tmp / manifest.COMMIT).unlink()
    manifest.commit(tmp, folder, step)


def _model_ckpt(root: Path, steps=(1,)) -> sd.Checkpointer:
    from fixtures.digits_model import make_model

    torch.manual_seed(0)
    model = make_model(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = sd.Checkpointer(root, model=model, optimizer=opt, sigterm=False, keep=5)
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        ckpt.save(step)
    return ckpt


def test_metadata_payload_never_runs(single_rank, tmp_path):
    marker = tmp_path / "pwned"
    ckpt = _model_ckpt(tmp_path / "ck")
    folder = manifest.step_dir(tmp_path / "ck", 1)
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    recommit(folder)  # the manifest matches: only the unpickler stands in the way
    assert manifest.check(folder) is None
    with pytest.raises(sd.CheckpointError, match=r"Refusing to read .*builtins\.exec"):
        ckpt.load()
    assert not marker.exists()
    with pytest.raises(sd.CheckpointError, match=r"Refusing to read .*builtins\.exec"):
        sd.consolidate(tmp_path / "ck", tmp_path / "w.safetensors")
    assert not marker.exists()
    for target in (tmp_path / "ck", folder):
        r = run_cli(
            "export",
            "--model",
            f"{FIXTURE}:make_model",
            "--factory-args",
            '{"channels": 4}',
            "--weights",
            str(target),
            "--example",
            "float32[1,1,8,8]",
            "--formats",
            "exported",
            "--out",
            str(tmp_path / f"b-{target.name}"),
            cwd=tmp_path,
        )
        assert r.returncode != 0, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and "builtins.exec" in r.stderr, r.stderr
        assert not marker.exists()
    # The unpickler itself, on a plain pickle of the payload
    from torchscalpel.distributed.safedcp import read_metadata

    evil = tmp_path / "evil.metadata"
    evil.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(sd.CheckpointError, match="Refusing to read"):
        read_metadata(evil)
    assert not marker.exists()


def test_real_metadata_is_admitted(single_rank, tmp_path):
    """What torch writes (model + optimizer + plain values, several dtypes) passes the allow-list."""
    import torch.distributed.checkpoint as dcp

    from torchscalpel.distributed.safedcp import load_all, read_metadata

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "misc": {
            "bf": torch.ones(2, dtype=torch.bfloat16),
            "i": torch.arange(3),
            "n": 3,
            "s": "x",
            "t": (1, 2.5),
            "b": True,
            "none": None,
        },
    }
    dcp.save(state, checkpoint_id=str(tmp_path / "plain"))
    meta = read_metadata(tmp_path / "plain" / ".metadata")
    assert "model.0.weight" in meta.state_dict_metadata
    loaded = load_all(tmp_path / "plain")
    assert torch.equal(loaded["model"]["0.weight"], model.state_dict()["0.weight"])
    assert loaded["misc"]["s"] == "x" and loaded["misc"]["t"] == (1, 2.5)


def _export(tmp_path: Path, weights: Path, name: str):
    return run_cli(
        "export",
        "--model",
        f"{FIXTURE}:make_model",
        "--factory-args",
        '{"channels": 4}',
        "--weights",
        str(weights),
        "--example",
        "float32[1,1,8,8]",
        "--formats",
        "exported",
        "--out",
        str(tmp_path / name),
        cwd=tmp_path,
    )


def _flip_a_bit(folder: Path) -> None:
    shard = next(folder.glob("*.distcp"))
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    shard.write_bytes(bytes(blob))


def test_export_refuses_a_corrupted_shard_or_falls_back(single_rank, tmp_path):
    from safetensors.torch import load_file

    root = tmp_path / "ck"
    ckpt = _model_ckpt(root, steps=(1,))
    step1 = {k: v.clone() for k, v in ckpt.model.state_dict().items()}
    with torch.no_grad():
        for p in ckpt.model.parameters():
            p.add_(1.0)
    ckpt.save(2)
    newest = manifest.step_dir(root, 2)
    _flip_a_bit(newest)
    with pytest.raises(sd.CheckpointError, match="does not match its SHA-256"):
        ckpt.load(newest)
    r = _export(tmp_path, newest, "b-step")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not match its SHA-256" in r.stderr and "Traceback" not in r.stderr
    assert "parity passed" not in r.stdout
    r = _export(tmp_path, root, "b-root")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step-000000002" in r.stdout and "exporting step-000000001" in r.stdout, r.stdout
    shipped = load_file(str(tmp_path / "b-root" / "model.safetensors"))
    assert all(torch.equal(shipped[k], v) for k, v in step1.items())
    _flip_a_bit(manifest.step_dir(root, 1))
    r = _export(tmp_path, root, "b-none")
    assert r.returncode == 1 and "no checkpoint that verifies" in r.stderr and "Traceback" not in r.stderr


def _break(folder: Path, how: str) -> None:
    if how == "truncated":
        shard = next(folder.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "no-manifest":
        (folder / manifest.MANIFEST).unlink()
    else:
        (folder / manifest.COMMIT).unlink()


@pytest.mark.parametrize("how", ["truncated", "no-manifest", "no-commit"])
def test_broken_newest_is_named_and_moved_aside(single_rank, tmp_path, caplog, how):
    root = tmp_path / "ck"
    _model_ckpt(root, steps=(1, 2))
    _break(manifest.step_dir(root, 2), how)
    ckpt = _model_ckpt(root, steps=())
    with caplog.at_level("WARNING", logger="torchscalpel.distributed"):
        assert ckpt.load() == 1
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "skipped step-000000002" in warning and "moved it aside to step-000000002.broken-" in warning
    assert [p.name for _, p in manifest.committed_steps(root)] == ["step-000000001"]
    assert len(list(root.glob("step-000000002.broken-*"))) == 1
    ckpt.save(2)  # the run continues through the broken step's number
    assert manifest.latest(root) == manifest.step_dir(root, 2)
    assert manifest.check(manifest.step_dir(root, 2)) is None


def test_save_over_a_broken_step_moves_it_aside(single_rank, tmp_path):
    """A run that resumes from an explicit path (so never called latest) still saves that step."""
    root = tmp_path / "ck"
    _model_ckpt(root, steps=(1, 2))
    _break(manifest.step_dir(root, 2), "no-commit")
    ckpt = _model_ckpt(root, steps=())
    assert ckpt.load(manifest.step_dir(root, 1)) == 1
    ckpt.save(2)
    assert manifest.check(manifest.step_dir(root, 2)) is None
    assert len(list(root.glob("step-000000002.broken-*"))) == 1
    with pytest.raises(sd.CheckpointError, match="never overwritten"):
        ckpt.save(2)  # a whole step is still never replaced


_WRITER = """
import sys, torch
from torch import nn
from torchscalpel import distributed as sd
sd.setup(seed=0)
ckpt = sd.Checkpointer(sys.argv[1], model=nn.Linear(2, 2), sigterm=False)
ckpt.save(1)
print("holding", flush=True)
sys.stdin.read()
"""


def test_second_writer_process_is_refused(single_rank, tmp_path):
    import signal
    import subprocess

    from helpers import cli_env

    root = tmp_path / "ck"
    env = cli_env()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    other = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "holding", other.stderr.read()
        with pytest.raises(
            sd.CheckpointError, match=rf"being written by another process \(pid {other.pid} on "
        ):
            sd.Checkpointer(root, model=nn.Linear(2, 2), sigterm=False)
        assert manifest.check(manifest.step_dir(root, 1)) is None  # the other run's step is untouched
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=30)
    # A killed writer leaves no lock behind; within one process the lock is shared.
    first = sd.Checkpointer(root, model=nn.Linear(2, 2), sigterm=False)
    second = sd.Checkpointer(root, model=nn.Linear(2, 2), sigterm=False)
    second.close()
    first.save(2)
    first.close()
    out = subprocess.run(
        [sys.executable, "-c", _WRITER.replace("ckpt.save(1)", "ckpt.save(3)"), str(root)],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "holding" in out.stdout, out.stderr
    shutil.rmtree(root)


def test_metadata_pointing_outside_the_folder_is_refused(tmp_path):
    import dataclasses

    import torch.distributed.checkpoint as dcp

    from torchscalpel.distributed.safedcp import read_metadata

    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    path = tmp_path / "plain" / ".metadata"
    meta = read_metadata(path)
    meta.storage_data = {
        k: dataclasses.replace(v, relative_path="../../secret.distcp") for k, v in meta.storage_data.items()
    }
    path.write_bytes(pickle.dumps(meta))
    with pytest.raises(sd.CheckpointError, match="not a file of the checkpoint folder"):
        read_metadata(path)


def test_read_only_folder_still_resumes(single_rank, tmp_path, monkeypatch):
    root = tmp_path / "ck"
    _model_ckpt(root, steps=(1,)).close()

    def read_only(folder):
        raise PermissionError(13, "Permission denied", str(folder / manifest.LOCK))

    monkeypatch.setattr(manifest, "lock_root", read_only)  # what a read-only mount does (root ignores chmod)
    assert _model_ckpt(root, steps=()).load() == 1


def test_signed_checkpoint_detects_a_rewritten_manifest(single_rank, tmp_path):
    from fixtures.digits_model import make_model
    from torchscalpel.ship.weights import load_weights

    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    root = tmp_path / "ck"
    model = make_model(4)
    ckpt = sd.Checkpointer(root, model=model, sigterm=False, sign_key=key)
    folder = ckpt.save(1)
    assert ckpt.load() == 1
    assert load_weights(make_model(4), root, sign_key=key).source == "dcp:step-000000001"
    # Someone who can write the folder changes a file and rewrites the manifest to match:
    (folder / "shared.json").write_text(
        (folder / "shared.json").read_text().replace('"step": 1', '"step": 7')
    )
    recommit(folder)
    assert manifest.check(folder) is None  # unkeyed SHA-256 cannot tell
    with pytest.raises(sd.CheckpointError, match="carries no signature"):
        ckpt.load()
    with pytest.raises(sd.CheckpointError, match="carries no signature"):
        sd.consolidate(root, tmp_path / "w.safetensors", sign_key=key)
    with pytest.raises(sd.CheckpointError, match="carries no signature"):
        load_weights(make_model(4), folder, sign_key=key)
    other = tmp_path / "other"
    other.write_bytes(os.urandom(32))
    tmp = folder.with_name(".re")
    os.rename(folder, tmp)
    (tmp / manifest.MANIFEST).unlink()
    (tmp / manifest.COMMIT).unlink()
    manifest.commit(tmp, folder, 1, key=other.read_bytes())
    with pytest.raises(sd.CheckpointError, match="does not match its signature"):
        ckpt.load()
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    with pytest.raises(sd.CheckpointError, match="at least 16"):
        sd.Checkpointer(root, model=model, sigterm=False, sign_key=short)


def test_a_forked_child_does_not_keep_the_lock(single_rank, tmp_path):
    """DataLoader workers are forked: one that outlives its killed parent must not block a relaunch."""
    import subprocess

    from helpers import cli_env

    root = tmp_path / "ck"
    script = _WRITER.replace(
        "ckpt.save(1)", "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)"
    )
    env = cli_env()
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(root)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout.readline().strip() == "holding", parent.stderr.read()
        parent.kill()
        parent.wait(timeout=30)
        ckpt = sd.Checkpointer(root, model=nn.Linear(2, 2), sigterm=False)  # the child still runs
        ckpt.close()
    finally:
        import signal

        os.killpg(parent.pid, signal.SIGKILL)


def test_export_sign_key_flag_refuses_a_checkpoint_signed_with_another_key(single_rank, tmp_path):
    from fixtures.digits_model import make_model

    key, other = tmp_path / "key", tmp_path / "other"
    key.write_bytes(os.urandom(32))
    other.write_bytes(os.urandom(32))
    root = tmp_path / "ck"
    sd.Checkpointer(root, model=make_model(4), sigterm=False, sign_key=key).save(1)
    common = [
        "export",
        "--model",
        f"{FIXTURE}:make_model",
        "--factory-args",
        '{"channels": 4}',
        "--weights",
        str(root / "step-000000001"),
        "--example",
        "float32[1,1,8,8]",
        "--formats",
        "exported",
    ]
    bad = run_cli(*common, "--sign-key", str(other), "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert bad.returncode != 0 and "signature" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    good = run_cli(*common, "--sign-key", str(key), "--out", str(tmp_path / "good"), cwd=tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    # The bundle is signed too: serve --sign-key checks it before anything else.
    from torchscalpel.errors import ScalpelError
    from torchscalpel.ship.bundle import MANIFEST, SIGNATURE, verify_bundle

    bundle = tmp_path / "good"
    assert (bundle / SIGNATURE).is_file()
    verify_bundle(bundle, key=key.read_bytes())
    with pytest.raises(ScalpelError, match="does not match its signature"):
        verify_bundle(bundle, key=other.read_bytes())
    manifest = (bundle / MANIFEST).read_text()
    (bundle / MANIFEST).write_text(manifest.replace('"latency_threads": 1', '"latency_threads": 2'))
    with pytest.raises(ScalpelError, match="does not match its signature"):
        verify_bundle(bundle, key=key.read_bytes())
    served = run_cli("serve", str(bundle), "--sign-key", str(key), "--port", "0", cwd=tmp_path, timeout=60)
    assert served.returncode == 1 and "signature" in served.stderr and "Traceback" not in served.stderr, (
        served.stderr
    )
