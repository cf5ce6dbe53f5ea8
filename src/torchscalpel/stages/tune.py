"""``scalpel tune``'s front door: run the search (:mod:`torchscalpel.tune.search`), then leave behind
run.json (baseline record + tune section), report.html, scalpel.toml and the equivalent code lines."""

from __future__ import annotations

import time
from pathlib import Path

from torchscalpel.record import RunRecord, load_record, new_run_record
from torchscalpel.runtime.target import Target
from torchscalpel.sections import TuneSection
from torchscalpel.stages.saving import save_with_report
from torchscalpel.tune.apply import code_lines
from torchscalpel.tune.search import TuneResult
from torchscalpel.tune.settings import read_settings_file, write_settings_file

TOML_MARK = "written by scalpel tune"


def tune_record(result: TuneResult, command: list[str]) -> RunRecord:
    """The baseline's Run record with the whole search in ``sections["tune"]``."""
    try:
        record = load_record(result.baseline.out_dir)
    except Exception:  # the baseline folder went missing: keep the tune result anyway
        record = new_run_record("tune", status="complete")
    record.name = "tune"
    record.command = command
    record.sections.pop("trial", None)
    record.sections[TuneSection.KEY] = result.to_dict()
    return record


def save_outputs(
    result: TuneResult, out_dir: Path, *, config_path: Path | None, command: list[str], target_text: str
) -> dict[str, Path]:
    """Write every output; return their paths by role. ``config_path`` is only overwritten when
    it does not exist or was itself written by scalpel tune (never a user's own file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    record = tune_record(result, command)
    note = fix_note(record)
    if note and note not in result.notes:
        # said where the result is written and printed: the terminal prints the notes, run.json keeps them
        result.notes.append(note)
        record.sections[TuneSection.KEY]["notes"] = list(result.notes)

    def header(path: Path) -> list[str]:
        lines = [
            f"{TOML_MARK} on {time.strftime('%Y-%m-%d %H:%M')} for: {target_text}",
            f"apply with: scalpel run --config {path} -- {target_text}",  # the path this file has
            # The verdict line the terminal printed (the one speedup definition, torchscalpel.tune.speedup).
            result.headline(),
        ]
        return [*lines, note] if note else lines

    # Nothing recommended: no settings file (an empty [tune] table read as if something were to apply).
    if result.winner is not None:
        toml = out_dir / "scalpel.toml"
        paths["settings"] = write_settings_file(result.settings, toml, header=header(toml))
        if config_path is not None and _may_overwrite(config_path):
            paths["config"] = write_settings_file(result.settings, config_path, header=header(config_path))
    lines = code_lines(result.settings)
    (out_dir / "code.txt").write_text(
        "\n".join([f"# scalpel tune: {result.headline()}", *([f"# {note}"] if note else []), *lines]) + "\n",
        encoding="utf-8",
    )
    paths["code"] = out_dir / "code.txt"
    record.artifacts.update({"record": "run.json", "code": "code.txt"})
    if "settings" in paths:  # no scalpel.toml when nothing is recommended
        record.artifacts["settings"] = "scalpel.toml"
    report = save_with_report(record, out_dir)  # the record and the settings are safe before it renders
    paths["record"] = out_dir / "run.json"
    if report is not None:
        paths["report"] = report
    return paths


def fix_note(record: RunRecord) -> str:
    """When ``scalpel fix`` cannot patch tune's winner as measured: ``scalpel fix will not patch LABEL:
    REASON`` (which part it cannot place, and the best config it can place that tune measured, with its
    speedup); "" when it can, when nothing won, or when fix's libcst is not installed."""
    tune = record.section(TuneSection)
    if tune is None or not tune.winner or not tune.settings:
        return ""
    try:
        from torchscalpel.fix.locate import tune_plan
    except ImportError:  # without torchscalpel[fix] there is no fix to speak for
        return ""
    try:
        refused = [p for p in tune_plan(record) if p.edit is None and not p.done]
    except Exception:  # a note, never worth the outputs it would stop being written; fix says it again
        return ""
    return "; ".join(f"scalpel fix will not patch {p.label}: {p.reason}" for p in refused)


def _may_overwrite(path: Path) -> bool:
    if not path.exists():
        return True
    try:
        head = path.read_text(encoding="utf-8")[:200]
        read_settings_file(path)
    except Exception:
        return False
    return TOML_MARK in head


def tune_stage(
    target: Target,
    out_dir: Path,
    *,
    budget_s: float = 120.0,
    steps: int = 6,
    warmup: int = 2,
    knobs: tuple[str, ...] = ("amp", "threads", "dataloader"),
    quiet: bool = False,
) -> TuneResult:
    """A short tune for ``scalpel demo``: cheap knobs only (no cold compile), results in ``out_dir``.

    Writes run.json, report.html, scalpel.toml and code.txt into ``out_dir`` and prints the table.
    """
    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.report.tune_terminal import RichProgress
    from torchscalpel.tune.search import SilentProgress, TuneOptions, tune

    options = TuneOptions(
        out_dir=out_dir, budget_s=budget_s, steps=steps, warmup=warmup, knobs=knobs, confirm_pairs=1
    )
    result = tune(target, options, SilentProgress() if quiet else RichProgress())
    target_text = " ".join(str(a) for a in target.argv())
    save_outputs(result, out_dir, config_path=None, command=["scalpel", "demo"], target_text=target_text)
    if not quiet:
        saved = load_record(out_dir)  # drawn from what was saved, as report.html is
        tune_terminal.render(
            saved.section(TuneSection) or TuneSection(),
            out_dir=out_dir,
            config_path=out_dir / "scalpel.toml" if result.winner is not None else None,
            environment=saved.environment,
            target_text=target_text,
        )
    return result
