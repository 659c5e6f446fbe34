"""How a run's rollouts spread at each explorer step, not only their means (W&B's histograms over
time): the reward and the response length of every rollout, as quantile bands over the steps.

Read from the buffer, binned in the database: one aggregate for the steps' span and each figure's
range, then one GROUP BY (step column, bin) a figure over the run's rollouts, so a long run costs
what its rows cost to scan a few times, never its rows in Python. Quantiles come from the bins'
counts, interpolated within a bin (1/BINS of the range: finer than a chart draws). Long runs group
neighbouring steps into at most MAX_COLUMNS columns. 1,000 steps of 128 rollouts (128,000 rows,
bench/distributions.py) took 0.57 s on Postgres and 0.85 s on SQLite (this 2-core machine) in 5
queries; in 3, the ranges read with the span, 0.49 s against 0.62 and 0.97 against 1.17 (medians
of 11, the two alternated, the machine loaded 7 to 9). The panel reads them when it is opened,
and every 15 s while it is open on a training run. A run whose buffer was archived or dropped has
no rollouts left to read: the panel says so.
"""
import math

from django.db.models import Count, F, FloatField, Max, Min, Value
from django.db.models.functions import Cast, Floor, Length

from apps.buffer.models import Experience

BINS = 64
MAX_COLUMNS = 150
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
FIGURES = {  # what each band chart reads of a rollout
    "reward": F("reward"),
    "response tokens": Cast(Length("response_ids") / 4, FloatField()),  # int32 ids: 4 bytes a token
}


def run_distributions(run) -> dict:
    """{"steps": [first step of each column], "step_width", "rollouts", "figures": {name:
    {"quantiles": [q...], "bands": {q: [value per column or None]}}}}."""
    rollouts = Experience.objects.filter(run=run, source="rollout")
    # The figures' ranges in the query that finds the steps (Min and Max skip a figure's NULLs).
    bounds = {}
    for i, value in enumerate(FIGURES.values()):
        bounds |= {f"low{i}": Min(value), f"high{i}": Max(value)}
    span = rollouts.aggregate(first=Min("explorer_step"), last=Max("explorer_step"), n=Count("pk"), **bounds)
    if not span["n"]:
        return {"steps": [], "step_width": 1, "rollouts": 0, "figures": {}}
    first, last = span["first"], span["last"]
    width = math.ceil((last - first + 1) / MAX_COLUMNS)
    columns = (last - first) // width + 1
    figures = {}
    for i, (name, value) in enumerate(FIGURES.items()):
        low, high = span[f"low{i}"], span[f"high{i}"]
        if low is None:
            continue
        rows = rollouts.annotate(value=value).exclude(value=None)
        bin_width = (high - low) / BINS  # 0: every rollout scored alike, one bin
        at = Floor((F("value") - low) / bin_width) if bin_width else Value(0)
        counts = [[0] * BINS for _ in range(columns)]
        binned = rows.annotate(column=(F("explorer_step") - first) / width, bin=at).values("column", "bin")
        for column, index, n in binned.annotate(n=Count("pk")).values_list("column", "bin", "n"):
            counts[int(column)][min(int(index), BINS - 1)] += n
        figures[name] = {
            "quantiles": list(QUANTILES),
            "bands": {str(q): [_quantile(hist, q, low, bin_width) for hist in counts] for q in QUANTILES},
        }
    return {"steps": [first + c * width for c in range(columns)], "step_width": width, "rollouts": span["n"],
            "figures": figures}


def _quantile(hist: list[int], q: float, low: float, bin_width: float) -> float | None:
    """The q-quantile of a column's histogram, interpolated within its bin; None for no rows."""
    total = sum(hist)
    if not total:
        return None
    if not bin_width:
        return low
    wanted, seen = q * total, 0
    for index, n in enumerate(hist):
        if n and seen + n >= wanted:
            return low + (index + (wanted - seen) / n) * bin_width
        seen += n
    return low + BINS * bin_width
