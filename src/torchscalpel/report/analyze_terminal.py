"""``scalpel analyze``'s terminal summary of a trace analysis (and of a diff between two), as text."""

from __future__ import annotations

from typing import Any


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f}"


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def render(data: dict[str, Any], *, top: int = 15) -> str:
    """The terminal summary: per rank and step, GPU breakdown, top ops and kernels, memory, stragglers."""
    out: list[str] = []
    width = _width()  # None on a pipe: lines whole; a terminal's width: rows cut to fit, prose wrapped
    name_w = 60 if width is None else max(20, min(60, width - 46))  # the row before the name: 46 columns
    for r in data["ranks"]:
        state = (
            ""
            if r["complete"]
            else "  [INCOMPLETE: " + r["error"]["reason"] + f" at byte {r['error']['byte_offset']}]"
        )
        out.append(f"rank {r['rank']} · {r['device']} · {r['events']} events · {r['path']}{state}")
        if r.get("invalid_events"):
            out.append(
                f"  {r['invalid_events']} invalid event(s) left out: a time that is NaN, infinite, negative "
                "or beyond any profiler window"
            )
        steps = r.get("steps") or []
        if steps and "compute_us" in steps[0]:
            out += _gpu_steps(steps, width)
        elif steps:
            out.append(f"  {'step':<20}{'ms':>9}{'cpu busy':>10}  top categories (self ms)")
            for s in steps:
                head = f"  {_short(s['name'], 19):<20}{_ms(s['dur_us']):>9}{_ms(s['cpu_busy_us']):>10}  "
                shown = list(s["cpu_categories"].items())[:3]
                cats = ", ".join(f"{k} {_ms(v)}" for k, v in shown)
                while width is not None and len(shown) > 1 and len(head) + len(cats) > width:
                    shown = shown[:-1]  # fewer categories, never one cut at the edge
                    cats = ", ".join(f"{k} {_ms(v)}" for k, v in shown)
                out.append(head + cats)
        else:
            out.append("  no step annotations (ProfilerStep#N): figures cover the whole trace")
        g = r.get("gpu")
        if g:
            ov = g.get("comm_comp_overlap_pct")
            out.extend(
                _wrapped(
                    f"  GPU ({g['window']}): span {_ms(g['kernel_time_us'])} ms; compute {g['compute_pct']:.1f}%, "
                    f"non-compute {g['non_compute_pct']:.1f}%, idle {g['idle_pct']:.1f}%"
                    + ("" if ov is None else f"; comm/compute overlap {ov:.1f}%")
                )
            )
        lch = r.get("launch")
        if lch and "launch_delay_p50_us" in lch:
            out.extend(
                _wrapped(
                    f"  kernels: {lch['kernels']}, {lch['short_kernel_pct']:.1f}% < 10 µs; launch-to-start p50 "
                    f"{lch['launch_delay_p50_us']:.1f} µs, p95 {lch['launch_delay_p95_us']:.1f} µs"
                )
            )
    if data.get("top_ops"):
        out.append(f"\ntop CPU ops by self time{' (all ranks)' if len(data['ranks']) > 1 else ''}:")
        out.append(f"  {'self ms':>10}{'total ms':>10}{'calls':>8}  {'category':<13} name")
        for o in data["top_ops"][:top]:
            out.append(
                f"  {_ms(o['self_us']):>10}{_ms(o['total_us']):>10}{o['count']:>8}  {o['category']:<13} "
                f"{_short(o['name'], name_w)}"
            )
        categories = data.get("categories") or {}
        out.extend(
            _wrapped("  by category (self ms): " + ", ".join(f"{k} {_ms(v)}" for k, v in categories.items()))
        )
    if data.get("top_kernels"):
        out.append("\ntop GPU kernels by time:")
        out.append(f"  {'total ms':>10}{'count':>8}{'mean µs':>10}  {'category':<13} name")
        for k in data["top_kernels"][:top]:
            out.append(
                f"  {_ms(k['total_us']):>10}{k['count']:>8}{k['mean_us']:>10.1f}  {k['category']:<13} "
                f"{_short(k['name'], name_w)}"
            )
    m = data.get("memory")
    if m:
        when = (
            f"{m['peak_ms_from_start']:,.1f} ms after the trace starts"
            if m.get("peak_ms_from_start") is not None
            else f"trace time {m['peak_ts_us']:.0f} µs"
        )
        out.append("")
        out.extend(
            _wrapped(
                f"memory: peak {m['peak_bytes'] / 2**20:.1f} MiB allocated ({m['device']}) {when}, "
                f"under {m.get('peak_op') or 'no op'}"
            )
        )
    s = data.get("stragglers")
    if s:
        comm = s.get("mean_communication_us") or {}
        out.append(
            "\nranks: "
            + "; ".join(
                f"rank {r}: step {_ms(v)} ms" + (f", collectives {_ms(comm[r])} ms" if r in comm else "")
                for r, v in sorted(s["mean_step_us"].items())
            )
        )
        if s.get("likely_straggler") is not None:
            out.append(f"  likely straggler: {s['reason']}")
        elif s.get("verdict"):  # none, or not measured: said with its figures (trace.ranks.straggler_verdict)
            out.append(f"  straggler: {s['verdict']['sentence']}")
    first, *rest = verdict_lines(data, data.get("diff"))
    # the verdict last, where a terminal's reader looks once the tables have scrolled by; wrapped between
    # words at a terminal's (or COLUMNS') width, whole on a pipe
    said = [f"verdict: {first}", *(line for line in rest if not line.startswith(("straggler", "likely")))]
    out.append("")
    out.extend(piece for line in said for piece in _wrapped(line))
    return "\n".join(out)


