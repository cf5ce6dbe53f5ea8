"""Name the rank that diverged, from every rank's collective log and stack (pure functions).

Inputs are what :mod:`torchscalpel.runtime.collectives` left behind: each rank's
:class:`~torchscalpel.runtime.collectives.RankLog` and the text :mod:`faulthandler` wrote when the
launcher asked. Two questions:

- :func:`first_mismatch`: the first collective (per process group, by sequence number) where the
  ranks disagree on op, shapes or dtypes: the desync that will hang or corrupt the job;
- :func:`diagnose`: where each rank is now (in which collective, or at which line outside one, or
  dead) and which ranks diverged: the ones outside any wait, else the minority.
"""

from __future__ import annotations

import os
import re
import signal
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torchscalpel.runtime.collectives import STACK_SIGNAL, RankLog, signature
from torchscalpel.runtime.userframes import ANY, first_user, is_runner_file

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
# Frames in these parts of torch mean "waiting for the other ranks" (DDP's all-reduce runs in backward).
_WAITING = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/", "/torch/_tensor.py")


@dataclass(slots=True, frozen=True)
class Frame:
    """One Python frame of a stack dump."""

    file: str
    line: int
    func: str

    def site(self) -> str:
        """``file:line`` with the file shortened to its name."""
        return f"{os.path.basename(self.file)}:{self.line}"


def parse_stacks(text: str) -> dict[int, list[Frame]]:
    """Thread id -> frames (innermost first) from the last dump in a faulthandler file."""
    threads: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            tid = int(head.group(2), 16)
            if tid in threads:  # a newer dump starts: keep only the newest
                threads = {}
            current = threads.setdefault(tid, [])
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return threads


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame in the user's own code, else the innermost frame (a rank is somewhere)."""
    return first_user(frames, lambda f: f.file, fallback=ANY)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _shape_text(entry: dict[str, Any]) -> str:
    shapes = entry.get("shapes") or []
    dtypes = entry.get("dtypes") or []
    if not shapes:
        return ""
    return " " + ", ".join(f"{list(s)} {d}" for s, d in zip(shapes, dtypes, strict=False))


