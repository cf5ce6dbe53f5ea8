"""samples/s on 🤗 Accelerate-prepared loaders, witnessed by the script's own count of samples per step.

The script that showed it: accelerate's gradient_accumulation example, whose collate returns a
``BatchEncoding`` (a ``UserDict``, not a ``dict``) fed as ``model(**batch)``: no step had a batch size,
and profile printed no samples/s and no reason. Where the size truly cannot be read, the run says
"samples/s not measured: <why>" instead of leaving the figure out.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from torchscalpel.record import load_record

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "accelerate_nlp.py"
STEP_LINE = re.compile(r"^step (\d+) loss [-+0-9.eE]+ samples (\d+)$", re.MULTILINE)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_samples_per_step_and_samples_per_s_match_the_scripts_own_count(
    tmp_path: Path, accumulation: int
) -> None:
    proc = run_cli(
        "profile",
        "--steps",
        "6",
        "--profile-steps",
        "0",
        "--no-report",
        "--out",
        str(tmp_path),
        "--",
        str(SCRIPT),
        "--gradient_accumulation_steps",
        str(accumulation),
        "--max_steps",
        "12",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    own = {
        int(n): int(s) for n, s in STEP_LINE.findall(proc.stdout)
    }  # update -> samples, as the script counted
    record = load_record(tmp_path)
    measured = record.measured_steps
    assert len(measured) == 6 and all(s.micro_batches == accumulation for s in measured)
    # The run stops the script at the last step's optimizer step, before that step's print.
    printed = [s for s in measured if s.index in own]
    assert len(printed) == 5, own
    assert [s.samples for s in printed] == [own[s.index] for s in printed] == [16 * accumulation] * 5
    assert measured[-1].samples == 16 * accumulation
    summary = record.summary_view()
    mean_ms = statistics.fmean(s.total_ms for s in measured)
    assert summary.samples_per_s == pytest.approx(16 * accumulation / (mean_ms / 1000.0), rel=1e-9)
    assert summary.samples_per_s_not_measured is None
    assert f"throughput {summary.samples_per_s:.1f} samples/s" in proc.stdout + proc.stderr


NO_BATCH_SIZE = '''\
"""A hand-rolled batch generator of dicts (no DataLoader) fed as model(**batch): nothing shows a batch size."""
import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(100, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, input_ids, labels):
        logits = self.head(self.emb(input_ids))
        return nn.functional.cross_entropy(logits, labels)


def batches():
    while True:
        yield {"input_ids": torch.randint(0, 100, (8, 12)), "labels": torch.randint(0, 4, (8,))}


torch.manual_seed(0)
model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, batch in zip(range(12), batches()):
    loss = model(**batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def test_a_batch_size_that_cannot_be_read_is_not_measured_with_the_reason(tmp_path: Path) -> None:
    script = tmp_path / "kwargs_only.py"
    script.write_text(NO_BATCH_SIZE)
    proc = run_cli(
        "profile",
        "--steps",
        "4",
        "--profile-steps",
        "0",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--",
        str(script),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = load_record(tmp_path / "run").summary_view()
    assert summary.samples_per_s is None
    reason = summary.samples_per_s_not_measured
    assert reason is not None and "Classifier was called without a positional tensor" in reason, reason
    assert f"samples/s not measured: {reason}" in " ".join((proc.stdout + proc.stderr).split()), proc.stderr
