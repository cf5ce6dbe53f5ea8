"""``scalpel memory SNAPSHOT.pickle``'s terminal text: the explanation of a CUDA allocator snapshot
(:mod:`torchscalpel.memory.snapshot` reads it), in the words and fixes of the memory post-mortem."""

from __future__ import annotations

from typing import Any

from torchscalpel.units import fmt_bytes

PHASE_WORDS = {
    "parameters": "parameters and buffers",
    "gradients": "in backward (gradients)",
    "optimizer_state": "in optimizer.step (optimizer state)",
    "activations": "in forward (activations)",
    "other": "other",
}
PHASE_FIX = {  # the rungs of the post-mortem's ladder that act on each phase (docs/memory.md)
    "activations": "activation checkpointing of the repeated blocks or micro-batches with accumulation cut what "
    "forward keeps; 'scalpel memory --memory-limit SIZE -- SCRIPT' prices both for the script",
    "optimizer_state": "a lighter optimizer state (SGD with momentum, Adafactor, 8-bit Adam) or sharding it "
    "(FSDP, ZeRO) cuts what optimizer.step keeps",
    "gradients": "optimizer.zero_grad(set_to_none=True) frees the last step's gradients before the next forward; "
    "sharding them (FSDP, ZeRO-2) cuts them per rank",
    "parameters": "bf16 weights halve the parameters; sharding (FSDP) divides them by the ranks",
}


def render(r: dict[str, Any]) -> list[str]:
    """Terminal lines for :func:`explain_snapshot`'s result."""
    lines = [
        f"snapshot {r['path']}: {r['segments']} segments, {r['blocks']} live blocks",
        f"  reserved {fmt_bytes(r['reserved'])}, allocated {fmt_bytes(r['allocated'])}, free inside reserved "
        f"{fmt_bytes(r['reserved_free'])} ({r['fragmentation_share']:.0%}), largest free block "
        f"{fmt_bytes(r['largest_free'])}",
    ]
    trace = r.get("trace") or {}
    if trace.get("events"):
        lines.append(
            f"  trace: {trace['events']} allocator events, live bytes peaked {fmt_bytes(trace['peak_live'])} "
            f"above the trace's start (event {trace['peak_at_event']})"
        )
    for o in r["ooms"]:
        lines.append(f"  out of memory: asked for {fmt_bytes(o['bytes'])} at {o['site']}")
    phases = {k: v for k, v in (r.get("phases") or {}).items() if v}
    if set(phases) - {"other"} and r["allocated"]:  # all "other": no torch frame said anything
        shares = sorted(phases.items(), key=lambda kv: kv[1], reverse=True)
        lines.append(
            "allocated by phase (from each block's frames): "
            + ", ".join(f"{PHASE_WORDS[k]} {fmt_bytes(v)} ({v / r['allocated']:.0%})" for k, v in shares)
        )
        top, top_bytes = shares[0]
        if top in PHASE_FIX and top_bytes >= 0.3 * r["allocated"]:
            lines.append(f"fix: {PHASE_FIX[top]}")
    if r["sites"]:
        lines.append("allocated by call site:")
        lines += [f"  {s['name']:<60} {fmt_bytes(s['bytes']):>11}" for s in r["sites"][:8]]
    if r["expandable_segments_advised"]:
        lines.append(
            "fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (more than 20% of reserved memory is "
            "free but fragmented)"
        )
    if r.get("reader") == "python":
        lines.append(
            f"(read whole by the pure-Python reader: {r.get('reader_note') or 'native reader unavailable'})"
        )
    elif r.get("reader") == "native":
        lines.append("(read by the native streaming reader)")
    return lines
