"""The runtime's sentences about a run: why it ended (:func:`how_it_stopped`, the one wording of doctor,
profile, memory and lr), and for a run that found no step, what it saw instead and how to delimit steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord, StepRecord
    from torchscalpel.runtime.session import Session


def how_it_stopped(record: RunRecord) -> str:
    """Why the run ended, in one clause with its figures (``stopped by the 120 s time cap at step 228 of
    302``): the time cap, a divergence, a memory limit, the script's own end or error, Ctrl-C, or the
    planned steps. Read from ``record.config["stopped_by"]`` (what the runtime was asked to stop for) and
    the status; a cap-cut run once read "ended after the planned steps, as asked"."""
    n = len(record.steps)
    warmup, steps = record.config.get("warmup") or 0, record.config.get("steps")
    planned = warmup + steps if isinstance(steps, int) else None
    of = f" of {planned}" if planned is not None else ""
    by = record.config.get("stopped_by") or {}
    kind, reason = by.get("kind"), by.get("reason")
    if record.status == "interrupted":
        return f"stopped by Ctrl-C at step {n}{of}"
    if by.get("tail_end") in ("cap", "script"):
        return _tail_words(record, n, by)
    if kind == "time-cap":
        cap = by.get("cap_s")
        cap_words = f"the {cap:.0f} s time cap" if isinstance(cap, (int, float)) else "the time cap"
        return f"stopped by {cap_words} at step {n}{of}"
    if kind == "divergence":
        return f"stopped at step {n}{of}: {reason or 'the loss diverged'}"
    if kind == "memory-limit":
        return f"stopped by the memory limit at step {n}{of}"
    if kind == "no-step":
        return f"stopped: {reason}" if reason else "stopped: no step was recognised"
    if record.status == "failed":
        return f"the script failed at step {n} (exit code {record.exit_code})"
    if record.status == "complete":
        return f"the script ran to its end after {n} step(s)"
    if kind == "steps":
        return f"ended after the {n} planned steps, as asked"
    if record.status == "stopped":
        return f"stopped at step {n}{of}" + (f": {reason}" if reason else "")
    return f"{record.status} after {n} step(s)"


def _tail_words(record: RunRecord, n: int, by: dict[str, object]) -> str:
    """A run that went on past its window (``RuntimeOptions.tail_s``): the window, then how long it ran on
    unmeasured under the cheap checks, and what ended it (its own end, its error, or the tail cap)."""
    ran, cap = by.get("tail_ran_s"), by.get("tail_s")
    ran_words = f"{ran:.1f} s" if isinstance(ran, (int, float)) else "a while"
    head = f"measured {n} step(s), then ran on past the window for {ran_words} under the cheap checks only (saves, loads, exports; no timing)"
    if by.get("tail_end") == "cap":
        cap_words = f"the {cap:g} s tail cap" if isinstance(cap, (int, float)) else "the tail cap"
        return f"{head} until {cap_words} stopped it (--tail-cap)"
    if record.status == "failed":
        return f"{head}; the script then failed (exit code {record.exit_code})"
    return f"{head}, to the script's own end"


def seen_summary(session: Session) -> str:
    """What the run saw, for a note when no step (or no step of the expected kind) ended."""
    seen = []
    if session.seen["models"]:
        seen.append(f"{session.seen['models']} model(s) called")
    if session.eval_forwards:
        seen.append(f"{session.eval_forwards} evaluation forward(s) without grad")
    if session.seen["optimizers"]:
        stepped = session.timeline.kind == "optimizer"
        seen.append(
            f"{session.seen['optimizers']} optimizer(s) created" + ("" if stepped else " but never stepped")
        )
    if session.seen["loaders"]:
        seen.append(f"{session.seen['loaders']} DataLoader(s) iterated")
    if session.timeline.steps:
        seen.append(f"{len(session.timeline.steps)} {session.timeline.kind}-delimited step(s)")
    return "saw " + (
        ", ".join(seen) if seen else "no nn.Module forward, backward, optimizer step or DataLoader"
    )


def no_optimizer_note(kind: str, status: str, steps: Sequence[StepRecord]) -> str:
    """Why the steps are ``kind`` calls when no optimizer stepped: an inference script only when the run ran
    to its end without a backward; a training script stopped (by a memory limit, an error) before its first
    optimizer step is not called inference."""
    if status == "complete" and not any(s.backward_ms for s in steps):
        return f"no optimizer stepped: steps were delimited by {kind} calls" + (
            " (inference)" if kind == "forward" else ""
        )
    return f"no optimizer stepped before the run ended ({status}): steps were delimited by {kind} calls"


def no_step_note(session: Session) -> str:
    """The record's note when the script ended before any step closed."""
    return (
        f"the script never completed a step: {seen_summary(session)}; if its loop trains, delimit steps "
        "with --step-kind (optimizer, backward or forward) or the in-process API (docs/inprocess.md)"
    )
