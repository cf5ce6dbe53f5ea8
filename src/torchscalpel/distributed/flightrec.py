"""The NCCL flight recorder in the hang diagnosis: turned on at launch, dumped by every rank on a hang.

Launcher side only (the rank side is :func:`torchscalpel.runtime.flight_dumper.start_flight_dumper`):

- :func:`trace_env`: on CUDA, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (the recorder's ring, off at 0 by
  default) and ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (where torch's own dump-on-timeout writes), each
  only where the user has not set it;
- :func:`request_dumps` / :func:`collect_dumps`: a request file per rank, answered by the rank's
  dumper thread with ``rank-R.nccl-trace.pickle`` (``torch._C._distributed_c10d._dump_nccl_trace``),
  moved next to ``hang.json`` under ``nccl-trace/``. Each wait has its own deadline: a rank that does
  not answer (dead, GIL held, a CPU build without the recorder) is named, never waited on.

- :func:`read_dump` / :func:`dump_summary`: a saved dump (plain data only, never code) as the collective
  each rank's recorder says it waits in, for ``hang.json`` / ``hang.txt``.

Not exercised on a GPU in this repository's tests (CPU only): the plumbing and the reading of a dump
built in torch's format are unit-tested; ``scripts/gpu_check.d/hang.sh`` runs it with NCCL.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torchscalpel.plaindata import (
    PlainUnpickler,
    Refused,
    TooMuchWork,
    WorkCounter,
    spend_expanded,
    work_budget,
)
from torchscalpel.runtime.hang_files import nccl_dump_path, nccl_request_path
from torchscalpel.runtime.userframes import first_user

BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FILE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
DEFAULT_BUFFER = 2000  # entries; torch's docs suggest a few thousand
WAIT_S = 10.0


def trace_env(environ: Mapping[str, str], folder: Path, cuda: bool) -> dict[str, str]:
    """The variables to add for the ranks (none without CUDA; the user's own values are kept)."""
    if not cuda:
        return {}
    add = {}
    if BUFFER_ENV not in environ:
        add[BUFFER_ENV] = str(DEFAULT_BUFFER)
    if FILE_ENV not in environ:
        add[FILE_ENV] = str(folder / "nccl-timeout-dump-rank-")  # torch appends the rank
    return add


def request_dumps(folder: Path, ranks: Iterable[int]) -> None:
    """Ask each rank's dumper thread for its flight recorder."""
    for rank in ranks:
        try:
            nccl_request_path(folder, rank).write_text("dump\n")
        except OSError:
            pass  # the watch folder went away: collect_dumps reports every rank as unanswered


def collect_dumps(
    folder: Path, report_dir: Path, ranks: Iterable[int], wait_s: float = WAIT_S
) -> dict[int, str]:
    """Per rank: the saved dump's path, or why there is none. Waits at most ``wait_s`` in all."""
    pending, out = set(ranks), {}
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            src = nccl_dump_path(folder, rank)
            if src.exists():
                dest = report_dir / "nccl-trace" / f"nccl_trace_rank_{rank}"  # fr_trace reads <prefix>_<rank>
                dest.parent.mkdir(parents=True, exist_ok=True)
                src.replace(dest)
                out[rank] = str(dest)
                pending.discard(rank)
        if pending:
            time.sleep(0.1)
    for rank in pending:
        out[rank] = (
            f"no dump within {wait_s:g} s (the rank is dead, holds the GIL, or has no NCCL flight recorder)"
        )
    for rank in out:
        nccl_request_path(folder, rank).unlink(missing_ok=True)
    return dict(sorted(out.items()))


# -- reading a dump into the diagnosis ------------------------------------------------------------
# The dump is torch's own pickle (``_dump_nccl_trace``: a dict with "version", "pg_config" and
# "entries", each entry with "profiling_name" like "nccl:all_reduce", "process_group" (name, desc),
# "collective_seq_id", "state" (scheduled / started / completed), "input_sizes", "input_dtypes" and
# "frames" [{"name", "filename", "line"}], the keys torch's fr_trace reads). It is read with an
# unpickler that builds plain containers only: a file in the launch folder is not trusted to run code. Nor
# to be small once built: the memo can name one list of 10^5 frames from every entry, so what it holds is
# counted by plaindata's rule (every reference counted again) within the work budget of the file's size
# before anything walks it. And every number and text shown is bounded: a 5000-digit int cannot be printed
# (Python's int-to-text limit) nor written to hang.json, and a lone surrogate cannot be written as UTF-8.


def read_dump(path: Path) -> dict[str, Any]:
    """A flight recorder dump as plain data; ``ValueError`` with one sentence when it is not one."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = PlainUnpickler(fh).load()
        spend_expanded(data, WorkCounter(work_budget(size)))
    except TooMuchWork as exc:
        raise ValueError(
            f"{path} is not an NCCL flight recorder dump (it names its own parts over and over, more than "
            f"{exc.budget:,} objects from {size:,} bytes)"
        ) from None
    except RecursionError:
        raise ValueError(
            f"{path} is not an NCCL flight recorder dump (it nests deeper than a dump does)"
        ) from None
    except Refused as exc:
        raise ValueError(
            f"{path} is not an NCCL flight recorder dump (it asks to build {exc}, which is not plain data)"
        ) from exc
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not an NCCL flight recorder dump ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path} is not an NCCL flight recorder dump (no 'entries' list)")
    return data


def _user_frame(frames: list[Any]) -> str:
    """``file:line`` of the innermost user frame of a recorded entry (the names may be another machine's)."""
    found = first_user(
        [f for f in frames if isinstance(f, dict) and isinstance(f.get("filename"), str)],
        lambda f: str(f["filename"]),
    )
    if found is None:
        return "?"
    line = found.get("line")
    return _text(f"{os.path.basename(found['filename'])}:{line if _is_int(line) else '?'}")


MAX_NOTES = 20  # a dump with a bad field in every one of 2000 entries says so 20 times, then counts


INT_LIMIT = 1 << 63  # torch's sizes and sequence numbers are int64: anything beyond is not a dump's number
TEXT_LIMIT = 200  # characters of a name, group, state or dtype shown (a dump's field can be megabytes)


def _is_int(value: Any) -> bool:
    """An int torch could have written (int64): a 5000-digit one cannot even be printed."""
    return isinstance(value, int) and not isinstance(value, bool) and -INT_LIMIT <= value < INT_LIMIT


def _text(value: str) -> str:
    """``value`` cut to :data:`TEXT_LIMIT` characters and writable as UTF-8 (lone surrogates escaped)."""
    if len(value) > TEXT_LIMIT:
        value = value[: TEXT_LIMIT - 3] + "..."
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _group_text(value: Any) -> str | None:
    """torch writes ``process_group`` as ``(name, desc)`` of strings; anything else does not fit."""
    if isinstance(value, (list, tuple)) and 1 <= len(value) <= 2 and all(isinstance(v, str) for v in value):
        return _text(str(value[0]) + (f" ({value[1]})" if len(value) > 1 else ""))
    return None


def _sizes_ok(value: Any) -> bool:
    """``input_sizes``: one list of int64s per input."""
    return isinstance(value, list) and all(
        isinstance(s, (list, tuple)) and all(_is_int(d) for d in s) for s in value
    )


def _dtypes_ok(value: Any) -> bool:
    """``input_dtypes``: one dtype name per input."""
    return isinstance(value, list) and all(isinstance(d, str) and len(d) <= TEXT_LIMIT for d in value)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _brief(entry: dict[Any, Any], index: int, notes: list[str]) -> dict[str, Any]:
    """One entry as ``{op, group, seq, state, sizes, dtypes, site}``; a field of the wrong type is shown as
    missing (``?`` / None) and named in ``notes``: a dump is another process's file, and the hang watch
    reads it before it stops the ranks, so nothing in it may raise here."""

    def bad(key: str, want: str) -> None:
        notes.append(f"entry {index}: {key} is {_type_name(entry.get(key))}, not {want}; left out")

    name = entry.get("profiling_name", "?")
    if not isinstance(name, str):
        bad("profiling_name", "a string")
        name = "?"
    group = "?"
    if "process_group" in entry:
        group = _group_text(entry["process_group"]) or "?"
        if group == "?":
            bad("process_group", "(name, description) strings")
    seq = entry.get("collective_seq_id")
    if seq is not None and not _is_int(seq):
        bad("collective_seq_id", "an int64")
        seq = None
    state = entry.get("state", "?")
    if not isinstance(state, str):
        bad("state", "a string")
        state = "?"
    sizes = entry.get("input_sizes")
    if sizes is not None and not _sizes_ok(sizes):
        bad("input_sizes", "a list of int64 lists")
        sizes = None
    dtypes = entry.get("input_dtypes")
    if dtypes is not None and not _dtypes_ok(dtypes):
        bad("input_dtypes", "a list of strings")
        dtypes = None
    frames = entry.get("frames")
    if frames is not None and not isinstance(frames, list):
        bad("frames", "a list")
        frames = None
    return {
        "op": _text(name.split(":", 1)[-1]),
        "group": group,
        "seq": seq,
        "state": _text(state),
        "sizes": sizes,
        "dtypes": [_text(d) for d in dtypes] if dtypes is not None else None,
        "site": _user_frame(frames or []),
    }


def dump_summary(data: Mapping[str, Any], last: int = 3) -> dict[str, Any]:
    """What the recorder says a rank was doing: the first collective not completed (the one it waits in)
    and the last ``last`` entries, each ``{op, group, seq, state, sizes, dtypes, site}``.

    Entries and fields that do not have torch's types are left out and named under ``notes``
    (``hang.json`` carries them), never raised on."""
    brief, notes = [], []
    entries = data.get("entries")
    if not isinstance(entries, list):
        notes.append(f"entries is {_type_name(entries)}, not a list; nothing read")
        entries = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            notes.append(f"entry {index}: a {_type_name(entry)}, not a dict; skipped")
            continue
        brief.append(_brief(entry, index, notes))
    waiting = next((b for b in brief if b["state"] != "completed"), None)
    version = data.get("version")
    if version is not None and not (isinstance(version, (str, float)) or _is_int(version)):
        notes.append(f"version is {_type_name(version)}, not a string or number; left out")
        version = None
    if isinstance(version, str):
        version = _text(version)
    out: dict[str, Any] = {
        "version": version,
        "entries": len(brief),
        "waiting_in": waiting,
        "last": brief[-last:],
    }
    if notes:
        more = len(notes) - MAX_NOTES
        out["notes"] = notes[:MAX_NOTES] + ([f"and {more} more"] if more > 0 else [])
    return out


def describe_summary(summary: Mapping[str, Any]) -> str:
    """One line for hang.txt: ``in all_reduce #42 (started) [[4]] Float from train.py:88``."""
    entry = summary.get("waiting_in")
    if entry is None:
        return f"every recorded collective completed ({summary.get('entries', 0)} entries)"
    sizes = f" {_text(str(entry['sizes']))}" if entry.get("sizes") else ""  # 10^5 inputs: one line still
    dtypes = f" {','.join(map(str, entry['dtypes']))}" if entry.get("dtypes") else ""
    noted = (
        f" ({len(summary['notes'])} notes on unreadable fields in hang.json)" if summary.get("notes") else ""
    )
    seq = entry["seq"] if entry.get("seq") is not None else "?"
    return f"in {entry['op']} #{seq} ({entry['state']}){sizes}{dtypes} from {entry['site']}{noted}"


def summarize_dumps(paths: Mapping[str, str]) -> dict[str, Any]:
    """Rank -> :func:`dump_summary` for each saved dump in ``collect_dumps``'s answer, or why it gave none."""
    out: dict[str, Any] = {}
    for rank, where in paths.items():
        path = Path(where)
        if not path.is_file():
            out[rank] = {"error": where}
            continue
        try:
            out[rank] = dump_summary(read_dump(path))
        except ValueError as exc:
            out[rank] = {"error": str(exc)}
        except (
            Exception
        ) as exc:  # a reading bug must not cost the other ranks' summaries (nor the hang report)
            out[rank] = {"error": f"{path} could not be summarised ({type(exc).__name__}: {exc})"}
    return out
