"""`scalpel serve --max-body`: the default means what ServeConfig and the docs say, bad sizes exit 2."""

from __future__ import annotations

from torchscalpel.cli.main import build_parser, main
from torchscalpel.serve.app import ServeConfig
from torchscalpel.units import parse_size


def test_max_body_default_is_derived_from_the_bundle_like_serve_config():
    args = build_parser().parse_args(["serve", "bundle"])
    assert (
        args.max_body is None and ServeConfig().max_body is None
    )  # create_app derives it (test_serve_limits)
    assert parse_size("10MiB", flag="--max-body") == 10 * 2**20


def test_ambiguous_max_body_exits_2_before_loading_anything(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "no_bundle"), "--max-body", "10M"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalpel: error: --max-body '10M' is not a size") and "\n" not in err
