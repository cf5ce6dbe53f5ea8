"""A finding raised deep inside a framework's loop names the user's line, not the framework's file.

The corpus's Lightning script with its training loader left unshuffled: the batch is fetched inside
Lightning (``site-packages/lightning/...``); the finding used to point there (only torch's own frames were
skipped), and now points at the script's ``trainer.fit(...)`` line, the user's code that led to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscalpel.doctor.api import diagnose
from torchscalpel.runtime.target import Target

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


@pytest.mark.slow
def test_a_lightning_finding_points_at_the_users_script(tmp_path: Path) -> None:
    source = (CORPUS / "lightning_auto.py").read_text()
    assert "batch_size=32, shuffle=True" in source
    script = (
        tmp_path / "lib" / "python" / "train_lightning.py"
    )  # a folder the old markers took for the stdlib
    script.parent.mkdir(parents=True)
    script.write_text(source.replace("batch_size=32, shuffle=True", "batch_size=32, shuffle=False"))
    record, findings = diagnose(Target(script=script))
    assert record.status in {"complete", "stopped"}, record.error
    found = [f for f in findings if f.rule == "train-loader-not-shuffled"]
    assert len(found) == 1, [f.rule for f in findings]
    loc = found[0].location
    fit_line = next(i for i, line in enumerate(source.splitlines(), 1) if "trainer.fit(" in line)
    assert loc is not None and (loc.file, loc.line) == (str(script), fit_line)
