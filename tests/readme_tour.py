"""README.md's tour as a test: its command blocks, run in order in a fresh copy of the checkout, their shown
output checked against what ran.

The README's own conventions, which this module reads:

- a ```console block holds commands (``$ CMD``, continued by a trailing backslash) each followed by the output
  it shows; a ```python block is a snippet that runs alone (``python -c``), followed by a bare ``` block of its
  output; ```bash blocks are commands without shown output (checked for exit 0);
- ``...`` on a line of its own stands for any number of lines (none included); inside a line, for any text;
  without it, shown lines must be consecutive lines of the output, from its first line to its last;
- ``<!-- tour: figures vary -->`` on the line before a block: its numbers (times, rates, sizes of a run) are
  compared by shape (a number where the README shows one), and runs of spaces or table rules as one;
  otherwise lines compare exactly (a run folder's time stamp is always compared by shape);
- ``<!-- tour: not run: REASON -->`` on the line before a block: left out, with the reason (installs, the
  test suite itself);
- a command ending in ``# exit N`` must exit N (otherwise 0); one ending in ``&`` runs in the background
  until the tour ends, its shown output awaited while it runs.

Every line any command printed must also end without trailing spaces (piped output is never padded).

``python tests/readme_tour.py [README]`` runs the tour and prints each command's time and any mismatch: the
way to refresh the README's figures from a real run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*tour:\s*(.*?)\s*-->\s*$")
EXIT = re.compile(r"#\s*exit (\d+)\s*$")
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
STAMP = re.compile(r"\d{8}-\d{6}")
RULES = re.compile(r"([━─-])\1+")
SPACES = re.compile(r" {2,}")


@dataclass
class Command:
    """One command of a block: what is typed, the output it shows, the exit code it must have."""

    text: str
    shown: list[str] = field(default_factory=list)
    rc: int = 0
    background: bool = False


@dataclass
class Block:
    """A fenced block of the README that the tour runs, where it starts, and how its figures compare."""

    line: int
    kind: str
    commands: list[Command]
    vary: bool = False
    skip: str | None = None


def parse(text: str) -> list[Block]:
    """The README's blocks in order: console / bash / python ones as commands; the bare block right after a
    python one is that snippet's output; every other fenced block (toml, diff, plain text) is not a command."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        kind, start = m.group(1), i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = lines[i + 1 : end]
        i = end + 1
        mark = MARK.match(lines[start - 1]) if start else None
        note = mark.group(1) if mark else ""
        vary = note == "figures vary"
        skip = note.removeprefix("not run:").strip() if note.startswith("not run:") else None
        if kind == "console":
            blocks.append(Block(start + 1, kind, console_commands(body), vary, skip))
        elif kind == "bash":
            cmds = [Command(c) for c in joined_commands(body)]
            blocks.append(Block(start + 1, kind, cmds, vary, skip))
        elif kind == "python":
            cmd = Command("\n".join(body))
            if i < len(lines) and lines[i].strip() == "```":
                out_end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
                cmd.shown = lines[i + 1 : out_end]
                i = out_end + 1
            blocks.append(Block(start + 1, kind, [cmd], vary, skip))
    return blocks


def joined_commands(body: list[str]) -> list[str]:
    """A bash block's commands: one a line, a trailing backslash continuing it, comments and blanks left out."""
    out: list[str] = []
    pending = ""
    for line in body:
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line
        if line.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        out.append(pending)
        pending = ""
    return out


def console_commands(body: list[str]) -> list[Command]:
    """``$ `` lines (a trailing backslash continues one) and the output shown under each."""
    cmds: list[Command] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line.startswith("$ "):
            text = line[2:]
            while text.rstrip().endswith("\\") and i + 1 < len(body):
                i += 1
                text = text.rstrip()[:-1] + " " + body[i].strip()
            exit_mark = EXIT.search(text)
            rc = int(exit_mark.group(1)) if exit_mark else 0
            code = text.split(" #", 1)[0].rstrip() if " #" in text else text.rstrip()
            background = code.endswith("&")
            cmds.append(
                Command(code.removesuffix("&").rstrip() if background else text, rc=rc, background=background)
            )
        elif cmds:
            cmds[-1].shown.append(line)
        else:
            raise ValueError(f"console output before any '$ ' command: {line!r}")
        i += 1
    return cmds


