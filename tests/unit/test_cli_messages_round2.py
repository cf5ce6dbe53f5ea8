"""Bad input to the commands, second round (issue 30, items 10 and 11): one sentence, the documented exit
code, no traceback, nothing created by a mistyped value. In process (``main([...])``), no subprocess."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.record import RunRecord, StepRecord, save_record

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


def _run(tmp_path: Path, name: str) -> Path:
    steps = [StepRecord(index=i, warmup=False, total_ms=10.0 + i, forward_ms=4.0) for i in range(5)]
    folder = tmp_path / name
    folder.mkdir()
    save_record(RunRecord(name=name, status="complete", exit_code=0, steps=steps), folder)
    return folder


def _one_sentence(err: str) -> str:
    err = err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    return err


@needs_dev_full
def test_compare_json_to_a_full_device_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    assert main(["compare", str(a), str(b), "--json", str(FULL)]) == 2
    err = _one_sentence(capsys.readouterr().err)
    assert "Could not write --json /dev/full" in err and "No space left on device" in err
    assert stat.S_ISCHR(os.stat(FULL).st_mode)  # still the device


@needs_dev_full
def test_profile_json_copy_to_a_full_device_is_a_usage_error_and_run_json_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchscalpel.errors import UsageError
    from torchscalpel.stages.profile import finish_profile

    record = RunRecord(name="r", status="complete", exit_code=0)
    with pytest.raises(UsageError, match="Could not write --json /dev/full: No space left on device"):
        finish_profile(record, tmp_path / "out", write_report=False, json_path=FULL)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["name"] == "r"  # nothing measured lost
    assert "run folder:" in capsys.readouterr().err  # and the summary of it is still shown


@pytest.mark.parametrize("value", ["99999999999999999999999", "1025", "0"])
def test_env_nproc_per_node_is_bounded(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--nproc-per-node", value]) == 2
    err = _one_sentence(capsys.readouterr().err)
    # below 1 and past 2^63 the shared number rule answers while parsing (test_number_rule.py), past 1024 env
    assert (
        f"--nproc-per-node must be at least 1 and {'at most 1024' if value == '1025' else 'below 2^63'}"
        in err
    )


def test_doctor_static_sarif_says_a_file_was_not_analysed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import torch\nx = (\n")
    assert main(["doctor", "--static", "bad.py", "--sarif", "out.sarif"]) == 0
    assert "NOT ANALYSED bad.py" in capsys.readouterr().out
    run = json.loads((tmp_path / "out.sarif").read_text())["runs"][0]
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (note,) = invocation["toolExecutionNotifications"]
    assert note["message"]["text"].startswith("not analysed: '(' was never closed")
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.py"
    assert main(["doctor", "--static", "bad.py", "--fail-on", "error"]) == 1  # a gate never passes it


def test_doctor_static_sarif_of_clean_code_has_no_invocation_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("x = 1\n")
    assert main(["doctor", "--static", "ok.py", "--sarif", "out.sarif"]) == 0
    assert "invocations" not in json.loads((tmp_path / "out.sarif").read_text())["runs"][0]


@pytest.mark.parametrize("uri", ["::bad::", "htp://host", "http://", "http://host:port"])
def test_mlflow_uri_is_checked_before_the_run_and_makes_no_folder(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    assert main(["profile", "--out", "p", "--mlflow", uri, "train.py"]) == 2
    err = _one_sentence(capsys.readouterr().err)
    assert f"--mlflow {uri!r}" in err and "http(s)://HOST" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no '::bad::', no run folder


@pytest.mark.parametrize("uri", ["mlruns", "file:///tmp/store", "http://127.0.0.1:5000", "sqlite:///m.db"])
def test_good_mlflow_uris_are_accepted(uri: str) -> None:
    from torchscalpel.tracking.sink import mlflow_uri_problem

    assert mlflow_uri_problem(uri) is None


def test_compare_on_a_non_json_file_is_a_usage_error_like_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path, "a")
    text = tmp_path / "notes.json"
    text.write_text("this is not JSON\n")
    assert main(["compare", str(a), str(text)]) == 2
    err = _one_sentence(capsys.readouterr().err)
    assert str(text) in err and "not valid JSON" in err
    assert main(["report", str(text)]) == 2
    _one_sentence(capsys.readouterr().err)
    (tmp_path / "list.json").write_text("[1, 2]\n")
    assert main(["compare", str(a), str(tmp_path / "list.json")]) == 2
    assert "expected a JSON object" in _one_sentence(capsys.readouterr().err)


def test_token_file_that_is_a_folder_or_a_device_is_named_so(tmp_path: Path) -> None:
    from torchscalpel.errors import UsageError
    from torchscalpel.serve.security import read_token

    with pytest.raises(UsageError, match=r"--token-file .* is a folder; name the file"):
        read_token(tmp_path)
    with pytest.raises(UsageError, match=r"--token-file /dev/null is not a regular file"):
        read_token(Path("/dev/null"))
    with pytest.raises(UsageError, match="does not exist"):
        read_token(tmp_path / "missing")


def test_plan_batch_of_the_wrong_shape_is_one_sentence_with_one_full_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny_factory.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = main(["plan", "--model", "tiny_factory:make", "--batch", "x=float32[8,5]", "--no-max-batch"])
    assert code == 2
    err = _one_sentence(capsys.readouterr().err)
    assert "failed in op aten.addmm.default: RuntimeError:" in err
    assert err.endswith("X [4, 2].") and not err.endswith("..")
