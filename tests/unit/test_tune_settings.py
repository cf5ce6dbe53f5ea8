"""TuneSettings: validation, merging, labels and the scalpel.toml round trip."""

from __future__ import annotations

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.tune.settings import (
    CompileSpec,
    DataLoaderSpec,
    TuneSettings,
    read_settings_file,
    write_settings_file,
)


def full() -> TuneSettings:
    return TuneSettings(
        amp="bf16",
        compile=CompileSpec(target="Block", mode="max-autotune", dynamic=True),
        dataloader=DataLoaderSpec(num_workers=2, persistent_workers=True),
        threads=2,
        optimizer="fused",
        channels_last=True,
        matmul_precision="high",
        cudnn_benchmark=False,
    )


def test_toml_round_trip(tmp_path):
    path = write_settings_file(full(), tmp_path / "scalpel.toml", header=["written by scalpel tune"])
    text = path.read_text()
    assert text.startswith("# written by scalpel tune")
    assert "[tune.compile]" in text and "[tune.dataloader]" in text
    assert read_settings_file(path) == full()


def test_baseline_is_empty_and_round_trips(tmp_path):
    assert TuneSettings().is_baseline()
    assert TuneSettings().label() == "baseline"
    path = write_settings_file(TuneSettings(), tmp_path / "s.toml")
    assert read_settings_file(path).is_baseline()


def test_merge_combines_families_and_dataloader_fields():
    a = TuneSettings(amp="bf16", dataloader=DataLoaderSpec(num_workers=2))
    b = TuneSettings(threads=4, dataloader=DataLoaderSpec(persistent_workers=True))
    merged = a.merged(b)
    assert merged.amp == "bf16" and merged.threads == 4
    assert merged.dataloader == DataLoaderSpec(num_workers=2, persistent_workers=True)


def test_label_names_every_setting():
    label = full().label()
    for part in (
        "amp=bf16",
        "compile(Block, max-autotune, dynamic=True)",
        "num_workers=2",
        "threads=2",
        "channels_last",
        "no-cudnn_benchmark",
    ):
        assert part in label


@pytest.mark.parametrize(
    "kwargs",
    [
        {"amp": "fp8"},
        {"threads": 0},
        {"optimizer": "magic"},
        {"matmul_precision": "low"},
        {"compile": {"target": "Block", "mode": "fast"}},
        {"dataloader": {"num_workers": -1}},
        {"dataloader": {"prefetch_factor": 0}},
        {"channels_last": "yes"},
    ],
)
def test_invalid_values_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        TuneSettings.from_dict(kwargs)


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="turbo"):
        TuneSettings.from_dict({"turbo": True})


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[tune\namp=", "not valid TOML"),
        ('version = "1.0"\n', "no [tune] table"),
        ('version = "9.0"\n[tune]\n', "settings version 9.0"),
        ('[tune]\namp = "fp8"\n', "amp must be one of"),
        ('[tune.compile]\ntarget = "x"\nspeed = 3\n', "speed"),
    ],
)
def test_bad_files_are_usage_errors(tmp_path, text, needle):
    path = tmp_path / "scalpel.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        read_settings_file(path)
    assert needle in str(info.value)


def test_missing_file_is_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        read_settings_file(tmp_path / "nope.toml")


def test_toml_escapes_strings():
    from torchscalpel.tune.settings import _toml_value

    assert _toml_value('we"ird\\') == '"we\\"ird\\\\"'


def test_a_compile_target_or_backend_is_a_name_never_code():
    """fix writes both into the user's code: a quote, a call or a line break is refused."""
    for bad in ('we"ird', "Block):\n    import os", "x y", ""):
        with pytest.raises(ValueError, match=r"compile\.target must be"):
            CompileSpec(target=bad)
    with pytest.raises(ValueError, match=r"compile\.backend must be"):
        CompileSpec(backend='inductor", fullgraph=__import__("os")')
    assert CompileSpec(target="layers.0").target == "layers.0"  # a submodule's qualified name
