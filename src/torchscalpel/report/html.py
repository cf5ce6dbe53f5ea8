"""The self-contained HTML report: one page of sections, each built from a record by a section builder.

Each stage has a builder (a function ``record -> list[Section]``) listed in :func:`section_builders`;
``scalpel analyze`` reuses :func:`render_page` with its own sections, so there is one page style.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from torchscalpel.findings import location_text
from torchscalpel.record import RunRecord
from torchscalpel.report.names import clip
from torchscalpel.report.page import Section, SectionBuilder


def section_builders() -> list[SectionBuilder]:
    """Every stage's section builder. Imported when a page is built, not with this module: a builder's
    imports (tune's result types, plan's rows) stay off the import path of ``scalpel analyze``'s page.
    Verdicts first (the tune recommendation, the memory plan, the findings), then the evidence, then the
    environment: :func:`sections_for` keeps that order whatever a builder returns (see VERDICT_IDS)."""
    from torchscalpel.report import (
        batch_sections,
        env_sections,
        findings_sections,
        lr_sections,
        memory_sections,
        plan_sections,
        profile_sections,
        tune_sections,
    )

    return [
        tune_sections.build,
        lr_sections.build,
        batch_sections.build,
        plan_sections.build,
        memory_sections.build,
        findings_sections.build,
        profile_sections.build,
        env_sections.build,
    ]


VERDICT_IDS = ("tune", "lr", "batch", "plan", "findings", "trace-diff", "memory", "profile-verdict", "fix")
"""Section ids that carry a verdict: the recommendation, the learning-rate suggestion, the best batch size, the plan, the findings,
a comparison, memory's peak and out-of-memory fix ladder, where a profiled step goes, the patch scalpel fix made from
the run (and whether it was verified). They lead the page."""

ENVIRONMENT_IDS = ("environment",)
"""Section ids that describe where a run happened: they close the page."""


def verdict_first(sections: Sequence[Section]) -> list[Section]:
    """``sections`` reordered: verdicts (in :data:`VERDICT_IDS` order), the rest as given, the environment last."""

    def rank(s: Section) -> tuple[int, int]:
        if s.id in VERDICT_IDS:
            return (0, VERDICT_IDS.index(s.id))
        return (2, 0) if s.id in ENVIRONMENT_IDS else (1, 0)

    return sorted(sections, key=rank)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
header{background:#1d232b;color:#fff;padding:16px 28px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c6ccd4}header a{color:#9ecbff}main{max-width:1040px;margin:0 auto;padding:12px 28px 40px}
section{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:14px 18px;margin:16px 0}
h2{font-size:16px;margin:0 0 10px}table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f2}td.num,th.num{text-align:right;
font-variant-numeric:tabular-nums}svg.chart{display:block;margin:8px 0;font-size:11px;fill:#1d232b}
svg .grid{stroke:#e1e4e8}.sev-error{color:#b42318;font-weight:600}.sev-warning{color:#b54708;font-weight:600}
.sev-info{color:#175cd3}pre{background:#f3f4f6;padding:8px;overflow-x:auto;font-size:12px}
.muted{color:#667085}.kpis{display:flex;gap:24px;flex-wrap:wrap}.kpi b{display:block;font-size:20px}
td:not(.num),code,li,p{overflow-wrap:anywhere}
"""


def render_page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """A complete HTML document: inline CSS, no scripts, no external resources."""
    nav = " · ".join(f'<a href="#{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    body = "\n".join(
        f'<section id="{escape(s.id)}"><h2>{escape(s.title)}</h2>{s.body}</section>' for s in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p>"
        f"<p>{nav}</p></header><main>{body}</main></body></html>\n"
    )


def sections_for(record: RunRecord, builders: Iterable[SectionBuilder] = ()) -> list[Section]:
    """All sections the builders (default: :func:`section_builders`) produce for ``record`` (a failing
    builder adds an error note)."""
    out: list[Section] = []
    for builder in list(builders) or section_builders():
        func_name = getattr(builder, "__module__", "section").rsplit(".", 1)[-1]
        ref = f"{getattr(builder, '__module__', '?')}.{getattr(builder, '__qualname__', '?')}"
        try:
            out.extend(builder(record))
        except Exception as exc:  # a broken section must not cost the user the rest of the report
            out.append(
                Section(
                    id=f"error-{func_name}",
                    title="Report section failed",
                    body=f'<p class="sev-error">{escape(ref)}: {escape(repr(exc))}</p>',
                )
            )
    return verdict_first(out)


def write_report(record: RunRecord, path: Path) -> Path:
    """Render ``record`` into ``path`` (report.html) and return the path (written whole or not at all, a
    record's unencodable text escaped: :func:`torchscalpel.fileio.atomic_write_text`)."""
    from torchscalpel.fileio import atomic_write_text

    return atomic_write_text(path, record_page(record))