GPU_STEP_WIDTH = 105
"""Columns of the GPU step table in one row; a narrower terminal gets the waits as a second table."""


def _gpu_steps(steps: list[dict[str, Any]], width: int | None) -> list[str]:
    """The per-step GPU breakdown: one table on a pipe or a wide terminal; on a narrower one the device's
    time (busy, compute, comm, copies, idle) and the waits (memset, host, kernel, other) as two tables of
    the same steps, so no figure is cut or wrapped (an 80-column terminal split the 105-column row)."""

    def name(s: dict[str, Any]) -> str:
        return f"  {_short(s['name'], 19):<20}{_ms(s['dur_us']):>9}"

    time_head = f"  {'step':<20}{'ms':>9}{'busy%':>7}{'compute':>9}{'comm':>9}{'memcpy':>8}"
    wait_head = f"{'memset':>8}{'idle':>9}{'host-w':>8}{'kern-w':>8}{'other-w':>8}"

    def time_cells(s: dict[str, Any]) -> str:
        return (
            f"{s['gpu_busy_pct']:>7.1f}{_ms(s['compute_us']):>9}{_ms(s['communication_us']):>9}"
            f"{_ms(s['memcpy_us']):>8}"
        )

    def wait_cells(s: dict[str, Any]) -> str:
        return (
            f"{_ms(s['memset_us']):>8}{_ms(s['gpu_idle_us']):>9}{_ms(s['host_wait_us']):>8}"
            f"{_ms(s['kernel_wait_us']):>8}{_ms(s['other_wait_us']):>8}"
        )

    if width is None or width >= GPU_STEP_WIDTH:
        return [time_head + wait_head, *(name(s) + time_cells(s) + wait_cells(s) for s in steps)]
    return [
        time_head,
        *(name(s) + time_cells(s) for s in steps),
        f"  {'step: idle, waits':<20}{'ms':>9}" + wait_head,
        *(name(s) + wait_cells(s) for s in steps),
    ]


def _width() -> int | None:
    """The console's width, None where it soft-wraps (a pipe without ``COLUMNS``: lines kept whole)."""
    from torchscalpel.console import make_console

    out = make_console()
    return None if out.soft_wrap else out.width


def _wrapped(line: str) -> list[str]:
    """``line`` cut to the console's width between words (never inside a figure and its unit), continuation
    lines indented by 2 more; whole where the console soft-wraps (a pipe without ``COLUMNS``)."""
    from torchscalpel.console import wrap_spans

    width = _width()
    if width is None:
        return [line]
    return [
        " " * indent + line[start:end].lstrip(" ") for start, end, indent in wrap_spans(line, width, hang=2)
    ]


