"""The building blocks of every report page: a titled :class:`Section` and an escaped HTML :func:`table`.

The stages' section builders (``report/<stage>_sections.py``) import these, and ``report/html.py``
imports the builders: keeping the blocks here keeps that one-way."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape

from torchscalpel.record import RunRecord


@dataclass(kw_only=True, slots=True)
class Section:
    """One titled block of the report; ``body`` is trusted HTML built with :func:`html.escape`."""

    id: str
    title: str
    body: str


SectionBuilder = Callable[[RunRecord], list[Section]]


class Markup(str):
    """A table cell that is already HTML (a link), inserted as it is; every other cell is escaped."""


def link(path: str) -> Markup:
    """A relative link to an output file, labelled with its path (outputs were listed as plain text)."""
    return Markup(f'<a href="{escape(path, quote=True)}">{escape(path)}</a>')


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[bool] | None = None
) -> str:
    """An HTML table; cells are escaped; ``numeric[i]`` right-aligns column i."""
    numeric = list(numeric or [False] * len(headers))
    head = "".join(
        f'<th class="{"num" if numeric[i] else ""}">{escape(str(h))}</th>' for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if numeric[i] else ""}">{c if isinstance(c, Markup) else escape(str(c))}</td>'
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def code_spans(text: str) -> str:
    """``text`` escaped, with each `backticked` span as ``<code>``: prose written once for a terminal (where
    backticks mark a command) reads on a page without literal backticks. An unpaired backtick stays as it is."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: no pairs to trust
        return escape(text)
    return "".join(escape(p) if i % 2 == 0 else f"<code>{escape(p)}</code>" for i, p in enumerate(parts))
