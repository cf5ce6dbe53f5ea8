"""runtime/sites.py: the construction and call sites scalpel fix edits, read from the live stack."""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchscalpel.record import new_run_record
from torchscalpel.runtime.sites import SitesObserver
from torchscalpel.sections import SitesSection


class HashesItsState(nn.Module):
    """Like torchmetrics' Metric (inside Lightning): __hash__ reads state set after super().__init__()."""

    def __init__(self) -> None:
        super().__init__()
        self.state = (1, 2)

    def __hash__(self) -> int:
        return hash(self.state)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()  # this line is Net's own construction, not where the model is built
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _line() -> int:
    return sys._getframe(1).f_lineno


def test_sites_are_the_lines_of_the_users_calls() -> None:
    obs = SitesObserver()
    obs.on_start(None)  # type: ignore[arg-type]
    try:
        model, model_line = Net(), _line()
        opt, opt_line = torch.optim.SGD(model.parameters(), lr=0.1), _line()
        loader, loader_line = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4), _line()
        HashesItsState()  # must construct (a WeakKeyDictionary of modules hashed it half-built)
        batch = next(iter(loader))
        obs.on_batch(batch, loader)
        obs.on_forward_pre(model, (batch[0],), {}, True)
        fwd_line = _line() - 1
        obs.on_backward_pre(())
        bwd_line = _line() - 1
        obs.on_optimizer_step_pre(opt)
        step_line = _line() - 1
    finally:
        record = new_run_record("profile", status="complete")
        obs.on_finish(record)
    sites = record.section(SitesSection)
    assert sites is not None
    assert [(s["line"], s["class"], s["used"], s["library"]) for s in sites.optimizers] == [
        (opt_line, "SGD", True, None)
    ]
    assert [(s["line"], s["used"]) for s in sites.dataloaders] == [(loader_line, True)]
    assert sites.model is not None and (sites.model["line"], sites.model["class"]) == (model_line, "Net")
    assert (
        sites.forward is not None and sites.forward["line"] == fwd_line and sites.forward["autocast"] is False
    )
    assert sites.backward is not None and sites.backward["line"] == bwd_line
    assert sites.step is not None and sites.step["line"] == step_line
    assert sites.forward["input_dims"] == [2]  # channels_last converts only 4-D inputs
    assert sites.optimizers[0]["file"] == __file__
    # where memory's zero_grad(set_to_none=True) goes: after the first step call
    assert sites.step is not None and (sites.step["line"], sites.step["class"]) == (step_line, "SGD")
    # The wrappers are gone after the run: a later construction is not recorded.
    torch.optim.SGD(model.parameters(), lr=0.1)
    assert len(obs.optimizers) == 1


def test_a_library_class_is_wrapped_when_the_script_imports_it(tmp_path, monkeypatch) -> None:
    """The Accelerator's construction site: accelerate is wrapped when imported, never imported by us."""
    import types

    from torchscalpel.runtime.sites import when_imported

    pkg = tmp_path / "scalpel_fake_acc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .accelerator import Accelerator\n", encoding="utf-8")
    (pkg / "accelerator.py").write_text(
        "class Accelerator:\n    def __init__(self, **kw):\n        self.kw = kw\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[types.ModuleType] = []
    undo = when_imported("scalpel_fake_acc.accelerator", lambda m: seen.append(m) or (lambda: None))
    assert not seen  # nothing imported yet
    import scalpel_fake_acc  # noqa: F401  # the script's import

    assert [m.__name__ for m in seen] == ["scalpel_fake_acc.accelerator"]
    undo()
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)

    obs = SitesObserver()
    undo_wrap = obs._wrap_accelerator(seen[0])
    accelerator, line = seen[0].Accelerator(cpu=True), _line()
    undo_wrap()
    assert accelerator.kw == {"cpu": True}
    assert obs.accelerator is not None and (obs.accelerator["line"], obs.accelerator["class"]) == (
        line,
        "Accelerator",
    )
