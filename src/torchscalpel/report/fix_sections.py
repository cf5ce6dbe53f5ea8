"""The fix page (``RUN_DIR/fix.html``) and the fix sections of a fixed run's report: reads the fix record
``scalpel fix`` keeps in the run folder (:class:`torchscalpel.fix.measured.FixMark`, ``fix.json``), never
measures.

Verdict first: what was patched and whether it was verified (with the verification's figures); then what
the patch came from (each run and the figures it measured); then the diff itself.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from torchscalpel.fix.measured import FixMark, read_mark
from torchscalpel.report.page import Section

PAGE_FILE = "fix.html"
"""Where ``scalpel fix`` writes the page: beside ``fix.json`` in each run folder it read."""

_STATUS_WORDS = {"patched": "patched", "already": "already done", "not patched": "not patched"}
# Diff lines coloured as a code review shows them (inline styles: the page's stylesheet is shared).
_DIFF_STYLES = (
    ("+++", "font-weight:600"),
    ("---", "font-weight:600"),
    ("+", "background:#e6f4ea;color:#05603a"),
    ("-", "background:#fdecea;color:#912018"),
    ("@@", "color:#175cd3"),
    ("#", "color:#667085"),
)


def verdict_sentence(mark: FixMark) -> str:
    """The page's first sentence: how many changes were patched in how many files, whether they were
    written, and whether the patched copy was verified."""
    patched = [i for i in mark.items if i.status == "patched"]
    files = {i.where.rsplit(":", 1)[0] for i in patched if i.where}
    what = (
        f"{len(patched)} change{'s' if len(patched) != 1 else ''} patched"
        + (f" in {len(files)} file{'s' if len(files) != 1 else ''}" if files else "")
        if patched
        else "No change patched"
    )
    written = "written to your files" if mark.applied else "not written to your files (--apply writes them)"
    if mark.verified is None:
        checked = "not verified (--verify re-runs the patched copy and measures it)"
    elif mark.verified:
        checked = "verified: the patched copy was re-run and measured"
    else:
        checked = "NOT verified: the re-run of the patched copy did not confirm it (the figures below)"
    return f"{what}, {written}; {checked}."


def build(mark: FixMark, *, folder: str = "") -> list[Section]:
    """The fix sections: the verdict with each planned change and the verification, what the patch came
    from, and the diff. ``folder`` names the run folder in the command the page suggests."""
    verdict = [f"<p><b>{escape(verdict_sentence(mark))}</b></p>"]
    rows = []
    for item in mark.items:
        where = f" ({item.where})" if item.where else ""
        reason = f": {item.reason}" if item.status == "not patched" and item.reason else ""
        rows.append(
            f"<li>{escape(_STATUS_WORDS.get(item.status, item.status))}: <b>{escape(item.label)}</b>"
            f'{escape(where)} <span class="muted">from {escape(item.source)}</span>{escape(reason)}</li>'
        )
    if rows:
        verdict.append(f"<ul>{''.join(rows)}</ul>")
    if mark.verification:
        verdict.append("<h3>Verification</h3>" + _lines(mark.verification))
    elif mark.verified is None:
        command = f"scalpel fix {folder or 'RUN_DIR'} --verify"
        verdict.append(
            f"<p>Next: <code>{escape(command)}</code> runs the patched copy under plain python and measures "
            "it against the original (its figures land on this page).</p>"
        )
    sections = [Section(id="fix", title="Fix: the patch of your code", body="".join(verdict))]
    measured = "".join(f"<h3>{escape(run.folder)}</h3>" + _lines(run.lines) for run in mark.runs if run.lines)
    if measured:
        sections.append(Section(id="fix-measured", title="Fix: what the patch came from", body=measured))
    if mark.patch:
        sections.append(
            Section(
                id="fix-diff",
                title="Fix: the diff",
                body=f'<p class="muted">Made {escape(mark.made)}; <code>git apply</code> or '
                f"<code>patch -p1</code> takes it as it is.</p>{diff_html(mark.patch)}",
            )
        )
    return sections


def _lines(lines: tuple[str, ...]) -> str:
    """Lines as a list; a line indented under another (a failed start's own last lines) as code below it."""
    items: list[str] = []
    for line in lines:
        if line.startswith("    ") and items:
            items[-1] = items[-1].removesuffix("</li>") + f"<pre>{escape(line.strip())}</pre></li>"
        else:
            items.append(f"<li>{escape(line)}</li>")
    return f"<ul>{''.join(items)}</ul>"


def diff_html(patch: str) -> str:
    """The diff in a ``<pre>``: added lines green, removed red, hunk heads blue, the header grey."""
    out = []
    for line in patch.splitlines():
        style = next((s for prefix, s in _DIFF_STYLES if line.startswith(prefix)), "")
        text = escape(line) or " "
        out.append(f'<span style="{style}">{text}</span>' if style else text)
    return f'<pre class="diff">{chr(10).join(out)}</pre>'


def sections_in(folder: Path) -> list[Section]:
    """The fix sections of the run in ``folder`` (a run folder or its run.json), none when fix never
    patched from it: what ``scalpel report`` adds to a fixed run's page."""
    run_dir = folder.parent if folder.is_file() else folder
    mark = read_mark(run_dir)
    return [] if mark is None else build(mark, folder=str(run_dir))


def page(mark: FixMark, *, folder: str) -> str:
    """The whole fix page of the run in ``folder``."""
    from torchscalpel.report.html import render_page

    runs = ", ".join(r.folder for r in mark.runs) or folder
    return render_page("torchscalpel · fix", f"{runs} · {mark.made}", build(mark, folder=folder))


def write_pages(run_dirs: list[Path]) -> list[Path]:
    """Write ``fix.html`` in each run folder whose ``fix.json`` holds a fix record; the pages written
    (a folder that cannot be written to is left out: the diff was printed all the same)."""
    from torchscalpel.fileio import atomic_write_text

    written = []
    for run_dir in run_dirs:
        mark = read_mark(run_dir)
        if mark is None:
            continue
        try:
            written.append(atomic_write_text(run_dir / PAGE_FILE, page(mark, folder=str(run_dir))))
        except OSError:
            continue
    return written
