"""``doctor --static`` on files it cannot read (issue 19, item 13): a syntax error is reported as not
analysed with its line (never "No findings"), and pathological files are refused by size or depth."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.doctor import static, static_scan


def test_syntax_error_is_reported_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.py"
    f.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\ndef f(:\n    pass\n")
    skipped: list[static.NotAnalysed] = []
    assert static_scan.analyze_paths([f], not_analysed=skipped) == []
    assert [(s.path, s.line) for s in skipped] == [(str(f), 3)]
    assert "syntax error" in skipped[0].reason


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(static, "MAX_SOURCE_BYTES", 1000)
    f = tmp_path / "gen.py"
    f.write_text("x = 1\n" * 1000)
    skipped: list[static.NotAnalysed] = []
    assert static_scan.analyze_paths([f], not_analysed=skipped) == []
    assert "over the" in skipped[0].reason and "limit" in skipped[0].reason


def test_before_python_311_a_long_chain_is_refused_before_the_parser_sees_it(monkeypatch) -> None:
    # Python 3.10's parser segfaults on a 200,000-term sum (no recursion guard); the guard counts first
    monkeypatch.setattr(static.sys, "version_info", (3, 10, 13))
    monkeypatch.setattr(static, "MAX_TERMS_BEFORE_311", 10)
    refused = static.parse_source("x = " + "+".join(["1"] * 20) + "\n", "chain.py")
    assert isinstance(refused, static.NotAnalysed) and "too deeply" in refused.reason
    assert not isinstance(static.parse_source("x = 1 + 2\ny = (3, 4)\n", "short.py"), static.NotAnalysed)
    assert static._longest_statement("a = 1 + 2 + 3\nb = 1\n") == 3
