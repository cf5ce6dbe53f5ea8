"""HTML sections for a trace analysis (``TraceAnalysis.to_dict()``): used by ``analyze`` and ``profile``.

Rendering only: every figure comes from the analysis dict; nothing is measured here.
"""

from __future__ import annotations

from html import escape
from typing import Any

from torchscalpel.report.charts import horizontal_bars, lines, stacked_bars
from torchscalpel.report.names import short_kernel_name
from torchscalpel.report.page import Section, table

_STEP_SERIES = (
    ("compute", "compute_us"),
    ("communication", "communication_us"),
    ("memcpy", "memcpy_us"),
    ("memset", "memset_us"),
    ("idle", "gpu_idle_us"),
)


def _ms(us: float | None) -> str:
    return "–" if us is None else f"{us / 1e3:,.2f}"


def _mib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**20:,.1f} MiB"


def build(result: dict[str, Any], *, prefix: str = "trace") -> list[Section]:
    """Sections: overview, per-step split, GPU breakdown, top ops, top kernels, memory, ranks, diff."""
    out: list[Section] = []
    ranks = result.get("ranks", [])
    out.append(Section(id=f"{prefix}-overview", title="Trace overview", body=_overview(result)))
    steps_body = _steps(ranks)
    if steps_body:
        out.append(Section(id=f"{prefix}-steps", title="Per-step breakdown", body=steps_body))
    gpu_body = _gpu(ranks)
    if gpu_body:
        out.append(Section(id=f"{prefix}-gpu", title="GPU time breakdown", body=gpu_body))
    if result.get("top_ops"):
        ops = result["top_ops"][:20]
        body = horizontal_bars(
            f"{prefix}-top-ops",
            [(o["name"], o["self_us"] / 1e3) for o in ops],
            unit="ms",
            x_title="self time (ms)",
            y_title="op",
        )
        body += table(
            ["op", "category", "calls", "self ms", "total ms"],
            [[o["name"], o["category"], o["count"], _ms(o["self_us"]), _ms(o["total_us"])] for o in ops],
            [False, False, True, True, True],
        )
        cats = result.get("categories") or {}
        if cats:
            body += (
                "<p>Self time by category: "
                + escape(", ".join(f"{k} {_ms(v)} ms" for k, v in cats.items()))
                + "</p>"
            )
        out.append(Section(id=f"{prefix}-ops", title="Top CPU ops (self time)", body=body))
    if result.get("top_kernels"):
        ks = result["top_kernels"][:20]
        body = _kernel_table(ks)
        out.append(Section(id=f"{prefix}-kernels", title="Top GPU kernels", body=body))
    if result.get("memory"):
        out.append(Section(id=f"{prefix}-memory", title="Memory timeline", body=_memory(result["memory"])))
    if result.get("stragglers"):
        out.append(
            Section(
                id=f"{prefix}-ranks", title="Ranks: stragglers and overlap", body=_stragglers(result, ranks)
            )
        )
    if result.get("errors"):
        body = "".join(f'<p class="sev-error">{escape(e["message"])}</p>' for e in result["errors"])
        out.append(Section(id=f"{prefix}-errors", title="Unreadable trace data", body=body))
    return out


def _kernel_table(ks: list[dict[str, Any]]) -> str:
    """Kernels by total time, each name shortened (templates and arguments elided) with the full
    signature in the cell's hover title: one row per kernel, not 35 lines of template arguments."""
    head = "".join(
        f'<th class="{"num" if num else ""}">{h}</th>'
        for h, num in (
            ("kernel", False),
            ("category", False),
            ("count", True),
            ("total ms", True),
            ("mean µs", True),
        )
    )
    rows = "".join(
        f'<tr><td title="{escape(k["name"])}"><code>{escape(short_kernel_name(k["name"]))}</code></td>'
        f'<td>{escape(str(k["category"]))}</td><td class="num">{escape(str(k["count"]))}</td>'
        f'<td class="num">{escape(_ms(k["total_us"]))}</td><td class="num">{k.get("mean_us", 0):.1f}</td></tr>'
        for k in ks
    )
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        '<p class="muted">Kernel names shortened: template arguments as &lt;…&gt;, argument lists left out; '
        "hover a name for its full signature.</p>"
    )


