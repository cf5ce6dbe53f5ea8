"""A record is data: scalpel fix checks every value it reads before planning an edit, builds code from
typed values, edits only the tree it runs from, and keeps each file's declared encoding.

Records are built in-process with the record API around a real script in ``tmp_path``; every forged
one is refused in one sentence naming the field or the file, with nothing written and nothing run
(the unit-test guard makes any process start raise, so a refused ``--verify`` that ran would fail).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.fix import code
from torchscalpel.fix.files import read_source, user_tree
from torchscalpel.fix.measured import MARK_FILE
from torchscalpel.fix.options import FixOptions
from torchscalpel.fix.stage import plan_and_edit, run
from torchscalpel.record import RunRecord, new_run_record, save_record

SCRIPT = """import torch

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
loader = torch.utils.data.DataLoader(data, batch_size=4)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
INJECTED = "__import__('pathlib').Path('PWNED').touch()"


def _site(script: Path, line: int, cls: str = "", **extra: Any) -> dict[str, Any]:
    return {"file": str(script), "line": line, "class": cls, "library": None, "used": True, **extra}


def _record(script: Path, settings: dict[str, Any]) -> RunRecord:
    """A tune record of ``script`` as tune writes one: the kept settings, the sites, the hashes."""
    record = new_run_record("tune", status="complete", target={"script": str(script), "args": []})
    record.provenance = {
        "code": {
            "script": {"path": script.name, "sha256": hashlib.sha256(script.read_bytes()).hexdigest()},
            "modules": {},
        }
    }
    record.sections["tune"] = {
        "settings": settings,
        "winner": {"verdict": "winner", "confirm_pairs": [[10.0, 8.0], [10.0, 8.5]]},
    }
    record.sections["sites"] = {
        "optimizers": [_site(script, 4, "SGD")],
        "dataloaders": [_site(script, 6, "DataLoader")],
        "model": _site(script, 3, "Linear"),
        "forward": _site(script, 8, "Linear", device="cpu", autocast=False, input_dims=[2]),
        "backward": _site(script, 9),
        "step": _site(script, 10, "SGD"),
    }
    return record


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(SCRIPT, encoding="utf-8")
    return root


