"""The static rules' scopes: a function's own statements, never those of a ``def`` nested in it."""

from __future__ import annotations

import ast
import textwrap

from torchscalpel.doctor.static import local_nodes, own_nodes
from torchscalpel.doctor.static_scan import analyze_source

SOURCE = textwrap.dedent(
    """
    def main(model):
        a = first()
        def helper(x):
            inner(x)
        lam = lambda: in_lambda()
        class Local:
            in_class = in_class_body()
        last(helper)
    """
)


def _called(nodes) -> list[str]:
    return [n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]


def test_own_nodes_are_the_scopes_statements_in_source_order_without_nested_bodies() -> None:
    main = ast.parse(SOURCE).body[0]
    assert isinstance(main, ast.FunctionDef)
    assert _called(own_nodes(main)) == ["first", "last"]
    names = [n.name for n in own_nodes(main) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert names == ["helper", "Local"]  # a nested def is seen where it is bound, not entered
    # ast.walk enters every nested body: what the rules pairing two statements must not read
    assert set(_called(ast.walk(main))) == {"first", "inner", "in_lambda", "in_class_body", "last"}


def test_local_nodes_of_a_statement_include_it_and_stop_at_nested_scopes() -> None:
    stmt = ast.parse("for x in xs:\n    f(x)\n    g = lambda: h()\n    k()\n").body[0]
    nodes = list(local_nodes(stmt))
    assert nodes[0] is stmt
    assert _called(nodes) == ["f", "k"]


HEADER = "import torch\nimport torch.nn as nn\nnet = nn.Linear(2, 2)\n"


def _whole_model_saves(code: str) -> list[int]:
    findings = analyze_source(HEADER + textwrap.dedent(code), "t.py")
    return [f.location.line for f in findings if f.rule == "whole-model-save" and f.location]


def test_a_save_in_a_nested_def_does_not_make_the_outer_function_a_save_helper() -> None:
    # run()'s `model` and save()'s `model` are different names: run(None, net) (line 9) saves a state_dict.
    # Walking into save() paired them and reported line 9 too; save()'s own torch.save (line 7) stays reported.
    nested = """
    def run(cfg, model):
        def save(model):
            torch.save(model, "m.pt")
        save(model.state_dict())
    run(None, net)
    """
    assert _whole_model_saves(nested) == [7]
    # the helper written flat is still followed: run(None, net) (line 7) pickles the module
    flat = """
    def run(cfg, model):
        torch.save(model, "m.pt")
    run(None, net)
    """
    assert sorted(_whole_model_saves(flat)) == [6, 7]
