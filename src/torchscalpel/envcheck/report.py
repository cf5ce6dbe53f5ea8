"""``scalpel env``'s result: facts (+ nvidia-smi), checks, probes and their findings, as one JSON-ready dict.

The dict is what ``--json FILE`` writes and what :mod:`torchscalpel.report.env_terminal` renders:
``{"schema_version", "kind": "scalpel-env", "created", "tool_version", "facts", "probes",
"findings", "complete"}``. ``complete`` is False when the user interrupted the probes; what was
measured until then is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchscalpel.envcheck import nvidia_smi
from torchscalpel.envcheck.checks import run_checks
from torchscalpel.envcheck.facts import collect_facts
from torchscalpel.envcheck.probe_findings import findings_from_probes
from torchscalpel.envcheck.probes import ProbeResult, run_probes
from torchscalpel.fileio import atomic_write_text
from torchscalpel.findings import Finding
from torchscalpel.record import now_timestamp

ENV_REPORT_VERSION = "1.0"


def gather_facts(*, local_ranks: int | None = None, smi_timeout: float = 10.0) -> dict[str, Any]:
    """:func:`collect_facts` plus what only ``scalpel env`` asks: nvidia-smi, the planned local ranks."""
    facts = collect_facts()
    if local_ranks:
        facts["local_ranks"] = local_ranks
    smi = (facts.get("driver") or {}).get("nvidia_smi")
    if smi:
        facts["nvidia_smi"] = nvidia_smi.query(smi, timeout=smi_timeout)
    return facts


def build_report(
    *,
    probes: list[str] | tuple[str, ...],
    probe_timeout: float = 60.0,
    compile_timeout: float = 180.0,
    local_ranks: int | None = None,
    on_probe: Callable[[ProbeResult], None] | None = None,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Facts, checks and the named probes (none with ``probes=()``); Ctrl-C keeps the probes done so far."""
    from torchscalpel.version import __version__

    facts = facts if facts is not None else gather_facts(local_ranks=local_ranks)
    findings: list[Finding] = run_checks(facts)
    done: list[ProbeResult] = []

    def collect(result: ProbeResult) -> None:
        done.append(result)
        if on_probe:
            on_probe(result)

    complete = True
    try:
        if probes:
            run_probes(
                list(probes), timeout=probe_timeout, compile_timeout=compile_timeout, on_result=collect
            )
    except KeyboardInterrupt:
        complete = False
    findings += findings_from_probes(done)
    findings.sort(key=lambda f: -int(f.severity))
    return {
        "schema_version": ENV_REPORT_VERSION,
        "kind": "scalpel-env",
        "created": now_timestamp(),
        "tool_version": __version__,
        "facts": facts,
        "probes": [r.to_dict() for r in done],
        "probes_requested": list(probes),
        "findings": [f.to_dict() for f in findings],
        "complete": complete,
    }


def write_json(report: dict[str, Any], path: Path) -> Path:
    """Write the report atomically (a partial file never replaces a good one)."""
    atomic_write_text(path, json.dumps(report, indent=2, default=str) + "\n")
    return path