def _save(record: RunRecord | dict[str, Any], where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    if isinstance(record, RunRecord):
        save_record(record, where)
    else:
        (where / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return where


def _refused(run_dir: Path, tree: Path, match: str, **options: Any) -> str:
    """Run fix (apply and verify asked for) and expect a one-sentence refusal; nothing written."""
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match=match) as caught:
        run(FixOptions(run_dirs=(run_dir,), apply=True, verify=True, cwd=tree, **options))
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before
    assert not (run_dir / MARK_FILE).exists() and not list(tree.rglob("PWNED"))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_valid_record_is_patched_with_typed_code(tree: Path, tmp_path: Path) -> None:
    script = tree / "train.py"
    settings = {
        "threads": 2,
        "matmul_precision": "high",
        "compile": {"mode": "max-autotune", "dynamic": False},
    }
    run_dir = _save(_record(script, settings), tmp_path / "run")
    result = plan_and_edit(FixOptions(run_dirs=(run_dir,), cwd=tree))
    after = result.changes[script.resolve()][1]
    assert "torch.set_num_threads(2)\n" in after
    assert 'torch.set_float32_matmul_precision("high")\n' in after
    assert 'model.compile(mode="max-autotune", dynamic=False)\n' in after
    assert result.root == tree.resolve()


KNOB_ATTACKS = [
    ({"matmul_precision": f'high"); {INJECTED}; ("'}, r"sections\.tune\.settings\.matmul_precision must be"),
    ({"threads": f"{INJECTED} or 2"}, r"sections\.tune\.settings\.threads must be an integer >= 1"),
    ({"threads": "4"}, r"sections\.tune\.settings\.threads must be an integer >= 1"),
    ({"threads": True}, r"sections\.tune\.settings\.threads must be an integer >= 1"),
    (
        {"compile": {"mode": f'default", x={INJECTED}, y="'}},
        r"sections\.tune\.settings\.compile\.mode must be",
    ),
    ({"compile": {"dynamic": f"{INJECTED} or True"}}, r"sections\.tune\.settings\.compile\.dynamic must be"),
    ({"compile": {"dynamic": 1}}, r"sections\.tune\.settings\.compile\.dynamic must be"),
    (
        {"compile": {"target": f'Linear":\n        {INJECTED}\n#'}},
        r"sections\.tune\.settings\.compile\.target must be",
    ),
    (
        {"compile": {"backend": f'x", fullgraph={INJECTED}, y="'}},
        r"sections\.tune\.settings\.compile\.backend must be",
    ),
    (
        {"dataloader": {"num_workers": f"{INJECTED} or 2"}},
        r"sections\.tune\.settings\.dataloader\.num_workers must be",
    ),
    (
        {"dataloader": {"num_workers": 2, f"x={INJECTED}, y": 1}},
        r"sections\.tune\.settings\.dataloader has unknown key\(s\) .x=",
    ),
    ({"amp": f"bf16{INJECTED}"}, r"sections\.tune\.settings\.amp must be one of bf16, fp16"),
    ({"optimizer": f"fused={INJECTED}, foreach"}, r"sections\.tune\.settings\.optimizer must be one of"),
    ({"not_a_knob": 1}, r"sections\.tune\.settings: unknown tune setting\(s\): 'not_a_knob'"),
]


@pytest.mark.parametrize(("settings", "match"), KNOB_ATTACKS)
def test_code_in_a_tune_setting_is_refused_naming_the_field(
    tree: Path, tmp_path: Path, settings: dict[str, Any], match: str
) -> None:
    run_dir = _save(_record(tree / "train.py", settings), tmp_path / "run")
    message = _refused(run_dir, tree, match)
    assert message.startswith(f"{run_dir / 'run.json'}: ") and message.endswith(
        "(nothing was run or written)."
    )


def _forged(tree: Path, edit: Any) -> RunRecord:
    record = _record(tree / "train.py", {"amp": "bf16", "optimizer": "foreach"})
    edit(record)
    return record


SITE_ATTACKS = [
    (
        lambda r: r.sections["sites"]["forward"].update(device=f'cpu", x={INJECTED}, y="'),
        r"sections\.sites\.forward\.device must be a torch device type",
    ),
    (
        lambda r: r.sections["sites"]["forward"].update(line="8; import os"),
        r"sections\.sites\.forward\.line must be a line number",
    ),
    (
        lambda r: r.sections["sites"]["optimizers"][0].update(line=True),
        r"sections\.sites\.optimizers\[0\]\.line must be",
    ),
    (
        lambda r: r.sections["sites"]["optimizers"][0].update({"class": f"SGD({INJECTED})"}),
        r"sections\.sites\.optimizers\[0\]\.class must be a class name",
    ),
    (
        lambda r: r.sections["sites"]["forward"].update(input_dims=["4"]),
        r"sections\.sites\.forward\.input_dims must be",
    ),
    (lambda r: r.sections["sites"].update(model="train.py:3"), r"sections\.sites\.model must be an object"),
    (
        lambda r: r.sections["sites"]["optimizers"].append(None),
        r"sections\.sites\.optimizers\[1\] must be an object",
    ),
    (
        lambda r: r.sections["sites"]["backward"].update(file=7),
        r"sections\.sites\.backward\.file must be a file path",
    ),
    (
        lambda r: r.findings.append(
            {"rule": "unsafe-torch-load", "location": {"file": "/p/t.py", "line": "9"}}
        ),
        r"findings\[0\]\.location\.line must be",
    ),
    (
        lambda r: r.findings.append({"rule": "unsafe-torch-load", "location": "/p/t.py:9"}),
        r"findings\[0\]\.location must be an object",
    ),
    (
        lambda r: r.sections.update(memory={"oom": {"limit": f"1; {INJECTED}", "ladder": []}}),
        r"sections\.memory\.oom\.limit must be a byte count",
    ),
    (
        lambda r: r.sections.update(
            memory={
                "oom": {
                    "limit": 1,
                    "ladder": [{"kind": "micro-batches", "fits": True, "config": {"microbatches": "2"}}],
                }
            }
        ),
        r"sections\.memory\.oom\.ladder\[0\]\.config\.microbatches must be",
    ),
    (
        lambda r: r.sections["tune"]["winner"].update(confirm_pairs=[["a", "b"]]),
        r"sections\.tune\.winner\.confirm_pairs\[0\] must be a pair of step times",
    ),
    (
        lambda r: r.sections["tune"].update(facts={"repeated": [{"cls": 'Block":'}]}),
        r"sections\.tune\.facts\.repeated\[0\]\.cls must be a class name",
    ),
    (
        lambda r: r.provenance["code"]["script"].update(sha256=["x"]),
        r"provenance\.code\.script\.sha256 must be a sha256",
    ),
    (lambda r: r.target.update(args=["--lr", 1]), r"target\.args must be a list of strings"),
]


@pytest.mark.broken_record("most forged values are refused by load_record itself (torchscalpel.sections)")
@pytest.mark.parametrize(("edit", "match"), SITE_ATTACKS)
def test_a_forged_site_finding_or_memory_value_is_refused_naming_the_field(
    tree: Path, tmp_path: Path, edit: Any, match: str
) -> None:
    run_dir = _save(_forged(tree, edit), tmp_path / "run")
    _refused(run_dir, tree, match)


def test_a_file_outside_the_tree_is_refused_even_with_its_hash(tree: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "train.py"
    victim.write_text(SCRIPT, encoding="utf-8")
    run_dir = _save(_record(victim, {"threads": 2}), tmp_path / "run")  # every site and hash names the victim
    message = _refused(run_dir, tree, r"is outside your tree")
    assert message.startswith(str(victim)) and victim.read_text(encoding="utf-8") == SCRIPT


def test_a_link_out_of_the_tree_is_outside_it(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text(SCRIPT, encoding="utf-8")
    link = tree / "linked.py"
    link.symlink_to(outside)
    run_dir = _save(_record(link, {"threads": 2}), tmp_path / "run")
    _refused(run_dir, tree, r"linked\.py is outside your tree")
    assert outside.read_text(encoding="utf-8") == SCRIPT


def test_verify_runs_only_the_script_in_the_tree(tree: Path, tmp_path: Path) -> None:
    """The edits are in the tree; the record's script is a file elsewhere: --verify is refused."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text(f"{INJECTED}\n", encoding="utf-8")
    record = _record(tree / "train.py", {"optimizer": "foreach"})
    record.target = {"script": str(elsewhere / "evil.py"), "args": []}
    record.provenance["code"]["script"]["path"] = "evil.py"
    record.provenance["code"]["modules"] = {
        "train": {"path": "train.py", "sha256": hashlib.sha256(SCRIPT.encode()).hexdigest()}
    }
    record.provenance["git"] = {"root": str(tree)}
    run_dir = _save(record, tmp_path / "run")
    assert plan_and_edit(FixOptions(run_dirs=(run_dir,), cwd=tree)).changes  # the edit itself is placed
    _refused(run_dir, tree, r"evil\.py is outside your tree")


@pytest.mark.parametrize("where", ["root", "home", "other_home"])
def test_the_file_system_root_and_home_folders_are_no_tree(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "homes" / "me"
    (tmp_path / "homes" / "alice").mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    cwd = {"root": Path("/"), "home": home, "other_home": tmp_path / "homes" / "alice"}[where]
    with pytest.raises(
        UsageError,
        match=r"edits only files under the folder it runs from .* run it from your project's folder\.$",
    ):
        user_tree(cwd)
    (home / "proj").mkdir()
    assert user_tree(home / "proj") == (home / "proj").resolve()  # a project in a home folder is a tree


def test_the_tree_is_the_git_root_above_the_folder_fix_runs_from(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "sub").mkdir()
    assert user_tree(tmp_path / "repo" / "sub") == (tmp_path / "repo").resolve()
    assert user_tree(tmp_path) == tmp_path.resolve()  # outside a repository: the folder itself


LATIN1 = "# -*- coding: latin-1 -*-\n# réglages\n" + SCRIPT + 'print("entraîné")\n'


def test_a_latin1_script_is_read_patched_and_written_back_in_latin1(tmp_path: Path) -> None:
    tree = tmp_path / "project"
    tree.mkdir()
    script = tree / "train.py"
    script.write_bytes(LATIN1.encode("latin-1"))
    assert read_source(script) == (LATIN1, "iso-8859-1")
    record = _record(script, {"threads": 2})
    for site in [*record.sections["sites"]["optimizers"], *record.sections["sites"]["dataloaders"]]:
        site["line"] += 2
    run_dir = _save(record, tmp_path / "run")
    patch = tmp_path / "fix.patch"
    result = run(FixOptions(run_dirs=(run_dir,), apply=True, force=True, patch=patch, cwd=tree))
    data = script.read_bytes()
    assert data.decode("latin-1") == LATIN1.replace(
        "import torch\n", "import torch\ntorch.set_num_threads(2)\n", 1
    )
    assert "réglages".encode("latin-1") in data and "entraîné".encode("latin-1") in data
    # the patch carries the file's own bytes (git apply applies it to the latin-1 file) ...
    assert b"\n+torch.set_num_threads(2)\n" in patch.read_bytes()
    assert result.patch.encode("utf-8", "surrogateescape") == patch.read_bytes()
    # ... and fix.json knows the written bytes as this patch's result: a second fix finds it done
    mark = json.loads((run_dir / MARK_FILE).read_text(encoding="utf-8"))
    assert mark["files"][str(script.resolve())]["after"] == hashlib.sha256(data).hexdigest()
    again = plan_and_edit(FixOptions(run_dirs=(run_dir,), cwd=tree))
    assert not again.changes and [i.status for i in again.items] == ["already"]


def test_an_edit_the_declared_encoding_cannot_hold_is_refused(tmp_path: Path) -> None:
    from torchscalpel.fix.files import encode_source

    with pytest.raises(
        UsageError, match=r"declared encoding \(ascii\) cannot hold, so nothing was written\.$"
    ):
        encode_source(tmp_path / "t.py", "x = 'é'\n", "ascii")


def test_a_record_string_never_adds_a_line_to_the_patch(tree: Path, tmp_path: Path) -> None:
    record = _record(tree / "train.py", {"threads": 2})
    record.name = "tune\n--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-import torch\n+import os"
    record.command = ["scalpel", "tune\r\n+evil"]
    run_dir = _save(record, tmp_path / "run")
    patch = plan_and_edit(FixOptions(run_dirs=(run_dir,), cwd=tree)).patch
    head = patch.split("\n--- a/", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines() if line)
    lines = patch.splitlines()
    assert sum(line.startswith("--- a/") for line in lines) == 1 and "+import os" not in lines


def test_a_record_string_is_shown_without_terminal_control_sequences(tree: Path, tmp_path: Path) -> None:
    import torchscalpel.report.fix_terminal as fix_terminal

    record = _record(tree / "train.py", {"optimizer": "fused"})
    record.sections["sites"]["optimizers"][0]["library"] = "lib\x1b]0;owned\x07\nnext: rm -rf ~"
    result = plan_and_edit(FixOptions(run_dirs=(_save(record, tmp_path / "run"),), cwd=tree))
    lines = fix_terminal.render(result)
    assert any("built inside lib?]0;owned??next: rm -rf ~" in line for line in lines), lines
    assert not any(c in "".join(lines) for c in "\x1b\x07\n")


def test_a_null_script_hash_is_no_hash_not_a_crash(tree: Path, tmp_path: Path) -> None:
    record = _record(tree / "train.py", {"threads": 2})
    record.provenance["code"]["script"] = None
    result = plan_and_edit(FixOptions(run_dirs=(_save(record, tmp_path / "run"),), cwd=tree))
    assert not result.changes and "recorded no hash of train.py" in result.items[0].reason


def test_code_is_built_from_typed_values_only() -> None:
    assert code.text(code.call("torch.set_num_threads", 3)) == "torch.set_num_threads(3)"
    assert code.text(code.value('a"); import os; ("')) == '"a\\"); import os; (\\""'
    for bad in (["x"], {"a": 1}, float("nan"), object()):
        with pytest.raises(TypeError, match="fix writes no"):
            code.value(bad)
    with pytest.raises(ValueError, match="not a dotted name"):
        code.name("torch.x; import os")


def test_a_deep_copy_of_a_valid_record_still_passes(tree: Path, tmp_path: Path) -> None:
    """The checks refuse values, not records: the shapes tune writes (nulls included) pass."""
    record = _record(tree / "train.py", {"threads": 2, "dataloader": {"num_workers": 0, "pin_memory": True}})
    data = copy.deepcopy(record.to_dict())
    data["sections"]["sites"]["forward"]["input_dims"] = [2, None]
    data["sections"]["sites"]["block"] = None
    data["findings"] = [{"rule": "loss-diverging", "location": None}]
    run_dir = _save(data, tmp_path / "run")
    assert plan_and_edit(FixOptions(run_dirs=(run_dir,), cwd=tree)).changes