def format_diff(diff: dict[str, Any], *, top: int = 15) -> str:
    """The ``--diff`` table: biggest changes first, then what was added and removed."""
    ms = diff["mean_step_us"]
    out = [f"\ndiff (B - A): A = {', '.join(diff['a'])}; B = {', '.join(diff['b'])}"]
    if ms["a"] is not None and ms["b"] is not None:
        out.append(f"  mean step: {_ms(ms['a'])} ms -> {_ms(ms['b'])} ms")
    for kind, label in (("ops", "CPU ops (self time)"), ("kernels", "GPU kernels")):
        d = diff[kind]
        if not d["rows"]:
            continue
        out.append(
            f"  {label}: {_ms(d['time_a_us'])} ms -> {_ms(d['time_b_us'])} ms; "
            f"{len(d['added'])} added, {len(d['removed'])} removed"
        )
        out.append(f"    {'A ms':>9}{'B ms':>9}{'Δ ms':>9}{'calls A':>8}{'calls B':>8}  {'status':<8} name")
        for r in [r for r in d["rows"] if r["status"] != "same"][:top]:
            out.append(
                f"    {_ms(r['time_a_us']):>9}{_ms(r['time_b_us']):>9}{_ms(r['delta_us']):>9}{r['count_a']:>8}"
                f"{r['count_b']:>8}  {r['status']:<8} {_short(r['name'])}"
            )
    return "\n".join(out)


def verdict_lines(data: dict[str, Any], diff: dict[str, Any] | None = None) -> list[str]:
    """What the traces say, first sentence first: where the time goes (the step, GPU busy or the top CPU
    op's share), a straggler, a trace read only in part, the diff's direction and size; then what to run
    next. The analyze page opens with these; the terminal prints them last."""
    ranks = data.get("ranks") or []
    steps = [
        s["dur_us"]
        for r in ranks
        for s in (r.get("steps") or [])
        if isinstance(s.get("dur_us"), (int, float))
    ]
    what = f"{len(ranks)} trace{'s' if len(ranks) != 1 else ''}"
    if steps:
        head = f"{what}, {len(steps)} profiled step(s): mean step {_ms(sum(steps) / len(steps))} ms"
    else:
        head = f"{what} without step annotations (ProfilerStep#N): the figures cover the whole trace"
    gpus = [r["gpu"] for r in ranks if r.get("gpu")]
    if gpus:
        idle = max(g["idle_pct"] for g in gpus)
        head += f"; the GPU is idle {idle:.1f}% of its span" + (
            " (the most idle rank)" if len(gpus) > 1 else ""
        )
    ops = data.get("top_ops") or []
    total = sum(float(v) for v in (data.get("categories") or {}).values())
    if ops and total > 0:
        top = ops[0]
        head += (
            f"; the top CPU op is {_short(str(top['name']), 40)} "
            f"({100 * float(top['self_us']) / total:.1f}% of CPU op self time)"
        )
    out = [head]
    s = data.get("stragglers")
    if s and s.get("likely_straggler") is not None:
        out.append(f"likely straggler: {s['reason']}")
    elif s and s.get("verdict"):
        out.append(f"straggler: {s['verdict']['sentence']}")
    for r in ranks:
        if not r.get("complete", True):
            error = r.get("error") or {}
            out.append(
                f"rank {r['rank']}'s trace is incomplete ({error.get('reason', 'unreadable')} at byte "
                f"{error.get('byte_offset', '?')}): its figures cover the events before it"
            )
    if diff is not None:
        ms = diff.get("mean_step_us") or {}
        a, b = ms.get("a"), ms.get("b")
        if a and b:
            ratio = b / a
            direction = f"{ratio:.2f}x slower" if ratio >= 1 else f"{1 / ratio:.2f}x faster"
            out.append(
                f"diff: B's mean step is {_ms(b)} ms against A's {_ms(a)} ms: B is {direction} per step"
            )
        rows = [row for kind in ("ops", "kernels") for row in (diff.get(kind) or {}).get("rows", [])]
        changed = [row for row in rows if row.get("status") != "same" and row.get("delta_us") is not None]
        if changed:
            big = max(changed, key=lambda row: abs(float(row["delta_us"])))
            out.append(
                f"the largest change: {_short(str(big['name']), 40)} ({big['status']}, "
                f"{'+' if big['delta_us'] >= 0 else ''}{_ms(big['delta_us'])} ms)"
            )
        out.append("next: scalpel compare RUN_A RUN_B (what else differs: code, config, environment, load)")
    else:
        out.append("next: scalpel analyze TRACE --diff OTHER (two traces compared, op by op)")
    return out
