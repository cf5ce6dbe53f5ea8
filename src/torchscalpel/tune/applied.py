"""A ``scalpel.toml`` applied to a measured run (``scalpel profile --config``): the setup hooks and the
observer that records what was applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def settings_hooks(config: Path, *, command: str) -> dict[str, Any]:
    """``--config FILE`` of a measuring command: the settings file read before the script starts, its setup
    hooks (the ones ``scalpel run`` applies) and an observer that records the settings and what each
    changed in ``record.config``; as keyword arguments for the runtime (``stages.profile.run`` passes them on)."""
    import os
    import sys

    from torchscalpel.runtime.observer import Observer
    from torchscalpel.tune.apply import setup_hooks
    from torchscalpel.tune.knobs import ApplyLog
    from torchscalpel.tune.settings import read_settings_file

    settings = read_settings_file(config)
    if settings.compile is not None and settings.dataloader.num_workers:
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # as scalpel run: no fork deadlock
    log = ApplyLog()
    print(f"{command}: {settings.label()} (from {config})", file=sys.stderr)

    class SettingsObserver(Observer):
        name = "tune-settings"

        def on_finish(self, record: Any) -> None:
            record.config["tune_settings"] = settings.to_dict()
            record.config["settings_file"] = str(config)
            record.config["tune_applied"] = list(log.applied)
            if log.skipped:
                record.notes.extend(f"tune setting not applied: {line}" for line in log.skipped)

    return {"setup_hooks": setup_hooks(settings, log), "observers": [SettingsObserver()]}
