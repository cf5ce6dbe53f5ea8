"""`scalpel export` refusals of the new flags: exit 2, one sentence, before anything is exported."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscalpel.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODEL = f"{FIXTURES / 'image_pipeline.py'}:make"


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (
            ["--transform", f"{FIXTURES / 'bad_transforms.py'}:WITH_LAMBDA"],
            "The transform Lambda(<lambda>) (step 1",
        ),
        (["--transform", f"{FIXTURES / 'bad_transforms.py'}:WITH_FLIP"], "RandomHorizontalFlip (step 0"),
        (["--opset", "12"], "--opset 12 is not supported here"),
        (["--dynamic", "seq,batch"], "the first dimension must be 'batch'"),
        (["--preprocess", '{"steps": [{"op": "blur"}]}'], "op 'blur' is not one of"),
        (
            ["--calibration", "missing.npy", "--quantize", "int8-static"],
            "--calibration missing.npy does not exist",
        ),
        (["--raw-example", "missing.npy"], "--raw-example missing.npy does not exist"),
        (["--precision", "int4"], "--precision takes a comma list of fp16, bf16, not 'int4'."),
        (["--precision", "fp16", "--formats", "exported"], "--precision fp16 converts the ONNX export"),
        (["--transform-from", "no-such-run"], "--transform-from no-such-run: there is no run record at"),
        (
            ["--transform", f"{FIXTURES / 'text_tokenizer.py'}:tokenize"],
            "is a Python function that takes the input; it cannot be recorded as data",
        ),
    ],
)
def test_refusals(tmp_path, capsys, flags, words):
    err = _refused(
        capsys,
        ["export", "--model", MODEL, "--example", "float32[1,3,16,16]", "--out", str(tmp_path / "b"), *flags],
    )
    assert words in err
    assert not (tmp_path / "b").exists()
