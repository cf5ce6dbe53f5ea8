"""The launcher's watch over its ranks: desyncs as they happen, and a hang named and stopped.

A thread beside torchrun's agent (in the ``scalpel launch`` process, the ranks' parent) reads
every rank's collective log (:mod:`torchscalpel.runtime.collectives`) twice a second:

- with ``check`` on, it compares the ranks' collectives as they are entered and reports the first
  mismatch (op, shapes, dtypes, both call sites) at once, before the job hangs on it;
- when no rank has made progress (an optimizer step or a completed collective) for the hang
  timeout, it asks every rank for its stacks (``faulthandler`` on a signal), waits for them with a
  timeout of its own, notes the ranks that died while asked (with their signal), names the rank
  that diverged (:mod:`torchscalpel.distributed.hangdiag`), writes ``hang.json`` and ``hang.txt``
  into the launch folder, prints the report, and kills every rank's process group.

Timeout: ``--hang-timeout S`` when given; otherwise :data:`MULTIPLE` times the slowest rank's
median step time, at least :data:`FLOOR_S`. Until every rank has made progress once (imports,
data, the first compile), the timeout is at least :data:`STARTUP_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.distributed.hangdiag import diagnose, first_mismatch, format_report, parse_stacks, summarize
from torchscalpel.fileio import atomic_write_text
from torchscalpel.runtime.collectives import STACK_SIGNAL, RankLog, read_rank_log
from torchscalpel.runtime.hang_files import FACTS_GLOB, LOG_GLOB, stacks_path

POLL_S = 0.5
FLOOR_S = 120.0
MULTIPLE = 20.0
STARTUP_S = 120.0
STARTUP_FLOOR_S = 30.0
STACK_WAIT_S = 3.0
"""How long the ranks get to write their stacks; a rank that has not written by then is reported as silent."""
STABLE_S = 0.2
LIVENESS_S = 1.0
"""Between two looks at a rank outside any wait: a moving stack, CPU time or I/O means it still works."""
LIVE_CPU_S = 0.05


@dataclass(slots=True)
class WatchOptions:
    """What the watch does (one object, validated by the launcher's flags)."""

    folder: Path
    """Where the ranks write ``rank-R.log`` / ``rank-R.stacks.txt``."""
    report_dir: Path
    """Where ``hang.json`` / ``hang.txt`` / ``collective-mismatch.json`` go (the launch folder)."""
    local_ranks: int
    """How many ranks run on this node (the watch sees only these)."""
    hang_timeout: float | None = None
    """Seconds without progress before a hang is declared; None: derived from the step time."""
    check: bool = False
    """Compare the ranks' collectives while the job runs (``--check-collectives``)."""
    nccl_trace: bool = False
    """On a hang, ask each rank for its NCCL flight recorder first (CUDA launches; see ``flightrec``)."""


def exit_status(pid: int) -> str | None:
    """``killed by SIGX`` / ``exit code N`` for a child that ended (not reaped: torchrun reaps it), else None."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped by torchrun, or not our child
        return None if _alive(pid) else "exited"
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            return f"killed by {signal.Signals(info.si_status).name}"
        except ValueError:
            return f"killed by signal {info.si_status}"
    return f"exit code {info.si_status}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_rank(pid: int) -> None:
    """SIGKILL the rank's process group (torchrun starts each rank in its own session) and its children."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


@dataclass(slots=True)
class HangWatch:
    """Start with :meth:`start`, stop with :meth:`stop`; ``hangs`` / ``mismatch`` hold what it found."""

    options: WatchOptions
    hangs: list[dict[str, Any]] = field(default_factory=list)
    mismatch: dict[str, Any] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _attempt: int = 0
    _busy: threading.Lock = field(default_factory=threading.Lock)
    _alive_at: float = 0.0
    _said_alive: bool = False

    def start(self) -> None:
        """Run the watch in a daemon thread."""
        self.options.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.options.folder.glob(FACTS_GLOB):
            stale.unlink(
                missing_ok=True
            )  # an earlier launch's ranks (perhaps more of them) would be judged too
        self._thread = threading.Thread(target=self._loop, name="scalpel-hang-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a hang report being written is finished first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STACK_WAIT_S + 5)
        with self._busy:
            pass

    def logs(self) -> dict[int, RankLog]:
        """The current attempt's rank logs, by rank."""
        logs = {}
        for path in sorted(self.options.folder.glob(LOG_GLOB)):
            log = read_rank_log(path)
            if log is not None and log.restart >= self._attempt:
                logs[log.rank] = log
        return logs

    def timeout_for(self, logs: dict[int, RankLog]) -> float:
        """The hang timeout now (see the module doc)."""
        started = all(log.steps or log.completed for log in logs.values())
        if self.options.hang_timeout is not None:
            return self.options.hang_timeout if started else max(self.options.hang_timeout, STARTUP_FLOOR_S)
        slowest = max((log.step_ms for log in logs.values() if log.steps >= 3), default=0.0)
        if not started or not slowest:
            return STARTUP_S
        return max(FLOOR_S, MULTIPLE * slowest / 1000.0)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll()
            except Exception as exc:  # the watch must never take the launch down with it
                print(
                    f"scalpel launch: hang watch stopped: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                return

    def _poll(self) -> None:
        logs = self.logs()
        if not logs:
            return
        if self.options.check and self.mismatch is None:
            found = first_mismatch(logs)
            if found is not None:
                self.report_mismatch(found)
        if len(logs) < self.options.local_ranks or any(log.finished for log in logs.values()):
            return  # not all started; or one is done (a rank that ends early fails the others' collectives)
        if any(exit_status(log.pid) is not None for log in logs.values()):
            return  # a rank ended: torchrun reports it and stops the others
        timeout = self.timeout_for(logs)
        idle = time.time() - max(max(log.last_progress for log in logs.values()), self._alive_at)
        if idle > timeout:
            with self._busy:
                if self.handle_hang(logs, timeout, idle) is not None:
                    self._attempt = (
                        max(log.restart for log in logs.values()) + 1
                    )  # a restart gets a fresh watch

    def report_mismatch(self, found: dict[str, Any]) -> None:
        """Print the first desync and keep it in ``collective-mismatch.json``."""
        self.mismatch = found
        atomic_write_text(
            self.options.report_dir / "collective-mismatch.json", json.dumps(found, indent=1) + "\n"
        )
        print(
            f"scalpel launch: {found['message']} (found while the job runs; it will likely hang or fail there)",
            file=sys.stderr,
            flush=True,
        )

    def collect_stacks(self, logs: dict[int, RankLog]) -> tuple[dict[int, str], dict[int, str]]:
        """Signal every rank for its stacks; (rank -> new stack text, rank -> how it died while asked).

        Polls every 10 ms so that a rank's exit status is read before torchrun reaps it; a rank
        that dies after another is reported as dying after that one (torchrun stops the rest)."""
        folder = self.options.folder
        offsets = {}
        for rank, log in logs.items():
            path = stacks_path(folder, rank)
            offsets[rank] = path.stat().st_size if path.exists() else 0
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(log.pid, STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT_S
        sizes: dict[int, tuple[int, float]] = {}
        died: dict[int, tuple[float, str]] = {}
        pending = set(logs)
        while pending and time.monotonic() < deadline:
            for rank in list(pending):
                status = exit_status(logs[rank].pid)
                if status is not None:
                    died[rank] = (time.monotonic(), status)
                    pending.discard(rank)
                    continue
                path = stacks_path(folder, rank)
                size = path.stat().st_size if path.exists() else 0
                last = sizes.get(rank)
                if (
                    size > offsets[rank]
                    and last
                    and last[0] == size
                    and time.monotonic() - last[1] >= STABLE_S
                ):
                    pending.discard(rank)
                elif size > offsets[rank] and (not last or last[0] != size):
                    sizes[rank] = (size, time.monotonic())
            time.sleep(0.01)
        texts = {}
        for rank in logs:
            path = stacks_path(folder, rank)
            with contextlib.suppress(OSError), path.open("rb") as fh:
                fh.seek(offsets[rank])
                texts[rank] = fh.read().decode(errors="replace")
        dead = {}
        if died:
            # the ranks our stack signal killed died of the request; the others were stopped after them
            # (torchrun's SIGTERM). Only without that evidence does the order of death decide, which
            # polling can misread when torchrun is fast.
            by_request = [r for r, (_, status) in died.items() if signal.Signals(STACK_SIGNAL).name in status]
            first_rank, (first_t, _) = min(
                ((r, died[r]) for r in by_request) if by_request else died.items(), key=lambda kv: kv[1][0]
            )
            for rank, (t, status) in died.items():
                late = (rank not in by_request) if by_request else (t - first_t > 0.05 and rank != first_rank)
                dead[rank] = (
                    f"{status}, after rank {first_rank} died"
                    if late
                    else f"{status} while asked for its stack"
                )
        return texts, dead

    def fill_exit_codes(self, codes: dict[int, int]) -> None:
        """Put torchrun's exit codes into the last hang report where the watch could not read them."""
        if not self.hangs:
            return
        diag = self.hangs[-1]
        changed = False
        for rank, code in codes.items():
            st = diag["ranks"].get(str(rank))
            if st and st["state"] == "dead" and st["where"].startswith("dead (exited"):
                st["where"] = st["where"].replace("exited", _describe_code(code), 1)
                changed = True
        if changed:
            diag["summary"] = summarize(diag)
            self._write(diag)

    def _stacks(self, logs: dict[int, RankLog]) -> tuple[dict[int, list[Any]], dict[int, str]]:
        texts, dead = self.collect_stacks(logs)
        stacks = {}
        for rank, text in texts.items():
            threads = parse_stacks(text)
            stacks[rank] = threads.get(logs[rank].main_thread) or next(iter(threads.values()), [])
        return stacks, dead

    def still_working(self, logs: dict[int, RankLog], stacks: dict[int, list[Any]]) -> list[int]:
        """Ranks outside any wait whose stack, CPU time or I/O moves over :data:`LIVENESS_S` (not hung:
        a long evaluation or a rank-0 checkpoint save while the others wait at a barrier)."""
        from torchscalpel.distributed.hangdiag import rank_state

        free = [r for r, log in logs.items() if not rank_state(log, stacks.get(r, []), None)["waiting"]]
        if not free:
            return []
        before = {r: _usage(logs[r].pid) for r in free}
        time.sleep(LIVENESS_S)
        after = {r: _usage(logs[r].pid) for r in free}  # before the next dump, whose write would count as I/O
        after_stacks, dead = self._stacks({r: logs[r] for r in free})
        moving = []
        for r in free:
            if r in dead:
                continue
            stack_moved = bool(after_stacks.get(r)) and bool(stacks.get(r)) and after_stacks[r] != stacks[r]
            if stack_moved or after[r][0] - before[r][0] > LIVE_CPU_S or after[r][1] > before[r][1]:
                moving.append(r)
        return moving

    def handle_hang(self, logs: dict[int, RankLog], timeout: float, idle: float) -> dict[str, Any] | None:
        """Collect, check that no rank still works, diagnose, write, print, then kill every rank.

        Returns None (and keeps watching) when a rank outside any wait is still working."""
        stacks, dead = self._stacks(logs)
        if not dead:
            moving = self.still_working(logs, stacks)
            if moving:
                self._alive_at = time.time()
                if not self._said_alive:
                    self._said_alive = True
                    who = ", ".join(map(str, moving))
                    print(
                        f"scalpel launch: no step or collective finished for {idle:.0f} s, but rank {who} is still "
                        "working (its stack, CPU time or I/O moves); still watching.",
                        file=sys.stderr,
                        flush=True,
                    )
                return None
            stacks, dead = self._stacks(logs)  # the newest stacks go into the report
        diag = diagnose(logs, stacks, dead, sorted(logs))
        last = max(log.last_progress for log in logs.values())
        diag.update(
            {
                "kind": "hang",
                "hang_timeout_s": timeout,
                "idle_s": round(idle, 2),
                "detected_after_s": round(time.time() - last, 2),
            }
        )
        if self.mismatch and not diag.get("mismatch"):
            diag["mismatch"] = self.mismatch
        try:
            if self.options.nccl_trace:  # before the kill: the dumper threads live in the ranks
                self._flight_recorder(diag, logs, dead)
        finally:  # whatever the dumps hold, the ranks are stopped: else the job hangs until NCCL's timeout
            for log in logs.values():
                kill_rank(log.pid)
        diag["torn_down_after_s"] = round(time.time() - last, 2)
        text = self._write(diag)
        print(text, file=sys.stderr, flush=True)
        self.hangs.append(diag)
        return diag

    def _flight_recorder(self, diag: dict[str, Any], logs: dict[int, RankLog], dead: dict[int, str]) -> None:
        """Ask the live ranks for their NCCL flight recorders and put them (and their summary) in ``diag``;
        a failure is noted in ``diag["nccl_error"]`` and never stops the hang report."""
        from torchscalpel.distributed.flightrec import collect_dumps, request_dumps, summarize_dumps

        try:
            alive = [r for r in sorted(logs) if r not in dead]
            request_dumps(self.options.folder, alive)
            diag["nccl_trace"] = {
                str(r): p
                for r, p in collect_dumps(self.options.folder, self.options.report_dir, alive).items()
            }
            diag["nccl_summary"] = summarize_dumps(diag["nccl_trace"])
        except Exception as exc:  # the dumps are the ranks' files: reading them must not cost the report
            diag["nccl_error"] = (
                f"the NCCL flight recorder dumps were not summarised ({type(exc).__name__}: {exc})"
            )

    def _write(self, diag: dict[str, Any]) -> str:
        out = self.options.report_dir
        try:
            body = json.dumps(diag, indent=1, default=str)
            text = format_report(diag)
        except (ValueError, TypeError, RecursionError) as exc:
            # what the dumps held is the only part of diag from another process: the report goes out without it
            summary = diag.pop("nccl_summary", None)
            if summary is None:
                raise
            diag["nccl_error"] = (
                f"the NCCL flight recorder summary could not be written ({type(exc).__name__}); "
                "the dumps are in nccl-trace/"
            )
            body = json.dumps(diag, indent=1, default=str)
            text = format_report(diag)
        atomic_write_text(out / "hang.json", body + "\n")
        atomic_write_text(out / "hang.txt", text + "\n")
        return text


def _usage(pid: int) -> tuple[float, int]:
    """CPU seconds and bytes read+written by a rank and its children (DataLoader workers)."""
    import psutil

    cpu, io = 0.0, 0
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system
                c = p.io_counters()
                io += c.read_chars + c.write_chars
    except psutil.Error:
        pass
    return cpu, io


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def watch_findings(report_dir: Path) -> list[dict[str, Any]]:
    """The watch's results as findings for ``launch.json`` (first: they explain whatever follows)."""
    from torchscalpel.findings import Finding, Severity

    found = []
    mismatch_path, hang_path = report_dir / "collective-mismatch.json", report_dir / "hang.json"
    mismatch = json.loads(mismatch_path.read_text()) if mismatch_path.is_file() else None
    hang = json.loads(hang_path.read_text()) if hang_path.is_file() else None
    mismatch = mismatch or (hang or {}).get("mismatch")
    if mismatch:
        f = Finding(
            rule="collective-mismatch",
            severity=Severity.ERROR,
            message=mismatch["message"],
            evidence=[
                f"rank {r}: {e['op']} {e.get('shapes')} {e.get('dtypes')} from {e.get('site')}"
                for r, e in mismatch["ranks"].items()
            ],
            fix="Every rank must call the same collectives in the same order with the same shapes and dtypes: "
            "move collectives out of rank-dependent branches (log on every rank, or gather first).",
            source="launch",
        )
        found.append({**f.to_dict(), "ranks": sorted(int(r) for r in mismatch["ranks"])})
    if hang:
        f = Finding(
            rule="rank-hang",
            severity=Severity.ERROR,
            message=f"the job hung: {hang['summary']}",
            evidence=[
                f"no progress for {hang.get('idle_s')} s (timeout {hang.get('hang_timeout_s')} s)",
                f"stacks and last collectives: {report_dir / 'hang.txt'}",
            ],
            fix="Look at the diverging rank's line in hang.txt; a collective it skipped or reordered, or a "
            "blocking read, is the usual cause.",
            source="launch",
        )
        found.append(
            {**f.to_dict(), "ranks": hang.get("diverging_ranks") or sorted(int(r) for r in hang["ranks"])}
        )
    return found
