"""Kernel and op names shortened the way profilers show them: demangled, templates and argument lists elided.

``void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)``
becomes ``at::native::vectorized_elementwise_kernel<…>``; the report keeps the full name in a hover
``<title>``. Rendering only: nothing here reads a trace.
"""

from __future__ import annotations

import re

_RETURN = re.compile(r"^(?:void|auto|static|__global__|unsigned|int|float|double|char)\s+")
_SOURCE_NAME = re.compile(r"(\d+)")


def demangle(name: str) -> str:
    """A best-effort demangling of an Itanium C++ symbol's qualified name (``_ZN2at6native5fooEv`` ->
    ``at::native::foo``); any other name is returned as it is."""
    if not name.startswith("_Z"):
        return name
    rest = name[2:]
    nested = rest.startswith("N")
    if nested:
        rest = rest[1:]
    parts: list[str] = []
    while rest and rest[0].isdigit():
        m = _SOURCE_NAME.match(rest)
        if m is None:
            break
        n = int(m.group(1))
        start = m.end()
        parts.append(rest[start : start + n])
        rest = rest[start + n :]
        if not nested:
            break
    return "::".join(parts) if parts else name


def _elide(text: str, open_ch: str, close_ch: str, keep: str) -> str:
    """Replace every outermost ``open_ch ... close_ch`` group with ``open_ch + keep + close_ch``."""
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == open_ch:
            if depth == 0:
                out.append(open_ch + keep)
            depth += 1
        elif ch == close_ch and depth:
            depth -= 1
            if depth == 0:
                out.append(close_ch)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def short_kernel_name(name: str, limit: int = 80) -> str:
    """``name`` demangled, its return type dropped, template arguments shown as ``<…>`` and the argument
    list removed; cut to ``limit`` characters with an ellipsis. Names without templates or arguments
    (``aten::mm``, ``Memcpy HtoD``) stay as they are."""
    text = demangle(name.strip())
    text = _RETURN.sub("", text)
    if "<" in text:
        text = _elide(text, "<", ">", "…")
    cut = text.find("(")
    if (
        cut > 0 and text.endswith(")") and not text[cut - 1].isspace()
    ):  # "f(int, float)", not "Memcpy HtoD (Pageable)"
        text = text[:cut]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


NAME_LIMIT = 120
"""Longest record name, path or label drawn as is: a record may hold a name of up to a MiB
(:data:`torchscalpel.record_schema.MAX_STRING`), which would otherwise be repeated in every heading."""


def clip(value: object, limit: int = NAME_LIMIT) -> str:
    """``value`` as text (a path, a name), cut to ``limit`` characters, saying how much was left out (linear in
    ``limit``)."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"
