"""The runtime's sentences about a run that found no step: what it saw instead, and how to delimit steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchscalpel.runtime.session import Session


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


def no_step_note(session: Session) -> str:
    """The record's note when the script ended before any step closed."""
    return (
        f"the script never completed a step: {seen_summary(session)}; if its loop trains, delimit steps "
        "with --step-kind (optimizer, backward or forward) or the in-process API (docs/inprocess.md)"
    )