def line_pattern(shown: str, vary: bool) -> re.Pattern[str]:
    """The regular expression a shown line stands for: inner ``...`` any text, time stamps by shape, and with
    ``vary`` every number by shape and runs of spaces or rules as one."""
    if vary:
        shown = RULES.sub(r"\1", SPACES.sub(" ", shown))
    out = []
    for k, part in enumerate(shown.split("...")):
        if k:
            out.append(".*?")
        pos = 0
        pieces = []
        for m in (NUMBER if vary else STAMP).finditer(part):
            pieces.append(re.escape(part[pos : m.start()]))
            pieces.append(NUMBER.pattern if vary else STAMP.pattern)
            pos = m.end()
        pieces.append(re.escape(part[pos:]))
        text = "".join(pieces)
        if not vary:
            text = STAMP.sub(lambda _: STAMP.pattern, text)
        out.append(text)
    return re.compile("".join(out))


def normal(line: str, vary: bool) -> str:
    """An output line as it is compared: trailing spaces off; with ``vary`` runs of spaces and rules as one."""
    line = line.rstrip()
    return RULES.sub(r"\1", SPACES.sub(" ", line)) if vary else line


def mismatch(shown: list[str], actual: list[str], vary: bool) -> str | None:
    """None when the shown lines match the actual ones under the rules above; otherwise the first shown line
    that found no place, in a sentence."""
    groups: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            groups.append([])
        else:
            groups[-1].append(line)
    head_free, tail_free = len(groups[0]) == 0, len(groups[-1]) == 0
    pats = [[line_pattern(s, vary) for s in g] for g in groups]
    lines = [normal(a, vary) for a in actual]

    def fits(g: list[re.Pattern[str]], at: int) -> bool:
        return at + len(g) <= len(lines) and all(p.fullmatch(lines[at + k]) for k, p in enumerate(g))

    pos = 0
    for n, g in enumerate(pats):
        if not g:
            continue
        last = n == len(pats) - 1
        if n == 0 and not head_free:
            if not fits(g, 0):
                return first_miss(groups[n], g, lines, 0)
            pos = len(g)
            continue
        if last and not tail_free:
            at = len(lines) - len(g)
            if at < pos or not fits(g, at):
                return first_miss(groups[n], g, lines, max(at, pos), tail=True)
            pos = len(lines)
            continue
        found = next((at for at in range(pos, len(lines) - len(g) + 1) if fits(g, at)), None)
        if found is None:
            return first_miss(groups[n], g, lines, pos)
        pos = found + len(g)
    if not head_free and len(pats) == 1 and pos != len(lines):
        return f"output goes on after the shown lines (no '...'): {lines[pos]!r}"
    return None


def first_miss(
    shown: list[str], pats: list[re.Pattern[str]], lines: list[str], at: int, tail: bool = False
) -> str:
    """The first shown line of a group that matched nothing in order, named with what stood there."""
    for s, p in zip(shown, pats, strict=True):
        hit = next((k for k in range(at, len(lines)) if p.fullmatch(lines[k])), None)
        if hit is None:
            return f"shown line not in the output (after line {at + 1}): {s!r}"
        if not tail and hit != at:
            return f"shown line {s!r} is output line {hit + 1}, not {at + 1} ({lines[at]!r} stands there)"
        at = hit + 1
    where = "at the end" if tail else "in order"
    return f"the shown lines do not appear {where}: {shown!r}"


@dataclass
class Ran:
    """What one command did: its block, its output, its exit status, its seconds, and what was wrong."""

    block: Block
    command: Command
    output: list[str]
    rc: int | None
    seconds: float
    problems: list[str]