def record_page(record: RunRecord) -> str:
    """The report page of one record: every section its builders produce."""
    return record_page_with(record, ())


def record_page_with(record: RunRecord, extra: Sequence[Section]) -> str:
    """The report page of one record with ``extra`` sections beside its builders' (a fixed run's fix
    sections, read from its folder), in verdict-first order."""
    subtitle = f"{clip(_target_text(record))} · {clip(record.created)} · {clip(record.status)}"
    sections = verdict_first([*sections_for(record), *extra])
    return render_page(f"torchscalpel · {clip(record.name)}", subtitle, sections)


def _target_text(record: RunRecord) -> str:
    block = record.target.get("inprocess")
    if block and not (record.target.get("script") or record.target.get("module")):
        # an in-process block: "Cell In[3], line 4" in a notebook, as Jupyter names the cell
        path, _, line = str(block).rpartition(":")
        return location_text(path, int(line)) if path and line.isdigit() else str(block)
    return str(
        record.target.get("script")
        or record.target.get("module")
        or record.target.get("model")
        or record.name
    )


RECORD_KINDS = ("tune", "plan", "doctor")
"""Stage sections that name what wrote a record, checked in this order (a tune or plan record may also
hold a doctor's findings; a doctor record also has a step timeline)."""


def record_kind(record: RunRecord) -> str:
    """What wrote ``record``: ``tune``, ``plan``, ``doctor``, the scalpel verb in its command, ``profile``
    (a step timeline) or ``record``."""
    for kind in RECORD_KINDS:
        if kind in record.sections:
            return kind
    if (
        len(record.command) > 1
        and Path(str(record.command[0])).name == "scalpel"
        and not record.command[1].startswith("-")
    ):
        return str(record.command[1])
    return "profile" if record.steps else "record"


@dataclass(kw_only=True, slots=True)
class RecordGroup:
    """One record's part of a multi-record page: a titled group of the sections its builders produce."""

    record: RunRecord
    title: str = ""
    """Defaults to ``<kind> · <record name>``."""
    source: str = ""
    """Where the record was read from (shown under the title)."""
    extra: Sequence[Section] = ()
    """Sections beside the record's builders' (a fixed run's fix sections)."""


_GROUP_CSS = (
    ".group-head{margin:28px 0 0;padding:10px 18px;background:#e8eef6;border:1px solid #c9d6e6;"
    "border-radius:6px}.group-head h2{margin:0;font-size:18px}.group-head p{margin:2px 0 0}"
)


def render_records(
    groups: Sequence[RecordGroup], *, title: str, subtitle: str, lead: Sequence[Section] = ()
) -> str:
    """One page for several records: the ``lead`` sections, then one group per record with every
    section that record's builders produce.

    Section ids stay unique on the page (a repeated id gets ``-2``, ``-3``, ...; the first keeps its
    own, so links to ``#steps`` reach the first group's steps). A section identical to one already
    shown is named, not repeated; so is the Environment of a record from the same machine and software
    (only the load average or the process's variables differ).
    """
    used: set[str] = set()
    if not lead and len(groups) > 1:
        lead = [summary_section(groups)]

    def unique(ident: str) -> str:
        candidate, n = ident, 1
        while candidate in used:
            n += 1
            candidate = f"{ident}-{n}"
        used.add(candidate)
        return candidate

    seen: dict[tuple[str, str], str] = {}
    nav: list[str] = []
    parts: list[str] = []
    for s in lead:
        sid = unique(s.id)
        nav.append(f'<a href="#{escape(sid)}">{escape(s.title)}</a>')
        parts.append(f'<section id="{escape(sid)}"><h2>{escape(s.title)}</h2>{s.body}</section>')
    for i, group in enumerate(groups, start=1):
        record = group.record
        kind = record_kind(record)
        # "tune · tune": the name is said once when it is the kind
        heading = group.title or (kind if record.name in (kind, "") else f"{kind} · {clip(record.name)}")
        gid = unique(f"record-{i}")
        nav.append(f'<a href="#{escape(gid)}">{escape(heading)}</a>')
        body: list[str] = []
        repeated: list[str] = []
        for s in verdict_first([*sections_for(record), *group.extra]):
            key = (s.title, _machine_key(record) if s.id == "environment" else s.body)
            if key in seen:
                repeated.append(f"{s.title} (as in {seen[key]})")
                continue
            seen[key] = heading
            sid = unique(s.id)
            body.append(f'<section id="{escape(sid)}"><h2>{escape(s.title)}</h2>{s.body}</section>')
        meta = " · ".join(x for x in (_target_text(record), record.created, record.status, group.source) if x)
        note = f'<p class="muted">Not repeated: {escape(", ".join(repeated))}.</p>' if repeated else ""
        parts.append(
            f'<div class="group-head" id="{escape(gid)}"><h2>{escape(heading)}</h2>'
            f'<p class="muted">{escape(meta)}</p>{note}</div>'
        )
        parts.extend(body)
    return _document(title, subtitle, " · ".join(nav), "\n".join(parts), extra_css=_GROUP_CSS)


