"""Running the static rules: every rule class of :mod:`torchscalpel.doctor.catalogue` over the
parsed files (``scalpel doctor --static``, and the static half of every doctor run).

Above the catalogue, as the runtime half (:mod:`torchscalpel.doctor.api`) is: the rule classes and
their base (:mod:`torchscalpel.doctor.static`) never import this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path

from torchscalpel.doctor import catalogue, static
from torchscalpel.doctor.rule import guarded
from torchscalpel.doctor.static import NotAnalysed, parse_source
from torchscalpel.errors import UsageError
from torchscalpel.findings import Finding


def analyze_source(
    source: str,
    path: str,
    *,
    rules: Sequence[str] | None = None,
    not_analysed: list[NotAnalysed] | None = None,
) -> list[Finding]:
    """All static findings for one file's text (``rules``: only these slugs); a file that does not
    parse gives no findings and, when ``not_analysed`` is given, an entry there saying why."""
    ctx = parse_source(source, path)
    if isinstance(ctx, NotAnalysed):
        if not_analysed is not None:
            not_analysed.append(ctx)
        return []
    out: list[Finding] = []
    for cls in catalogue.STATIC_RULES:
        slug = cls.slugs[0]
        if rules is None or slug in rules:
            try:
                out.extend(guarded(slug, partial(cls().check, ctx), source="static"))
            except (RecursionError, MemoryError):  # a rule walking a pathological tree recursively
                if not_analysed is not None:
                    not_analysed.append(
                        NotAnalysed(path, f"rule {slug} not run: the file's syntax tree is too deep")
                    )
    return out


def iter_python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Python files named directly or found under folders (skipping hidden and virtualenv folders)."""
    for path in paths:
        if not path.exists():
            raise UsageError(
                f"{path} does not exist; pass Python files or folders to 'scalpel doctor --static'."
            )
        if path.is_file():
            yield path
            continue
        for file in sorted(path.rglob("*.py")):
            rel = file.relative_to(path).parts
            if any(
                p.startswith(".") or p in {"__pycache__", "site-packages", "node_modules", "venv"}
                for p in rel[:-1]
            ):
                continue
            yield file


def analyze_paths(
    paths: Iterable[Path],
    *,
    rules: Sequence[str] | None = None,
    not_analysed: list[NotAnalysed] | None = None,
) -> list[Finding]:
    """Static findings over files and folders; files that cannot be read or parsed (or are over
    :data:`~torchscalpel.doctor.static.MAX_SOURCE_BYTES`) give no findings and an entry in ``not_analysed`` when it is given."""
    skipped: list[NotAnalysed] = [] if not_analysed is None else not_analysed
    out: list[Finding] = []
    for file in iter_python_files(paths):
        try:
            size = file.stat().st_size
            if size > static.MAX_SOURCE_BYTES:
                skipped.append(
                    NotAnalysed(
                        str(file),
                        f"{size / 2**20:.1f} MiB is over the "
                        f"{static.MAX_SOURCE_BYTES >> 20} MiB limit for static analysis",
                    )
                )
                continue
            with file.open("rb") as fh:  # bounded read: the file may have grown since stat
                data = fh.read(static.MAX_SOURCE_BYTES + 1)
        except OSError as exc:
            skipped.append(NotAnalysed(str(file), f"cannot be read ({exc.strerror or exc})"))
            continue
        if len(data) > static.MAX_SOURCE_BYTES:
            skipped.append(
                NotAnalysed(
                    str(file), f"over the {static.MAX_SOURCE_BYTES >> 20} MiB limit for static analysis"
                )
            )
            continue
        text = data.decode("utf-8", errors="replace")
        out.extend(analyze_source(text, str(file), rules=rules, not_analysed=skipped))
    return out