def _short_site(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else site


def first_mismatch(logs: dict[int, RankLog]) -> dict[str, Any] | None:
    """The first collective where ranks disagree on op/shapes/dtypes, with each side's call site."""
    by_group: dict[str, dict[int, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for rank, log in logs.items():
        for entry in log.entries:
            by_group[entry.get("group", "default")][entry.get("seq", 0)][rank] = entry
    found: list[dict[str, Any]] = []
    for group, seqs in by_group.items():
        for seq in sorted(seqs):
            entries = seqs[seq]
            if len(entries) < 2:
                continue
            sides: dict[tuple[Any, ...], list[int]] = defaultdict(list)
            for rank, entry in sorted(entries.items()):
                sides[signature(entry)].append(rank)
            if len(sides) > 1:
                found.append(_mismatch(group, seq, entries, sides))
                break
    if not found:
        return None
    return min(found, key=lambda m: m["t"])


def _mismatch(
    group: str, seq: int, entries: dict[int, dict[str, Any]], sides: dict[tuple[Any, ...], list[int]]
) -> dict[str, Any]:
    ordered = sorted(sides.values(), key=lambda rs: (len(rs), rs))  # minority first
    parts = []
    for ranks in ordered:
        e = entries[ranks[0]]
        parts.append(
            f"{_ranks(ranks)} call{'s' if len(ranks) == 1 else ''} {e['op']}{_shape_text(e)} "
            f"from {_short_site(e.get('site', '?'))}"
        )
    where = "" if group == "default" else f" on {group}"
    message = f"collective #{seq}{where} differs across ranks: " + "; ".join(parts)
    return {
        "group": group,
        "seq": seq,
        "t": min(e.get("t", 0.0) for e in entries.values()),
        "ranks": {
            str(r): {k: e.get(k) for k in ("op", "shapes", "dtypes", "site")}
            for r, e in sorted(entries.items())
        },
        "minority": ordered[0] if len(ordered[0]) < len(ordered[-1]) else [],
        "message": message,
    }


def rank_state(log: RankLog | None, frames: list[Frame], dead: str | None) -> dict[str, Any]:
    """Where one rank is: dead, in a logged collective, waiting inside torch, or in its own code."""
    user = user_frame(frames)
    state: dict[str, Any] = {
        "steps": log.steps if log else None,
        "stack": [f"{f.file}:{f.line} in {f.func}" for f in frames],
        "last_collectives": [_brief(e) for e in (log.entries[-5:] if log else [])],
    }
    if dead:
        return {**state, "state": "dead", "where": f"dead ({dead})", "key": ("dead", dead), "waiting": False}
    pending = log.pending() if log else None
    if pending:
        where = f"in {pending['op']} #{pending['seq']}"
        where += "" if pending.get("group") == "default" else f" on {pending['group']}"
        where += f" from {_short_site(pending.get('site', '?'))}"
        return {
            **state,
            "state": "in_collective",
            "collective": _brief(pending),
            "where": where,
            "key": ("collective", pending["op"], pending.get("group"), pending["seq"]),
            "waiting": True,
        }
    site = user.site() if user else "an unknown place (no stack came back)"
    waiting = any(part in f.file for f in frames[:8] for part in _WAITING)
    if waiting and user is not None and any("/torch/autograd/" in f.file for f in frames):
        where = f"in backward() from {site} (where DDP all-reduces gradients), not in a logged collective"
    elif waiting and user is not None:
        inner = frames[0].func if frames else "?"
        where = f"waiting inside torch ({inner}) from {site}, not in a logged collective"
    elif user is not None:
        where = f"not in a collective: at {site} in {user.func}"
        if any("/torch/utils/data/" in f.file for f in frames):
            where += " (inside a DataLoader)"
    else:
        where = f"at {site}"
    return {
        **state,
        "state": "waiting" if waiting else "running",
        "where": where,
        "key": ("site", site, waiting),
        "waiting": waiting,
    }


def _brief(entry: dict[str, Any]) -> dict[str, Any]:
    status = {0: "entered", 1: "completed", 2: "raised"}.get(entry.get("done", 0), "?")
    return {
        "op": entry.get("op"),
        "group": entry.get("group"),
        "seq": entry.get("seq"),
        "shapes": entry.get("shapes"),
        "dtypes": entry.get("dtypes"),
        "site": entry.get("site"),
        "status": status,
    }


def diagnose(
    logs: dict[int, RankLog], stacks: dict[int, list[Frame]], dead: dict[int, str], ranks: list[int]
) -> dict[str, Any]:
    """Each rank's state, the diverging ranks and a one-line summary (``rank 1 is in ...; ranks 0 are in ...``)."""
    # A rank our stack signal killed died of the request; a rank killed otherwise (torchrun's SIGTERM)
    # at about the same time was stopped after it, whichever death the watch's polling saw first
    # (the stacks may also have been asked for in two rounds, each judging only its own ranks).
    asked = [r for r in ranks if signal.Signals(STACK_SIGNAL).name in dead.get(r, "")]
    if asked:
        dead = {
            r: (
                why.replace(" while asked for its stack", f", after rank {asked[0]} died")
                if r not in asked
                else why
            )
            for r, why in dead.items()
        }
    states = {r: rank_state(logs.get(r), stacks.get(r, []), dead.get(r)) for r in ranks}
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for rank, st in states.items():
        groups[st["key"]].append(rank)
    not_waiting = [r for r, st in states.items() if not st["waiting"]]
    first_dead = [r for r in ranks if r in dead and "after rank" not in dead[r]]
    mismatch = first_mismatch(logs)
    by_mismatch = False
    if first_dead and len(first_dead) < len(states):
        diverging = first_dead
    elif not_waiting and len(not_waiting) < len(states):
        diverging = not_waiting
    else:
        sizes = sorted((len(v) for v in groups.values()), reverse=True)
        if len(groups) > 1 and sizes[0] > sizes[1]:
            biggest = max(groups.values(), key=len)
            diverging = sorted(r for r in states if r not in biggest)
        elif mismatch is not None and mismatch["minority"]:
            # Where the ranks wait now is a tie (a desync can leave some ranks a collective further on):
            # the ranks that diverged are the minority of the first collective they disagreed on.
            diverging, by_mismatch = sorted(mismatch["minority"]), True
        else:
            diverging = []
    for st in states.values():
        st.pop("key", None)
    diag: dict[str, Any] = {"diverging_ranks": diverging, "ranks": {str(r): st for r, st in states.items()}}
    diag["summary"] = summarize(diag)
    if by_mismatch and mismatch is not None:  # by_mismatch is only set with a mismatch
        diag["summary"] = f"{_ranks(diverging)} diverged first, {mismatch['message']}; now {diag['summary']}"
    diag["mismatch"] = mismatch
    return diag


def summarize(diag: dict[str, Any]) -> str:
    """``rank 1 is in barrier #18 from a.py:21; ranks 0, 2, 3 are in all_reduce #18 from a.py:20``: diverging first."""
    by_where: dict[str, list[int]] = defaultdict(list)
    for rank, st in diag["ranks"].items():
        by_where[st["where"]].append(int(rank))
    diverging = set(diag["diverging_ranks"])
    ordered = sorted(by_where.items(), key=lambda kv: (not set(kv[1]) & diverging, min(kv[1])))
    parts = [f"{_ranks(rs)} {'is' if len(rs) == 1 else 'are'} {where}" for where, rs in ordered]
    summary = "; ".join(parts)
    if not diverging and len(by_where) > 1:
        summary = "the ranks disagree: " + summary
    return summary


def format_report(diag: dict[str, Any]) -> str:
    """The text report (``hang.txt``): the summary, the first mismatch, each rank's stack and last collectives."""
    lines = [
        f"scalpel launch: hang: no rank made progress for {diag.get('idle_s', 0):.1f} s "
        f"(--hang-timeout {diag.get('hang_timeout_s', 0):g} s).",
        diag["summary"] + ".",
    ]
    if diag.get("mismatch"):
        lines.append("first mismatch: " + diag["mismatch"]["message"] + ".")
    if diag.get("nccl_error"):
        lines.append(diag["nccl_error"] + ".")
    nccl = diag.get("nccl_summary") or {}
    for rank, st in diag["ranks"].items():
        lines.append(f"\nrank {rank}: {st['where']} (steps done: {st['steps']})")
        if rank in nccl:
            from torchscalpel.distributed.flightrec import describe_summary

            summary = nccl[rank]
            lines.append(
                "  NCCL flight recorder: "
                + (summary["error"] if "error" in summary else describe_summary(summary))
            )
        for c in st["last_collectives"]:
            lines.append(
                f"    {c['status']:<9} {c['op']} #{c['seq']} {c['group']}{_shape_text(c)} from {c['site']}"
            )
        shown = [f for f in st["stack"] if not is_runner_file(f.rsplit(" in ", 1)[0].rsplit(":", 1)[0])]
        if shown:  # hang.json keeps every frame; the text leaves out the launcher's own
            lines.append("  main thread, innermost first:")
            lines.extend(f"    {f}" for f in shown[:12])
    return "\n".join(lines)
