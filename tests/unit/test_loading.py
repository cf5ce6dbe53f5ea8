"""`MODULE:NAME` loading shared by plan --model/--loss and export --model: files, dotted modules, one set of errors."""

from __future__ import annotations

import pytest
import torch

from torchscalpel.errors import UsageError
from torchscalpel.loading import load_callable


def test_loads_from_a_dotted_module_and_from_a_file_that_imports_its_sibling(tmp_path):
    assert load_callable("torch.nn:Linear", flag="--model") is torch.nn.Linear
    (tmp_path / "helpers_xyz.py").write_text("WIDTH = 2\n")
    f = tmp_path / "factory_mod.py"
    f.write_text(
        "import torch\nfrom helpers_xyz import WIDTH\ndef build(width=3):\n    return torch.nn.Linear(width, WIDTH)\n"
    )
    build = load_callable(f"{f}:build", flag="--model")
    assert build(width=4).in_features == 4 and build().out_features == 2


def test_two_files_with_the_same_name_do_not_collide(tmp_path):
    for sub, value in (("a", 1), ("b", 2)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "model.py").write_text(f"def value():\n    return {value}\n")
    assert load_callable(f"{tmp_path / 'a' / 'model.py'}:value", flag="--model")() == 1
    assert load_callable(f"{tmp_path / 'b' / 'model.py'}:value", flag="--model")() == 2


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (
            "nocolon",
            "--loss 'nocolon' must be MODULE:NAME, e.g. 'mypkg.models:build' or 'path/models.py:build'.",
        ),
        ("torch.nn:", "--loss 'torch.nn:' must be MODULE:NAME"),
        ("/no/such/file.py:f", "--loss: file /no/such/file.py does not exist; check the path before ':f'."),
        (
            "no_such_module_xyz:f",
            "--loss: cannot import 'no_such_module_xyz' (ModuleNotFoundError: No module named 'no_such_module_xyz'); "
            "check the module name and that it imports on its own, or give a .py path.",
        ),
        (
            "torch.nn:NoSuch",
            "--loss: 'torch.nn' has no attribute 'NoSuch'; name a function or class defined there.",
        ),
        (
            "torch:__version__",
            "--loss: torch:__version__ is a TorchVersion, not callable; name a function or class.",
        ),
    ],
)
def test_each_error_is_one_sentence_starting_with_the_flag(ref, message):
    with pytest.raises(UsageError) as info:
        load_callable(ref, flag="--loss")
    assert str(info.value).startswith(message)


def test_a_file_that_raises_on_import_reports_the_first_line_of_the_exception(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('boom at import\\nsecond line')\n")
    with pytest.raises(UsageError) as info:
        load_callable(f"{f}:build", flag="--model")
    assert str(info.value) == (
        f"--model: cannot import '{f}' (RuntimeError: boom at import); check the module name and that it imports "
        "on its own, or give a .py path."
    )
    f.write_text("def build(:\n")
    with pytest.raises(UsageError, match=r"cannot import .*\(SyntaxError: "):
        load_callable(f"{f}:build", flag="--model")
