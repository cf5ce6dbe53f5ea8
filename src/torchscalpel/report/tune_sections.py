"""Report sections for ``scalpel tune``: the ranked variants, the recommendation, the loss curves.

Reads ``record.sections["tune"]`` (written by :mod:`torchscalpel.stages.tune`); draws nothing it
has to measure.
"""

from __future__ import annotations

from html import escape

from torchscalpel.record import RunRecord
from torchscalpel.report.charts import horizontal_bars, lines
from torchscalpel.report.page import Section, table
from torchscalpel.report.tune_terminal import HEADERS, NUMERIC, TABLE_NOTE, noise_line, row_cells
from torchscalpel.sections import TuneSection
from torchscalpel.tune.result import TuneResult, headline
from torchscalpel.tune.speedup import RANK_ORDER, speedup_of
from torchscalpel.tune.states import Verdict

CURVE_VERDICTS = (Verdict.WINNER, Verdict.FASTER, Verdict.NUMERICS)
"""Trials whose loss curves are drawn next to the baseline's."""


def build(record: RunRecord) -> list[Section]:
    """The tune sections, or nothing when the record holds no tune result."""
    tune = record.section(TuneSection)
    if tune is None or tune.baseline is None:  # no tune result (or a hand-made one without a baseline)
        return []
    result = TuneResult.from_section(tune)  # what the terminal renders too (tune_terminal.render)
    baseline, trials, rows = result.baseline, result.trials, result.ranked()
    winner = tune.winner
    line = headline(winner, tune.no_candidate)  # the terminal's, code.txt's and scalpel.toml's words
    if winner:
        measured = speedup_of(winner)  # the one definition (torchscalpel.tune.speedup)
        verdict = (
            f'<p class="kpis"><span class="kpi"><b>{measured.text()}</b>'
            f"faster per step ({escape(measured.spread_text())})</span>"
            f'<span class="kpi"><b>{escape(winner["label"])}</b>recommended</span></p>'
            f"<p>{escape(line)}</p>"
        )
        code = "\n".join(tune.code_lines or [])
        verdict += (
            "<p>Apply with <code>scalpel run --config scalpel.toml -- SCRIPT</code> (the scalpel.toml in "
            "this run's folder), or edit the script:</p>"
        )
        verdict += f"<pre>{escape(code)}</pre>"
    else:
        verdict = (
            f"<p><b>No change recommended</b>: {escape(line.removeprefix('no change recommended: '))}.</p>"
        )
    notes = "".join(f"<li>{escape(n)}</li>" for n in tune.notes if n != tune.no_candidate)
    bottleneck = (tune.facts or {}).get("bottleneck")
    if bottleneck:
        from torchscalpel.tune.bottleneck import Bottleneck

        verdict += (
            f"<p><b>Profile of the baseline</b>: {escape(Bottleneck.from_dict(bottleneck).summary())}. "
            "Knobs that address it were tried first; each row says why it was tried.</p>"
        )
    runs = len(tune.baseline_medians) if tune.baseline_medians else None
    verdict += (
        f'<p class="muted">Required speedup {result.required:.2f}x; {escape(noise_line(tune.noise, runs))}; '
        f"baseline loss determinism {(tune.determinism or 0):.1e}.</p>"
    )
    if notes:
        verdict += f"<ul>{notes}</ul>"
    ranked = table(HEADERS, [row_cells(t, full=True) for t in rows], numeric=NUMERIC)
    ranked += f'<p class="muted">Rows {RANK_ORDER}. {escape(TABLE_NOTE)}.</p>'
    # the chart draws what the table shows: the speedup of each row, from the same pair (a confirmed row's
    # confirmation pair, never its screening run beside a table of confirmed figures), in the table's order
    bars = horizontal_bars(
        "tune-speedup",
        [(t.label, r) for t in rows if (r := speedup_of(t).ratio) is not None],
        unit="x",
        x_title="speedup per step (the baseline is 1.00x)",
    )
    paybacks = [t.payback["sentence"] for t in trials if (t.payback or {}).get("sentence")]
    if paybacks:
        verdict += (
            "<p><b>Pays back</b> (per step and end to end apart):</p><ul>"
            + "".join(f"<li>{escape(p)}</li>" for p in paybacks)
            + "</ul>"
        )
    series: dict[str, list[float | None]] = {"baseline": list(baseline.losses)}
    for t in trials:
        if t.losses and t.verdict in CURVE_VERDICTS:
            series[t.label] = list(t.losses)
    n = max((len(v) for v in series.values()), default=0)
    curves = lines("tune-losses", list(range(n)), series, unit="loss")
    return [
        Section(id="tune", title="Tune: recommendation", body=verdict),
        Section(id="tune-variants", title="Tune: variants ranked", body=ranked + bars),
        Section(id="tune-losses", title="Tune: loss curves (same seed)", body=curves),
    ]