def summary_section(groups: Sequence[RecordGroup]) -> Section:
    """The first section of a page of several records: one row per record (what wrote it, how it ended, its
    median step, and its verdict's first sentence), each linking to the record's group below."""
    from torchscalpel.report.page import Markup, table

    rows = []
    for i, group in enumerate(groups, start=1):
        record = group.record
        kind = record_kind(record)
        median = record.summary_view().median_step_ms
        rows.append(
            (
                Markup(
                    f'<a href="#record-{i}">{escape(clip(record.name) or kind)}</a>'
                    + (f' <span class="muted">{escape(clip(group.source))}</span>' if group.source else "")
                ),
                kind,
                record.status,
                "-" if not median else f"{median:.2f}",
                verdict_text(record),
            )
        )
    body = table(
        ["record", "kind", "status", "median step ms", "verdict"], rows, [False, False, False, True, False]
    )
    return Section(id="summary", title=f"Summary of {len(groups)} records", body=body)


def verdict_text(record: RunRecord, limit: int = 220) -> str:
    """The first sentence of the record's first verdict section (the text a reader sees first on its own page),
    as plain text; "-" when the record has none."""
    import html
    import re

    for section in sections_for(record):
        if section.id not in VERDICT_IDS:
            continue
        # its first paragraph or list item (lr's verdict is the first item of a list), as plain text
        first = re.search(r"<(p|li)\b[^>]*>(.*?)</\1>", section.body, flags=re.S)
        part = first.group(2) if first else section.body
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", part)).split())
        if not text:
            continue
        sentence = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
        return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"
    return "-"


def _machine_key(record: RunRecord) -> str:
    """The environment facts that name the machine and software, without what changes from run to run
    (the load average, the process's variables), so records of one machine share one Environment section."""
    import json

    facts = {k: v for k, v in record.environment.items() if k != "env"}
    if isinstance(facts.get("cpu"), dict):
        facts["cpu"] = {k: v for k, v in facts["cpu"].items() if not k.startswith("load_avg")}
    return json.dumps(facts, sort_keys=True, default=str)


def _document(title: str, subtitle: str, nav: str, body: str, *, extra_css: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{escape(title)}</title>'
        f"<style>{_CSS}{extra_css}</style></head><body><header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p>"
        f"<p>{nav}</p></header><main>{body}</main></body></html>\n"
    )


def inline_summary(record: RunRecord, *, max_sections: int = 3) -> str:
    """An HTML fragment for a notebook cell: the record's first sections, scoped styles, no page chrome."""
    sections = sections_for(record)[:max_sections]
    css = scope_css(_CSS, ".scalpel-inline")
    head = (
        f"<p><b>torchscalpel · {escape(clip(record.name))}</b> · {escape(clip(record.status))} · "
        f"{len(record.steps)} step(s)</p>"
    )
    body = "".join(f"<section><h2>{escape(s.title)}</h2>{s.body}</section>" for s in sections)
    return f'<div class="scalpel-inline"><style>{css}</style>{head}{body}</div>'


def scope_css(css: str, scope: str) -> str:
    """``css`` with every selector of every rule under ``scope`` (``th,td{...}`` -> ``.s th,.s td{...}``): the
    page's own rules restyle nothing of the notebook around an inline summary. ``body`` becomes the scope
    itself."""
    out = []
    for rule in css.replace("\n", "").split("}"):
        if not rule.strip():
            continue
        selectors, _, decls = rule.partition("{")
        scoped = ",".join(
            scope if sel.strip() == "body" else f"{scope} {sel.strip()}" for sel in selectors.split(",")
        )
        out.append(f"{scoped}{{{decls}}}")
    return "".join(out)


def write_analysis_html(data: dict[str, Any], path: Path, diff: dict[str, Any] | None = None) -> None:
    """The ``scalpel analyze`` page: the shared page style with the trace (and diff) sections."""
    import torchscalpel.report.trace_sections as trace_sections
    from torchscalpel.report.analyze_terminal import verdict_lines
    from torchscalpel.report.trace_sections import build_diff_section

    sections = trace_sections.build(data)
    if diff is not None:  # the comparison leads the evidence
        sections.insert(0, build_diff_section(diff))
    first, *rest = verdict_lines(data, diff)
    body = f"<p><b>{escape(first[:1].upper() + first[1:])}.</b></p>" + (
        "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in rest) + "</ul>" if rest else ""
    )
    sections.insert(0, Section(id="verdict", title="Verdict", body=body))
    files = ", ".join(Path(r["path"]).name for r in data["ranks"])
    from torchscalpel.fileio import atomic_write_text

    atomic_write_text(path, render_page("torchscalpel · analyze", files, sections))
