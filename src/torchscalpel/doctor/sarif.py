"""SARIF 2.1.0 output for static findings, so code-scanning views (GitHub, IDEs) can show them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.doctor.registry import RULES
from torchscalpel.findings import Finding, Severity

if TYPE_CHECKING:
    from torchscalpel.doctor.static import NotAnalysed

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _uri(path: str, base: Path) -> str:
    """A relative, forward-slash URI when ``path`` lies under ``base``, else an absolute file URI."""
    p = Path(path).resolve()
    try:
        return p.relative_to(base.resolve()).as_posix()
    except ValueError:
        return p.as_uri()


def _not_analysed(skipped: Sequence[NotAnalysed], base: Path) -> dict[str, Any]:
    """The run's invocation: each file the rules could not read as a toolExecutionNotification, so a
    code-scanning view says 'not analysed' instead of showing a clean file."""
    notes = []
    for item in skipped:
        location: dict[str, Any] = {"artifactLocation": {"uri": _uri(item.path, base)}}
        if item.line:
            location["region"] = {"startLine": max(1, item.line)}
        notes.append(
            {
                "level": "error",
                "message": {"text": f"not analysed: {item.reason}"},
                "locations": [{"physicalLocation": location}],
            }
        )
    return {"executionSuccessful": False, "toolExecutionNotifications": notes}


def to_sarif(
    findings: Sequence[Finding],
    *,
    version: str,
    base: Path | None = None,
    not_analysed: Sequence[NotAnalysed] = (),
) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run; only findings that carry a source location are results. Files in
    ``not_analysed`` (a syntax error, too large) are the invocation's notifications."""
    base = base or Path.cwd()
    rule_ids = list(RULES)
    rules = [
        {
            "id": info.slug,
            "name": "".join(w.capitalize() for w in info.slug.split("-")),
            "shortDescription": {"text": info.summary},
            "defaultConfiguration": {"level": _LEVEL[info.severity]},
            "properties": {"category": info.category},
        }
        for info in RULES.values()
    ]
    results = []
    for f in findings:
        if f.location is None:
            continue
        region: dict[str, int] = {"startLine": max(1, f.location.line)}
        if f.location.column:
            region["startColumn"] = f.location.column
        text = f.message + (f"\nFix:\n{f.fix}" if f.fix else "")
        result: dict[str, Any] = {
            "ruleId": f.rule,
            "level": _LEVEL[f.severity],
            "message": {"text": text},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(f.location.file, base)},
                        "region": region,
                    }
                }
            ],
            "properties": {"evidence": list(f.evidence), "source": f.source},
        }
        if f.rule in RULES:
            result["ruleIndex"] = rule_ids.index(f.rule)
        results.append(result)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "torchscalpel-doctor",
                "version": version,
                "informationUri": "https://github.com/torchscalpel/torchscalpel/blob/main/docs/doctor.md",
                "rules": rules,
            }
        },
        "originalUriBaseIds": {"SRCROOT": {"uri": base.resolve().as_uri() + "/"}},
        "results": results,
    }
    if not_analysed:
        run["invocations"] = [_not_analysed(not_analysed, base)]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
