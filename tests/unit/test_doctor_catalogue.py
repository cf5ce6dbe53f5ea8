"""The rule catalogue: every rule class listed once with its metadata, RULES derived from it, no
registration on import, one dispatch path for every runtime event, supersedes as declared."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import torch

from torchscalpel.doctor import catalogue, registry
from torchscalpel.doctor.rule import Rule, RuleInfo
from torchscalpel.doctor.runtime_rules import OBSERVER_EVENTS, DoctorObserver, RuntimeRule
from torchscalpel.doctor.static import StaticRule
from torchscalpel.findings import Finding, Severity
from torchscalpel.runtime.observer import Observer, listeners_by_event

DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


def _doctor_classes() -> list[type]:
    """Every class defined in a torchscalpel.doctor module that derives from Rule."""
    found: list[type] = []
    for mod in pkgutil.walk_packages(
        importlib.import_module("torchscalpel.doctor").__path__, "torchscalpel.doctor."
    ):
        module = importlib.import_module(mod.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                obj.__module__ == module.__name__
                and issubclass(obj, Rule)
                and obj not in (Rule, StaticRule, RuntimeRule)
            ):
                found.append(obj)
    return found


def _reports_findings(cls: type) -> bool:
    if issubclass(cls, StaticRule):
        return cls.check is not StaticRule.check
    return cls.findings is not RuntimeRule.findings  # type: ignore[attr-defined]


def test_every_rule_class_is_in_the_catalogue_with_its_metadata() -> None:
    classes = _doctor_classes()
    assert len(classes) > len(catalogue.RULE_CLASSES)  # the walk found the helpers and bases too
    for cls in classes:
        if cls.slugs or _reports_findings(cls):
            assert cls.infos, (
                f"{cls.__qualname__} reports findings but declares no RuleInfo (set info = RuleInfo(...))"
            )
            assert cls in catalogue.RULE_CLASSES, (
                f"{cls.__module__}.{cls.__qualname__} is not listed in doctor/catalogue.py"
            )
    assert len(set(catalogue.RULE_CLASSES)) == len(catalogue.RULE_CLASSES)
    for cls in catalogue.RULE_CLASSES:
        assert cls.infos and cls.slugs == tuple(i.slug for i in cls.infos), cls
        for info in cls.infos:
            assert isinstance(info, RuleInfo) and isinstance(info.severity, Severity)
            assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", info.slug) and info.category and info.summary
            assert info.kinds and set(info.kinds) <= {"static", "runtime"}, info
        if issubclass(cls, StaticRule):
            assert len(cls.slugs) == 1, f"{cls.__qualname__}: a static rule reports one slug"
        assert set(cls.supersedes) <= set(catalogue.RULES) - set(cls.slugs), cls


def test_each_slug_has_one_rule_info_and_kinds_match_the_classes() -> None:
    by_slug: dict[str, list[type[Rule]]] = {}
    for cls in catalogue.RULE_CLASSES:
        for slug in cls.slugs:
            by_slug.setdefault(slug, []).append(cls)
    assert set(by_slug) == set(registry.RULES)
    for slug, classes in by_slug.items():
        infos = [next(i for i in c.infos if i.slug == slug) for c in classes]
        assert all(i is infos[0] for i in infos), (
            f"{slug}: declare its RuleInfo once and reference it from the other class"
        )
        kinds = set(registry.RULES[slug].kinds)
        assert ("static" in kinds) == any(issubclass(c, StaticRule) for c in classes), slug
        # rank-conditional-step's runtime half compares ranks' records (doctor/ranks.py), not an observer.
        has_runtime = any(issubclass(c, RuntimeRule) for c in classes) or slug == "rank-conditional-step"
        assert ("runtime" in kinds) == has_runtime, slug


def test_rules_table_is_derived_from_the_classes_in_documentation_order() -> None:
    assert registry.RULES is catalogue.RULES
    assert registry.rule_info("nan-loss") is catalogue.RULES["nan-loss"]
    # The order findings are ranked in and SARIF's ruleIndex: the table of docs/doctor.md, row by row.
    text = DOCS.read_text(encoding="utf-8").split("## What each finding means", 1)[1]
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.M)
    assert documented == list(registry.RULES)
    assert catalogue.STATIC_RULES and all(issubclass(c, StaticRule) for c in catalogue.STATIC_RULES)
    assert len(catalogue.RUNTIME_RULES) == 41 and catalogue.SANITY_RULES[0] not in catalogue.RUNTIME_RULES


def test_analyzing_twice_gives_the_same_findings() -> None:
    from torchscalpel.doctor.static_scan import analyze_source

    src = "import torch\nimport torch.nn as nn\ntorch.save(model, 'm.pt')\n"
    assert (
        [f.rule for f in analyze_source(src, "t.py")]
        == [f.rule for f in analyze_source(src, "t.py")]
        == ["whole-model-save"]
    )


def test_observer_events_are_the_runtimes_own_list() -> None:
    assert tuple(listeners_by_event(())) == OBSERVER_EVENTS
    assert set(OBSERVER_EVENTS) == {n for n in dir(Observer) if n.startswith("on_")}


@pytest.mark.parametrize("event", OBSERVER_EVENTS)
def test_doctor_observer_forwards_every_event_to_the_rules_that_listen(event: str) -> None:
    seen: list[tuple[str, tuple[object, ...]]] = []

    def listen(self, *args):
        seen.append((event, args))

    Listener = type("Listener", (RuntimeRule,), {event: listen})
    Crasher = type("Crasher", (RuntimeRule,), {event: lambda self, *a: 1 / 0, "slugs": ("loss-diverging",)})
    deaf, listener, crasher = RuntimeRule(), Listener(), Crasher()
    doctor = DoctorObserver([crasher, deaf, listener])
    assert event in type(doctor).__dict__  # a real override: the runtime only calls overridden events
    n_args = len(inspect.signature(getattr(Observer, event)).parameters) - 1
    args = tuple(object() for _ in range(n_args))
    getattr(doctor, event)(*args)
    getattr(doctor, event)(*args)
    assert seen == [(event, args), (event, args)]
    assert isinstance(crasher.crashed, ZeroDivisionError) and listener.crashed is None
    assert doctor._listeners[event] == [crasher, listener]
    if event == "on_start":
        assert deaf.session is args[0] and listener.session is args[0]


def _f(rule: str, message: str = "m", source: str = "runtime") -> Finding:
    return Finding(rule=rule, severity=registry.RULES[rule].severity, message=message, source=source)


def test_merge_findings_drops_what_the_declared_supersedes_explain() -> None:
    from torchscalpel.doctor.api import merge_findings
    from torchscalpel.doctor.rules.rt_numerics import NONFINITE_GRADS

    fsdp = [
        _f("optimizer-before-fsdp"),
        _f("param-not-in-optimizer"),
        _f("cannot-overfit-batch"),
        _f("loss-diverging"),
    ]
    assert sorted(f.rule for f in merge_findings([], fsdp)) == ["loss-diverging", "optimizer-before-fsdp"]
    # A static optimizer-before-fsdp explains them too (as before: the slug, whatever its source).
    static_fsdp = merge_findings([_f("optimizer-before-fsdp", source="static")], fsdp[1:])
    assert sorted(f.rule for f in static_fsdp) == ["loss-diverging", "optimizer-before-fsdp"]
    assert sorted(f.rule for f in merge_findings([], fsdp[1:])) == [
        "cannot-overfit-batch",
        "loss-diverging",
        "param-not-in-optimizer",
    ]
    # nan-loss explains non-finite gradients, not a finite explosion.
    nan = [
        _f("nan-loss"),
        _f("grad-norm-explosion", NONFINITE_GRADS),
        _f("grad-norm-explosion", "The gradient norm explodes: 300x"),
    ]
    kept = merge_findings([], nan)
    assert [(f.rule, f.message) for f in kept if f.rule == "grad-norm-explosion"] == [
        ("grad-norm-explosion", "The gradient norm explodes: 300x")
    ]
    assert len(merge_findings([], nan[1:2])) == 1
    # Static findings a runtime rule that watched the run supersedes are dropped.
    assert merge_findings([_f("unseeded-run", source="static")], [], {"unseeded-run"}) == []


def test_merge_findings_consults_every_catalogue_class(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscalpel.doctor.api import merge_findings

    class Explains(RuntimeRule):
        info = registry.RULES["loss-diverging"]
        supersedes = ("unseeded-run",)

    monkeypatch.setattr(catalogue, "RULE_CLASSES", (*catalogue.RULE_CLASSES, Explains))
    assert [f.rule for f in merge_findings([], [_f("loss-diverging"), _f("unseeded-run")])] == [
        "loss-diverging"
    ]


def test_nan_rule_answers_through_its_public_methods() -> None:
    from torchscalpel.doctor.rules.rt_numerics import NanLoss
    from torchscalpel.findings import Location

    rule = NanLoss()
    assert rule.rerun_steps() is None
    rule.on_backward_pre((torch.tensor(float("nan")),))
    assert rule.rerun_steps() == 1
    rule.set_op_origin(
        {"op": "aten.log.default", "location": Location(file="train.py", line=13), "backward": False}
    )
    (f,) = rule.findings(None)
    assert "aten.log.default at train.py:13" in f.message and f.location == Location(file="train.py", line=13)
