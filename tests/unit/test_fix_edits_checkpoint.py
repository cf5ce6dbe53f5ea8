"""whole-model-save changes the checkpoint's format, so fix changes every reader of it with the save
(fix/editors/checkpoint.py), or refuses naming the line; unsafe-torch-load converts its whole-module
writer with it. Pure edits on source text (the other-file search reads a tmp tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("libcst")

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit

RESUME = """import os
import torch
from torch import nn

CKPT = os.path.join("ckpt", "last.pt")
model = nn.Linear(8, 1)
if os.path.exists(CKPT):
    model = torch.load(CKPT, weights_only=False, map_location="cpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    model.train()
    torch.save(model, CKPT)
"""

WORD_LM = """import torch
model = RNNModel(ntokens)
for epoch in range(1, 3):
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, 'wb') as f:
            torch.save(model, f)
# Load the best saved model.
with open(args.save, 'rb') as f:
    model = torch.load(f)
    model.rnn.flatten_parameters()
"""


def _save(line: int, file: str = "") -> Edit:
    return Edit(kind="save_state_dict", line=line, callee="save", kwargs=(("file", file),) if file else ())


def test_the_resume_reader_loads_the_state_dict_into_the_model_built_before_it() -> None:
    new, out = apply_edit(RESUME, _save(12))
    assert out.status == "applied", out.reason
    assert new == RESUME.replace(
        '    model = torch.load(CKPT, weights_only=False, map_location="cpu")',
        '    model.load_state_dict(torch.load(CKPT, weights_only=True, map_location="cpu"))',
    ).replace("torch.save(model, CKPT)", "torch.save(model.state_dict(), CKPT)")
    assert apply_edit(new, _save(12))[1].status == "already"


def test_word_language_model_reload_through_open_files_is_rewritten() -> None:
    new, out = apply_edit(WORD_LM, _save(6))
    assert out.status == "applied", out.reason
    assert "            torch.save(model.state_dict(), f)\n" in new
    assert (
        "    model.load_state_dict(torch.load(f, weights_only=True))\n    model.rnn.flatten_parameters()\n"
        in new
    )
    assert new.count("\n") == WORD_LM.count("\n")  # one line each: no recorded line below moves


def test_unsafe_load_of_a_whole_module_converts_its_writer_too() -> None:
    safe = Edit(kind="safe_load", line=9, callee="load")
    new, out = apply_edit(WORD_LM, safe)
    assert out.status == "applied", out.reason
    assert new == apply_edit(WORD_LM, _save(6))[0]
    assert apply_edit(new, _save(6))[1].status == "already"
    plain = "import torch\nstate = torch.load(p, weights_only=False)\n"
    assert apply_edit(plain, Edit(kind="safe_load", line=2, callee="load"))[0] == plain.replace(
        "False", "True"
    )
    _, pickled = apply_edit("import pickle\nvocab = pickle.load(f)\n", Edit(kind="safe_load", line=2))
    assert pickled.status == "refused" and "pickle.load, which has no weights_only" in pickled.reason


def test_a_load_the_run_saw_hold_more_than_weights_is_left_unless_its_writer_converts() -> None:
    """What the runtime saw the file hold travels with the edit (doctor's evidence): the script's own
    objects or a module with no writer here to convert would not load weights-only on the next start."""
    from torchscalpel.fix.doctor_plan import loaded_beyond_weights

    held = "tensors, plain Python data; globals a weights-only load refuses: none"
    assert loaded_beyond_weights({"evidence": ["1 call(s)", f"the file held {held}"]}) == ""
    stats = {
        "evidence": ["the file held __main__.Stats; globals a weights-only load refuses: __main__.Stats"]
    }
    assert loaded_beyond_weights(stats) == "__main__.Stats"
    assert loaded_beyond_weights({"evidence": ["the file held tensors, module Net"]}) == "module Net"
    assert loaded_beyond_weights({"evidence": []}) == ""  # a static finding: nothing was loaded
    plain = "import torch\nstate = torch.load(p, weights_only=False)\n"
    kept, out = apply_edit(
        plain, Edit(kind="safe_load", line=2, callee="load", kwargs=(("held", "x.Stats"),))
    )
    assert out.status == "refused" and kept == plain
    assert "held x.Stats when the run loaded it, which weights_only=True refuses" in out.reason
    # the same evidence on a load whose writer in this file saves the whole module: the pair converts
    whole = Edit(kind="safe_load", line=9, callee="load", kwargs=(("held", "module RNNModel"),))
    assert apply_edit(WORD_LM, whole)[0] == apply_edit(WORD_LM, _save(6))[0]


@pytest.mark.parametrize(
    ("source", "line", "reason"),
    [
        (  # the model is built by the load itself: nothing to load a state_dict into
            "import torch\nif os.path.exists(P):\n    model = torch.load(P, weights_only=False)\n"
            "else:\n    model = Net()\ntorch.save(model, P)\n",
            6,
            "train.py:3 builds model by loading it, and no model is built before that line",
        ),
        (  # a new variable: loading into the training model would overwrite its weights
            "import torch\nmodel = Net()\ntorch.save(model, 'best.pt')\nbest = torch.load('best.pt')\n",
            3,
            "train.py:4 loads the checkpoint into best, not the saved model",
        ),
        (  # the result used in place
            "import torch\nmodel = Net()\ntorch.save(model, P)\nevaluate(torch.load(P))\n",
            3,
            "train.py:4 uses what torch.load reads in place",
        ),
        (  # a model loaded from a path fix cannot match to the saved one
            "import torch\nmodel = Net()\nmodel = torch.load(args.resume)\ntorch.save(model, args.out)\n",
            4,
            "train.py:3 loads model from args.resume, which fix cannot match to the path torch.save "
            "writes at line 4 (args.out)",
        ),
    ],
)
def test_a_reader_fix_cannot_rewrite_refuses_the_save_naming_its_line(
    source: str, line: int, reason: str
) -> None:
    new, out = apply_edit(source, _save(line, "/t/train.py"))
    assert out.status == "refused" and reason in out.reason, out.reason
    assert new == source


def test_a_reader_in_another_file_of_the_tree_refuses_the_save(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train").mkdir()
    script = tmp_path / "train" / "train.py"
    source = "import torch\nmodel = Net()\ntorch.save(model, 'ckpt/best.pt')\n"
    script.write_text(source, encoding="utf-8")
    (tmp_path / "eval.py").write_text(
        "import torch\n\nmodel = torch.load('train/ckpt/best.pt', weights_only=False)\n", encoding="utf-8"
    )
    _, out = apply_edit(source, _save(3, str(script)))
    assert out.status == "refused", out.reason
    assert out.reason.startswith("eval.py:3 also reads 'ckpt/best.pt' with torch.load"), out.reason
    (tmp_path / "eval.py").write_text("import torch\n\nx = torch.load('data.pt')\n", encoding="utf-8")
    assert apply_edit(source, _save(3, str(script)))[1].status == "applied"


def test_only_the_readers_of_the_saved_path_change() -> None:
    """A data file and a state_dict already loaded stay as they are; the reader of the saved path changes."""
    source = (
        "import torch\nmodel = Net()\ndata = torch.load('data.pt')\n"
        "model.load_state_dict(torch.load('init.pt'))\nif resume:\n    model = torch.load('m.pt')\n"
        "torch.save(model, 'm.pt')\n"
    )
    new, out = apply_edit(source, _save(7))
    assert out.status == "applied", out.reason
    assert new == source.replace(
        "    model = torch.load('m.pt')", "    model.load_state_dict(torch.load('m.pt', weights_only=True))"
    ).replace("torch.save(model, 'm.pt')", "torch.save(model.state_dict(), 'm.pt')")


def test_a_pickled_load_of_another_path_expression_refuses_the_save() -> None:
    source = (
        'import os\nimport torch\nCKPT = "ckpt/last.pt"\nmodel = Net()\n'
        'if os.path.exists(CKPT):\n    previous = torch.load(os.path.join("ckpt", "last.pt"), weights_only=False)\n'
        "torch.save(model, CKPT)\n"
    )
    _, out = apply_edit(source, _save(7, "/t/train.py"))
    assert out.status == "refused"
    assert out.reason.startswith(
        'train.py:6 loads a pickled object (weights_only=False) from os.path.join("ckpt", "last.pt"), which '
        "fix cannot match to the path torch.save writes at line 7 (CKPT)"
    ), out.reason