def _overview(result: dict[str, Any]) -> str:
    ranks = result.get("ranks", [])
    rows = []
    for r in ranks:
        steps = r.get("steps") or []
        mean = sum(s["dur_us"] for s in steps) / len(steps) if steps else None
        g = r.get("gpu") or {}
        rows.append(
            [
                r["rank"],
                r["device"],
                r["events"],
                len(steps),
                _ms(mean),
                f"{100 - g['idle_pct']:.1f}%" if g else "–",
                "yes" if r["complete"] else "TRUNCATED/CORRUPT",
                r["path"],
            ]
        )
    return table(
        ["rank", "device", "events", "steps", "mean step ms", "GPU busy", "complete", "file"],
        rows,
        [True, False, True, True, True, True, False, False],
    )


def _steps(ranks: list[dict[str, Any]]) -> str:
    parts = []
    for r in ranks:
        steps = r.get("steps") or []
        if not steps:
            continue
        label = f"rank {r['rank']}"
        if "compute_us" in steps[0]:
            series = {name: [s[key] / 1e3 for s in steps] for name, key in _STEP_SERIES}
            parts.append(f"<h3>{escape(label)}</h3>")
            parts.append(
                stacked_bars(
                    f"steps-rank{r['rank']}",
                    [str(s["number"]) for s in steps],
                    series,
                    unit="ms",
                    x_title="profiler step",
                    y_title="GPU time per step (ms)",
                )
            )
            parts.append(
                table(
                    [
                        "step",
                        "ms",
                        "GPU busy",
                        "compute",
                        "comm",
                        "memcpy",
                        "memset",
                        "idle",
                        "host wait",
                        "kernel wait",
                        "other wait",
                    ],
                    [
                        [
                            s["name"],
                            _ms(s["dur_us"]),
                            f"{s['gpu_busy_pct']:.1f}%",
                            _ms(s["compute_us"]),
                            _ms(s["communication_us"]),
                            _ms(s["memcpy_us"]),
                            _ms(s["memset_us"]),
                            _ms(s["gpu_idle_us"]),
                            _ms(s["host_wait_us"]),
                            _ms(s["kernel_wait_us"]),
                            _ms(s["other_wait_us"]),
                        ]
                        for s in steps
                    ],
                    [False] + [True] * 10,
                )
            )
        else:
            parts.append(f"<h3>{escape(label)} (CPU only)</h3>")
            parts.append(
                table(
                    ["step", "ms", "CPU busy ms", "top categories (self ms)"],
                    [
                        [
                            s["name"],
                            _ms(s["dur_us"]),
                            _ms(s["cpu_busy_us"]),
                            ", ".join(f"{k} {_ms(v)}" for k, v in list(s["cpu_categories"].items())[:4]),
                        ]
                        for s in steps
                    ],
                    [False, True, True, False],
                )
            )
    return "".join(parts)


def _gpu(ranks: list[dict[str, Any]]) -> str:
    rows = []
    for r in ranks:
        g = r.get("gpu")
        if not g:
            continue
        ov = g.get("comm_comp_overlap_pct")
        rows.append(
            [
                r["rank"],
                _ms(g["kernel_time_us"]),
                f"{g['compute_pct']:.1f}%",
                f"{g['non_compute_pct']:.1f}%",
                f"{g['idle_pct']:.1f}%",
                "–" if ov is None else f"{ov:.1f}%",
                g["window"],
            ]
        )
    if not rows:
        return ""
    body = table(
        ["rank", "GPU span ms", "compute", "non-compute", "idle", "comm/compute overlap", "window"],
        rows,
        [True, True, True, True, True, True, False],
    )
    for r in ranks:
        lch = r.get("launch")
        if lch and "launch_delay_p50_us" in lch:
            body += (
                f"<p>rank {r['rank']}: {lch['kernels']} kernels, {lch['short_kernel_pct']:.1f}% shorter than 10 µs; "
                f"launch-to-start delay p50 {lch['launch_delay_p50_us']:.1f} µs, p95 {lch['launch_delay_p95_us']:.1f} µs</p>"
            )
    return body


