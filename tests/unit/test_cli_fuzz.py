"""A bad value for any flag of any command ends in one sentence on stderr and exit 2, before any work
(issue 19, items 14-15 and the per-command check).

Each case runs ``scalpel`` in-process (``cli.main.main``) and must fail in validation: no script is
started, nothing is allocated. ``serve`` has its own table (tests/unit/test_serve_fuzz.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from torchscalpel.cli.main import main

BAD_NUMBERS = ("-1", "nan", "x", "99999999999999999999")

# (command, flags): {S} a script that exists, {F} an existing file, {D} an existing folder.
CASES: list[tuple[str, ...]] = [
    # top level
    ("--bogus",),
    ("nosuchcommand",),
    # profile
    ("profile", "--steps", "-1", "--", "{S}"),
    ("profile", "--steps", "abc", "--", "{S}"),
    ("profile", "--warmup", "-1", "--", "{S}"),
    ("profile", "--warmup", "x", "--", "{S}"),
    ("profile", "--out", "/proc/scalpel-x", "--", "{S}"),
    ("profile", "--out", "{F}", "--", "{S}"),
    ("profile", "--json", "{D}", "--", "{S}"),
    ("profile", "--json", "/proc/x.json", "--", "{S}"),
    ("profile", "--", "{D}/missing.py"),
    ("profile", "--step-kind", "nope", "--", "{S}"),
    ("profile", "--profile-steps", "x", "--", "{S}"),
    ("profile", "--bogus", "--", "{S}"),
    # doctor
    ("doctor", "--static", "{S}", "--json", "{D}"),
    ("doctor", "--static", "{S}", "--sarif", "{D}"),
    ("doctor", "--static", "{S}", "--sarif", "/proc/x.sarif"),
    ("doctor", "--static", "{D}/missing.py"),
    ("doctor", "--static", "{S}", "--fail-on", "fatal"),
    ("doctor", "--nproc", "0", "--", "{S}"),
    ("doctor", "--static", "{S}", "--", "{S}"),
    ("doctor",),
    ("doctor", "--steps", "-1", "--", "{S}"),
    ("doctor", "--out", "{F}", "--", "{S}"),
    ("doctor", "--out", "/proc/scalpel-x", "--", "{S}"),
    # tune / run
    ("tune", "--config", "{D}", "--", "{S}"),
    ("tune", "--out", "/proc/scalpel-x", "--", "{S}"),
    ("tune", "--json", "{D}", "--", "{S}"),
    ("tune", "--budget", "x", "--", "{S}"),
    ("tune", "--confirm", "x", "--", "{S}"),
    ("tune", "--steps", "-1", "--", "{S}"),
    ("run", "--config", "{D}", "--", "{S}"),
    ("run", "--out", "{F}", "--", "{S}"),
    # plan
    ("plan", "--out", "/proc/scalpel-x", "--", "{S}"),
    ("plan", "--json", "{D}", "--", "{S}"),
    ("plan", "--world-size", "x", "--", "{S}"),
    ("plan", "--precision", "fp3", "--", "{S}"),
    ("plan", "--strategy", "nope", "--", "{S}"),
    # analyze
    ("analyze", "{D}/missing.json"),
    ("analyze", "{F}", "--top", "0"),
    ("analyze", "{F}", "--top", "x"),
    ("analyze", "{F}", "--json", "{D}"),
    ("analyze", "{F}", "--html", "{D}"),
    ("analyze", "{F}", "--json", "/proc/x.json"),
    ("analyze", "{F}", "--json", "{D}/no/such/x.json"),
    ("analyze", "{D}"),
    # env
    ("env", "--json", "{D}"),
    ("env", "--json", "/proc/x.json"),
    ("env", "--probe-timeout", "x"),
    ("env", "--nproc-per-node", "x"),
    ("env", "--fail-on", "fatal"),
    # export (items 14-15): refused before torch is imported or anything allocated
    ("export", "--model", "m:f", "--example", "float32[1,1,99999,99999]"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--max-batch", "99999999999999999999"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--max-batch", "0"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--atol", "nan"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--rtol", "-1"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--atol", "inf"),
    ("export", "--model", "m:f", "--example", "float32[0,8]"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--out", "/proc/scalpel-x"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--json", "{D}"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--weights", "{D}/missing.safetensors"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--formats", "onnx", "--dynamic", "some"),
    ("export", "--example", "float32[1,8]"),
    # demo (item 15: --steps -1 ran two minutes, then failed)
    ("demo", "--steps", "-1"),
    ("demo", "--steps", "0"),
    ("demo", "--steps", "x"),
    ("demo", "--stages", "nope"),
    ("demo", "--stages", ","),
    ("demo", "--tune-budget", "nan"),
    ("demo", "--tune-budget", "-5"),
    ("demo", "--out", "/proc/scalpel-x"),
    ("demo", "--out", "{F}"),
    # launch (items 14-15)
    ("launch", "--rdzv-endpoint", "bad:port:x", "--", "{S}"),
    ("launch", "--rdzv-endpoint", "h:99999", "--", "{S}"),
    ("launch", "--rdzv-endpoint", "h:", "--", "{S}"),
    ("launch", "--plan", "--plan-device-memory", "10MiB", "--", "{S}"),
    ("launch", "--plan", "--plan-device-memory", "10M", "--", "{S}"),
    ("launch", "--plan", "--plan-device-memory", "-1GiB", "--", "{S}"),
    ("launch", "--plan-device-memory", "80GiB", "--", "{S}"),
    ("launch", "--nproc", "0", "--", "{S}"),
    ("launch", "--nproc", "x", "--", "{S}"),
    ("launch", "--max-restarts", "-1", "--", "{S}"),
    ("launch", "--out", "/proc/scalpel-x", "--", "{S}"),
    ("launch", "--out", "{F}", "--", "{S}"),
    ("launch", "--", "{D}/missing.py"),
    ("launch",),
    ("launch", "--nnodes", "2", "--", "{S}"),
    ("launch", "--profile", "--doctor", "--", "{S}"),
    # report
    ("report", "{D}/missing"),
]
# Every numeric flag of the commands above, with every kind of bad number (the table's random part).
NUMERIC = [
    ("analyze", "{F}", "--top"),
    ("demo", "--steps"),
    ("export", "--model", "m:f", "--example", "float32[1,8]", "--max-batch"),
    ("launch", "--nproc"),
    ("launch", "--max-restarts"),
]
CASES += [
    (*head, bad) + (("--", "{S}") if head[0] == "launch" else ())
    for head, bad in itertools.product(NUMERIC, BAD_NUMBERS)
    if not (head[-1] in ("--max-restarts", "--top") and bad == "99999999999999999999")
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fuzz")
    script = root / "train.py"
    script.write_text("raise SystemExit('the script must never run in a validation test')\n")
    afile = root / "trace.json"
    afile.write_text('{"traceEvents": []}')
    folder = root / "folder"
    folder.mkdir()
    return {"{S}": str(script), "{F}": str(afile), "{D}": str(folder)}


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
def test_bad_input_is_one_sentence_and_exit_2(
    case: tuple[str, ...],
    places: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # default run folders (scalpel-runs/) land here, never in the checkout
    argv = [places.get(a, a) for a in case]
    argv = [a.replace("{D}", places["{D}"]) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}: {err}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "error:" in lines[0]
    assert not (tmp_path / "scalpel-runs").exists(), "work started (a run folder was made) before the refusal"


EXPORT_WITH_A_REAL_MODEL = [
    ("--example", "float32[1,1,99999,99999]"),  # 80 GB at batch 32: refused by arithmetic, never allocated
    ("--example", "float32[1,8]", "--max-batch", "99999999999999999999"),
    ("--example", "float32[1,8]", "--atol", "nan"),  # ran the whole export before
    ("--example", "float32[1,8]", "--rtol", "inf"),
]


@pytest.mark.parametrize(
    "flags", EXPORT_WITH_A_REAL_MODEL, ids=[" ".join(f) for f in EXPORT_WITH_A_REAL_MODEL]
)
def test_export_refuses_bad_numbers_with_a_model_that_loads(
    flags: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(8, 2)\n")
    code = main(
        [
            "export",
            "--model",
            f"{tmp_path / 'model.py'}:make",
            "--formats",
            "exported",
            "--out",
            str(tmp_path / "bundle"),
            *flags,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert not (tmp_path / "bundle").exists()
