"""``scalpel demo``: stage choice and the bundled examples.

The demo itself runs once in the suite, from the installed wheel (tests/integration/test_wheel_install.py), where
its stages, their folders and the one combined report are checked: a second run from the checkout cost ~70 s.
"""

from __future__ import annotations

import pytest

from helpers import run_cli


def test_unknown_demo_stage_is_a_usage_error():
    proc = run_cli("demo", "--stages", "profile,teleport")
    assert proc.returncode == 2
    assert "Unknown demo stage(s) teleport" in proc.stderr


def test_ship_stage_without_its_extras_is_skipped_with_the_install_command(tmp_path, monkeypatch):
    import argparse

    from torchscalpel.cli import demo
    from torchscalpel.cli.common import Target

    monkeypatch.setattr(demo, "SHIP_MODULES", {"torchscalpel_no_such_module": "nosuchdist"})
    ok, _, summary = demo._ship(Target(script=tmp_path / "char_transformer.py", args=[]), tmp_path, argparse.Namespace())
    assert ok and summary == 'skipped: needs nosuchdist (pip install "torchscalpel[all]")'
    assert demo._result_word(demo.StageResult("ship", ok, 0.0, "", summary)) == "skipped"


def test_bundled_examples_are_the_checkout_ones_and_copy_out(tmp_path):
    from helpers import REPO
    from torchscalpel.errors import UsageError
    from torchscalpel.examples import EXAMPLES_DIR, NAMES, copy_examples, example_script

    assert (REPO / "examples").resolve() == EXAMPLES_DIR  # through src/torchscalpel/example_scripts
    assert sorted(NAMES) == sorted(p.name for p in (REPO / "examples").glob("*.py"))
    dest = copy_examples(tmp_path / "ex")
    for name in NAMES:
        assert (dest / name).read_bytes() == example_script(name).read_bytes()
    with pytest.raises(UsageError, match=r"no bundled example nope\.py"):
        example_script("nope.py")
