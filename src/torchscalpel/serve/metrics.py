"""Prometheus text exposition (format 0.0.4) for the server, without a client library.

Counters: requests by endpoint and status code, batches, rows, timeouts. Histograms: request
latency, inference latency, batch size. Gauge: queue depth.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from torchscalpel.serve.batcher import BatchStats

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Histogram:
    """Cumulative-bucket histogram."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """Exposition lines (``_bucket``, ``_sum``, ``_count``)."""
        out, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        lab = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{lab} {self.total:.6f}", f"{name}_count{lab} {self.n}"]
        return out


class Metrics:
    """All server metrics; the app records requests, the batcher's stats are drained at scrape time."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.request_latency = Histogram(LATENCY_BUCKETS)
        self.inference_latency = Histogram(LATENCY_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.refused: Counter[str] = Counter()
        """Requests or connections refused below the endpoints (bad framing, hung-up clients, limits), by reason."""

    def record_refused(self, reason: str) -> None:
        """Count one request or connection refused or closed before (or instead of) an endpoint's answer."""
        self.refused[reason] += 1

    def record_request(self, path: str, status: int, seconds: float) -> None:
        """Count one answered request (predict latency goes into the histogram)."""
        self.requests[(path, status)] += 1
        if path == "/v1/predict":
            self.request_latency.observe(seconds)

    def record_batch(self, rows: int, seconds: float) -> None:
        """One batched model call (the batcher's ``on_batch`` callback)."""
        self.batch_size.observe(rows)
        self.inference_latency.observe(seconds)

    def render(self, stats: BatchStats, queue_depth: int) -> str:
        """The whole exposition text."""
        lines = [
            "# HELP scalpel_requests_total Requests answered, by path and HTTP status.",
            "# TYPE scalpel_requests_total counter",
        ]
        for (path, status), n in sorted(self.requests.items()):
            lines.append(f'scalpel_requests_total{{path="{path}",code="{status}"}} {n}')
        lines += [
            "# HELP scalpel_request_duration_seconds Time from request start to answer for /v1/predict.",
            "# TYPE scalpel_request_duration_seconds histogram",
            *self.request_latency.lines("scalpel_request_duration_seconds"),
            "# HELP scalpel_inference_duration_seconds Time of one batched model call.",
            "# TYPE scalpel_inference_duration_seconds histogram",
            *self.inference_latency.lines("scalpel_inference_duration_seconds"),
            "# HELP scalpel_batch_rows Rows per batched model call.",
            "# TYPE scalpel_batch_rows histogram",
            *self.batch_size.lines("scalpel_batch_rows"),
            "# HELP scalpel_batches_total Batched model calls.",
            "# TYPE scalpel_batches_total counter",
            f"scalpel_batches_total {stats.batches}",
            "# HELP scalpel_rows_total Rows (samples) run through the model.",
            "# TYPE scalpel_rows_total counter",
            f"scalpel_rows_total {stats.rows}",
            "# HELP scalpel_timeouts_total Requests answered 504.",
            "# TYPE scalpel_timeouts_total counter",
            f"scalpel_timeouts_total {stats.dropped_timeouts}",
            "# HELP scalpel_refused_total Requests and connections refused or closed early, by reason.",
            "# TYPE scalpel_refused_total counter",
            *(f'scalpel_refused_total{{reason="{r}"}} {n}' for r, n in sorted(self.refused.items())),
            "# HELP scalpel_queue_depth Requests waiting for a batch.",
            "# TYPE scalpel_queue_depth gauge",
            f"scalpel_queue_depth {queue_depth}",
        ]
        return "\n".join(lines) + "\n"