def _memory(m: dict[str, Any]) -> str:
    body = (
        f'<div class="kpis"><div class="kpi"><b>{escape(_mib(m["peak_bytes"]))}</b>peak allocated ({escape(m["device"])})</div>'
        f'<div class="kpi"><b>{escape(str(m.get("peak_op") or "–"))}</b>op at the peak</div>'
        + (
            f'<div class="kpi"><b>{m["peak_ms_from_start"]:,.1f} ms</b>after the trace starts</div>'
            if m.get("peak_ms_from_start") is not None
            else ""
        )
        + "</div>"
    )
    tl = m.get("timeline") or []
    if tl:
        t0 = tl[0][0]
        body += lines(
            "memory-timeline",
            [(p[0] - t0) / 1e3 for p in tl],
            {"allocated": [p[1] / 2**20 for p in tl]},
            unit="MiB",
            x_title="time since the first allocator event (ms)",
            y_title="allocated (MiB)",
        )
    return body


def _stragglers(result: dict[str, Any], ranks: list[dict[str, Any]]) -> str:
    s = result["stragglers"]
    rks = sorted(s["mean_step_us"])
    comm = s.get("mean_communication_us") or {}
    ov = {r["rank"]: (r.get("gpu") or {}).get("comm_comp_overlap_pct") for r in ranks}
    body = table(
        ["rank", "mean step ms", "mean collective ms", "comm/compute overlap"],
        [
            [r, _ms(s["mean_step_us"][r]), _ms(comm.get(r)), "–" if ov.get(r) is None else f"{ov[r]:.1f}%"]
            for r in rks
        ],
        [True, True, True, True],
    )
    verdict = s.get(
        "verdict"
    )  # the one rule, trace.ranks.straggler_verdict; traces analysed before it have none
    if s.get("likely_straggler") is not None:
        body += f'<p class="sev-warning">Likely straggler: {escape(s["reason"])}.</p>'
    elif verdict:
        body += f"<p>Straggler: {escape(verdict['sentence'])}.</p>"
    body += table(
        ["step", "slowest rank", "spread"],
        [[row["step"], row["slowest_rank"], f"{row['spread_pct']:.1f}%"] for row in s["steps"]],
        [False, True, True],
    )
    return body


def build_diff_section(diff: dict[str, Any]) -> Section:
    """The ``--diff`` comparison as one section (ops and kernels: changed, added, removed)."""
    parts = []
    for kind in ("ops", "kernels"):
        d = diff.get(kind) or {}
        rows = [
            [
                r["name"],
                r["count_a"],
                r["count_b"],
                _ms(r["time_a_us"]),
                _ms(r["time_b_us"]),
                _ms(r["delta_us"]),
                r["status"],
            ]
            for r in d.get("rows", [])[:30]
        ]
        if rows:
            parts.append(f"<h3>{escape(kind)}</h3>")
            parts.append(
                table(
                    ["name", "count A", "count B", "A ms", "B ms", "Δ ms", "status"],
                    rows,
                    [False, True, True, True, True, True, False],
                )
            )
    body = (
        f"<p>A: {escape(', '.join(diff.get('a', [])))}<br>B: {escape(', '.join(diff.get('b', [])))}</p>"
        + "".join(parts)
    )
    return Section(id="trace-diff", title="Diff (B − A)", body=body)