def fresh_copy(dest: Path) -> Path:
    """The checkout as a fresh clone would have it: the files git tracks or would track (not ignored), copied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    fresh = not (dest / ".git").exists()
    for rel in filter(None, (p.decode() for p in listed)):
        src = REPO / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    if fresh:  # a clone is a git repository: fix finds its root, provenance its commit
        git = ["git", "-c", "user.name=tour", "-c", "user.email=tour@localhost", "-c", "commit.gpgsign=false"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tour"]):
            subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


def shims(bin_dir: Path) -> None:
    """``scalpel`` and ``python`` on PATH as an installed user has them, both this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, line in (
        ("scalpel", f'exec {sys.executable} -m torchscalpel "$@"'),
        ("python", f'exec {sys.executable} "$@"'),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(0o755)


def tour_env(copy: Path, bin_dir: Path) -> dict[str, str]:
    """A user's shell: this checkout's src importable, the shims first on PATH, no width or colour forced."""
    env = dict(os.environ)
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(copy / "src")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor"))
    return env


def padded(output: list[str]) -> list[str]:
    """Lines printed with trailing spaces (piped output must not be padded); a lone space is a unified diff's
    context line for an empty line, as the format has it."""
    return [
        f"line {k + 1} ends in spaces: {line!r}"
        for k, line in enumerate(output)
        if line != line.rstrip() and line != " "
    ]


def run_tour(
    readme: Path, work: Path, timeout: float = 240, log: bool = False, lines: tuple[int, int] | None = None
) -> list[Ran]:
    """Every block of README.md that is not marked ``not run``, in order, in a fresh copy under ``work`` (with
    ``lines``, only the blocks that start in that range of README lines, over what earlier runs left there)."""
    copy = fresh_copy(work / "checkout")
    bin_dir = work / "bin"
    shims(bin_dir)
    env = tour_env(copy, bin_dir)
    where = work / "cwd"
    where.write_text(str(copy))
    ran: list[Ran] = []
    background: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for block in parse(readme.read_text()):
            if block.skip is not None or (lines and not lines[0] <= block.line <= lines[1]):
                continue
            for cmd in block.commands:
                start = time.monotonic()
                if block.kind == "python":
                    argv = [sys.executable, "-c", cmd.text]  # alone, in a fresh interpreter
                else:
                    # the shell's folder carries over from one command to the next, as in a user's shell
                    script = f'cd "$(cat {where})" && {{ {cmd.text}\n}}; rc=$?; pwd > {where}; exit $rc'
                    argv = ["bash", "-o", "pipefail", "-c", script]
                if cmd.background:
                    out_file = work / f"background-{len(background)}.log"
                    with out_file.open("wb") as sink:
                        proc = subprocess.Popen(
                            argv,
                            cwd=copy,
                            env=env,
                            stdout=sink,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    background.append((proc, out_file))
                    output, rc = await_output(proc, out_file, cmd, block.vary, timeout=60)
                else:
                    try:
                        done = subprocess.run(
                            argv,
                            cwd=copy,
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            timeout=timeout,
                            check=False,
                            start_new_session=True,
                        )
                        output, rc = done.stdout.decode(errors="replace").splitlines(), done.returncode
                    except subprocess.TimeoutExpired as e:
                        output = (e.output or b"").decode(errors="replace").splitlines()
                        rc = None
                found = []
                if rc is None and not cmd.background:
                    found.append(f"did not end in {timeout:.0f} s")
                elif not cmd.background and rc != cmd.rc:
                    found.append(f"exit {rc}, the README says {cmd.rc}")
                miss = mismatch(cmd.shown, output, block.vary) if cmd.shown else None
                if miss:
                    found.append(miss)
                found += padded(output)
                r = Ran(block, cmd, output, rc, time.monotonic() - start, found)
                ran.append(r)
                if log:
                    report_one(r)
    finally:
        for proc, _ in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return ran


def await_output(
    proc: subprocess.Popen[bytes], out_file: Path, cmd: Command, vary: bool, timeout: float
) -> tuple[list[str], int | None]:
    """A background command's output once its shown lines are there (or it ended, or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        output = out_file.read_text(errors="replace").splitlines()
        if (
            mismatch(cmd.shown, output, vary) is None
            or proc.poll() is not None
            or time.monotonic() > deadline
        ):
            return output, proc.poll()
        time.sleep(0.2)


def report_text(ran: list[Ran], output: bool = True) -> str:
    """Each command's line: time, README line, the command, then what was wrong and (``output``) what it
    printed."""
    out = []
    for r in ran:
        head = r.command.text.splitlines()[0][:100]
        out.append(f"{r.seconds:6.1f} s  README:{r.block.line}  {head}")
        out += [f"         ! {p}" for p in r.problems]
        if output and (r.problems or os.environ.get("TOUR_SHOW")):
            out += ["         --- output:", *(f"         | {line}" for line in r.output)]
    return "\n".join(out)


def report_one(r: Ran) -> None:
    """One command's part of the log, printed as soon as it ran."""
    print(report_text([r]), flush=True)


def main(argv: list[str]) -> int:
    """Run the tour and print each command's time and problems; exit 1 when any command had one. ``--work DIR``
    keeps the copy in DIR; ``--lines A-B`` then runs only the blocks starting in those README lines."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("readme", nargs="?", type=Path, default=REPO / "README.md")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--lines", default=None, help="A-B: only the blocks that start in these lines")
    args = parser.parse_args(argv)
    span = tuple(int(x) for x in args.lines.split("-")) if args.lines else None
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        ran = run_tour(args.readme, args.work, log=True, lines=span)  # type: ignore[arg-type]
    else:
        with tempfile.TemporaryDirectory(prefix="readme-tour-") as tmp:
            ran = run_tour(args.readme, Path(tmp), log=True)
    total = sum(r.seconds for r in ran)
    bad = [r for r in ran if r.problems]
    print(f"{len(ran)} command(s) in {total:.0f} s; {len(bad)} with a problem")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
