"""``scalpel tune``'s front door, :func:`run`: the search (:mod:`torchscalpel.tune.search`), then run.json
(baseline record + tune section), report.html, scalpel.toml and the equivalent code lines, the trackers and
the patch; or ``--fit``'s measured memory ladder."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.record import RunRecord, load_record, new_run_record
from torchscalpel.sections import TuneSection
from torchscalpel.stages.saving import save_with_report, track_run
from torchscalpel.tune.apply import code_lines
from torchscalpel.tune.options import Progress, TuneOptions
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


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneRunResult:
    """One ``scalpel tune``: the search (``search``, None under ``fit``) and every output's path by role
    (``record``, ``report``, ``settings``, ``config``, ``code``), or ``--fit``'s exit code."""

    out_dir: Path
    search: TuneResult | None = None
    """The knob search: trials, winner, confirmation (None under ``fit``)."""
    paths: dict[str, Path] = field(default_factory=dict)
    patch_lines: list[str] = field(default_factory=list)
    """``patch``: what was written (or why not)."""
    fit_exit_code: int | None = None
    """``fit``: 0 when some configuration fits, 1 if none does."""

    @property
    def config_left_alone(self) -> bool:
        """The ``config_path`` asked for exists and was not written by scalpel tune, so it was left as it is
        (the settings are in the run folder's scalpel.toml)."""
        return "settings" in self.paths and "config" not in self.paths

    @property
    def exit_code(self) -> int:
        """``fit``'s answer, else 130 after an interrupted search, else 0."""
        if self.fit_exit_code is not None:
            return self.fit_exit_code
        return 130 if self.search is not None and self.search.interrupted else 0


def run(options: TuneOptions, *, progress: Progress | None = None) -> TuneRunResult:
    """Tune ``options.target``: the knob search (:func:`torchscalpel.tune.search.tune`) with every output
    written (run.json, report.html, scalpel.toml, code.txt, the ``json_path`` copy), the baseline's run
    handed to the trackers and (``patch``) fix.patch; or, under ``fit``, the memory ladder measured. The run
    folder: ``options.out_dir``, else ``scalpel-runs/<time>-tune-<name>/``. ``progress`` hears every trial."""
    from torchscalpel.fileio import default_run_dir
    from torchscalpel.record import save_record
    from torchscalpel.tune.search import tune

    target = options.target
    if target is None:
        raise ValueError("the tune stage needs options.target (the script or module to tune)")
    out_dir = options.out_dir or default_run_dir(f"tune-{target.name}", options.out_root)
    options = options.replace(out_dir=out_dir)
    if options.fit is not None:
        from torchscalpel.tune.fit import run_fit

        code = run_fit(
            target,
            limit_text=options.fit,
            out_dir=out_dir,
            config=options.config_path or out_dir / "scalpel.toml",
            warmup=options.warmup,
            steps=options.fit_steps,
        )
        return TuneRunResult(out_dir=out_dir, fit_exit_code=code)
    result = tune(target, options, progress)
    paths = save_outputs(
        result,
        out_dir,
        config_path=options.config_path,
        command=list(options.command),
        target_text=" ".join(str(a) for a in target.argv()),
    )
    record = load_record(paths["record"])
    if options.json_path is not None:
        save_record(record, options.json_path)
    # the baseline's record (the search is in its sections["tune"])
    track_run(record, out_dir, tensorboard=options.tensorboard, mlflow=options.mlflow)
    patch_lines: list[str] = []
    if options.patch:
        from torchscalpel.fix.shortcut import write_run_patch

        patch_lines = list(write_run_patch(out_dir))
    return TuneRunResult(out_dir=out_dir, search=result, paths=paths, patch_lines=patch_lines)
