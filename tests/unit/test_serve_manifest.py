"""Tampered bundle manifests: `scalpel serve` refuses each in one sentence (exit 2) before loading a model."""

from __future__ import annotations

import json
import os

import pytest

from fixtures.serve_bundles import LinearRunner, linear_bundle, linear_manifest
from torchscalpel.cli.main import main
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.serve.backends import check_runner
from torchscalpel.ship.bundle import MANIFEST, verify_bundle


def _set(path: str, value):
    def edit(m):
        *parents, last = path.split(".")
        node = m
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return m

    return edit


def _drop(key: str):
    def edit(m):
        del m[key]
        return m

    return edit


TAMPERED = {
    "format_version abc": _set("format_version", "abc"),
    "format_version number": _set("format_version", 1.0),
    "files as a list": _set("files", ["model.onnx"]),
    "files hash not hex": _set("files", {"model.onnx": "xyz"}),
    "inputs empty": _set("inputs", []),
    "inputs a dict": _set("inputs", {"x": 1}),
    "outputs empty": _set("outputs", []),
    "shape 3.55 PiB": _set("inputs.0.shape", [None, 1 << 20, 1 << 20, 1 << 12]),
    "shape negative": _set("inputs.0.shape", [None, 1, -8, 8]),
    "shape float": _set("inputs.0.shape", [None, 1, 8.5, 8]),
    "shape string": _set("inputs.0.shape", "[None, 1, 8, 8]"),
    "shape zero": _set("inputs.0.shape", [None, 0, 8, 8]),
    "shape no dims": _set("inputs.0.shape", []),
    "inner dynamic dim": _set("inputs.0.shape", [None, None, 8, 8]),
    "dtype unknown": _set("inputs.0.dtype", "complex1024"),
    "dtype object": _set("inputs.0.dtype", "O"),
    "name empty": _set("inputs.0.name", ""),
    "name number": _set("inputs.0.name", 7),
    "duplicate input names": lambda m: {**m, "inputs": m["inputs"] * 2},
    "max_batch 0": _set("max_batch", 0),
    "max_batch negative": _set("max_batch", -3),
    "max_batch string": _set("max_batch", "32"),
    "max_batch huge": _set("max_batch", 10**20),
    "parity passed string": _set("parity.passed", "false"),
    "parity passed 1": _set("parity.passed", 1),
    "parity missing": _drop("parity"),
    "parity a list": _set("parity", [True]),
    "model a string": _set("model", "Linear"),
    "artifacts a list": _set("artifacts", ["model.onnx"]),
    "artifact path": _set("artifacts", {"onnx": "../model.onnx"}),
    "range on a float input": _set("inputs.0.range", [0, 10]),
    "static batch disagrees": lambda m: {**m, "inputs": [{**m["inputs"][0], "shape": [3, 1, 8, 8]}]},
}


def _write(folder, manifest=None, raw: bytes | None = None):
    folder.mkdir(exist_ok=True)
    (folder / MANIFEST).write_bytes(raw if raw is not None else json.dumps(manifest).encode())
    return folder


@pytest.fixture(autouse=True)
def _no_model(monkeypatch):
    """A manifest must be refused before any model loads (these bundles hold no model file at all)."""
    import torchscalpel.serve.backends as backends

    def reached(*_a, **_k):
        raise AssertionError("the manifest was accepted and a model load was attempted")

    monkeypatch.setattr(backends, "load_runner", reached)


def _refused(capsys, folder) -> str:
    with pytest.raises(UsageError) as info:
        verify_bundle(folder)
    assert "\n" not in str(info.value)
    assert main(["serve", str(folder), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("case", list(TAMPERED))
def test_tampered_manifest_is_refused_in_one_sentence(tmp_path, capsys, case):
    folder = _write(tmp_path / "b", TAMPERED[case](linear_manifest()))
    _refused(capsys, folder)


def test_untampered_manifest_passes_the_schema(tmp_path):
    folder = _write(tmp_path / "b", linear_manifest())
    assert verify_bundle(folder).max_batch == 8


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"format": "torchscalpel-bundle", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"\xff\xfe{}",
        b"",
        b"null",
        b"{" + b" " * (17 << 20) + b"}",
    ],
)
def test_unparseable_or_deep_manifest_is_one_sentence(tmp_path, capsys, raw):
    _refused(capsys, _write(tmp_path / "b", raw=raw))


def test_symlink_loops_are_one_sentence(tmp_path, capsys):
    folder = tmp_path / "b"
    folder.mkdir()
    os.symlink(folder / "loop-a", folder / "loop-b")
    os.symlink(folder / "loop-b", folder / "loop-a")
    m = linear_manifest()
    m["files"] = {"loop-a": "0" * 64}
    _write(folder, m)
    err = _refused_any(capsys, folder)
    assert "loop-a" in err
    os.unlink(folder / MANIFEST)
    os.symlink(folder / "m2", folder / MANIFEST)
    os.symlink(folder / MANIFEST, folder / "m2")
    _refused(capsys, folder)


def _refused_any(capsys, folder) -> str:
    """Hash problems keep their exit 1 (documented); the point is one sentence, no traceback."""
    with pytest.raises(ScalpelError):
        verify_bundle(folder)
    assert main(["serve", str(folder), "--port", "0"]) in (1, 2)
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_outputs_naming_more_tensors_than_the_model_returns(tmp_path):
    bundle = linear_bundle(tmp_path)
    bundle.manifest["outputs"].append({"name": "extra", "dtype": "float32", "shape": [None, 3]})
    with pytest.raises(UsageError, match="names 2 outputs but the model returns 1"):
        check_runner(bundle, LinearRunner())
    bundle.manifest["outputs"] = [{"name": "logits", "dtype": "float32", "shape": [None, 11]}]
    with pytest.raises(UsageError, match="has shape"):
        check_runner(bundle, LinearRunner())
    bundle.manifest["outputs"] = [{"name": "logits", "dtype": "float32", "shape": [None, 10]}]
    check_runner(bundle, LinearRunner())


def _cli_refused(capsys, folder) -> str:
    assert main(["serve", str(folder), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_serve_cli_refuses_a_model_the_manifest_does_not_describe(tmp_path, capsys, monkeypatch):
    import torchscalpel.serve.backends as backends

    m = linear_manifest()
    m["outputs"] = m["outputs"] * 2
    m["outputs"][1] = {**m["outputs"][1], "name": "second"}
    folder = _write(tmp_path / "b", m)
    monkeypatch.setattr(backends, "load_runner", lambda *a, **k: LinearRunner())
    err = _cli_refused(capsys, folder)
    assert "names 2 outputs" in err
    m["inputs"][0]["shape"] = [None, 1, 4, 4]  # 16 features: the 64x10 matmul fails
    _write(folder, m)
    err = _cli_refused(capsys, folder)
    assert "does not take the inputs" in err
