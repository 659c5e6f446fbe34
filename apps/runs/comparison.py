"""Read-side of the compare page and the metric downloads: the config keys in which runs differ,
each run's summary (steps, wall time, tokens, final and best of its key metrics: from its
MetricSummary rows, summaries.py), and a run's metric points as rows for CSV or JSON."""

import json
from dataclasses import dataclass, field

from django.db.models import F, FloatField, JSONField, Max, Min, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from apps.core.numbers import ids_sent

from . import queries
from .config_keys import shown
from .models import MetricPoint, MetricSummary, Run
from .run_columns import leaves, metric_direction, metric_number

# A JSON number as Postgres and SQLite write it out: what may be cast to a float.
NUMBER = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"
# A spreadsheet runs a cell that starts with one of these as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# The summary's metrics: the run page's figures (queries.key_figures), and the loss beside the reward.
SUMMARY_METRICS = (
    ("Held-out", queries.HELD_OUT),
    ("Train reward", [candidate for candidate in queries.TRAIN_REWARD if candidate[0] != "trainer/loss"]),
    ("Train loss", [("trainer/loss", "Train loss")]),
    ("Throughput", queries.THROUGHPUT),
)


# ---- config diff -------------------------------------------------------------------------------


def flatten_config(value, prefix: str = "") -> dict:
    """{"a": {"b": 1}, "p": [{"x": 1}]} -> {"a.b": 1, "p[0].x": 1}. A list of plain values, an
    empty mapping or list, is one value."""
    if isinstance(value, dict) and value:
        out = {}
        for key, inner in value.items():
            out.update(flatten_config(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(inner, (dict, list)) for inner in value):
        out = {}
        for index, inner in enumerate(value):
            out.update(flatten_config(inner, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def config_diff(runs: list[Run]) -> list[tuple[str, list[str | None]]]:
    """(dotted key, the value of each run or None where it lacks the key) for the keys whose values
    differ between the runs, in key order. 1 and true, or 1 and "1", differ."""
    flat = [flatten_config(run.config) for run in runs]
    keys = sorted(set().union(*flat)) if flat else []
    diff = []
    for key in keys:
        values = [shown(config[key]) if key in config else None for config in flat]
        exact = {json.dumps(config.get(key, MISSING), sort_keys=True, default=str) for config in flat}
        if len(exact) > 1:
            diff.append((key, values))
    return diff


MISSING = "\0missing"  # no config value holds a NUL (the readers refuse it)


# ---- summary -----------------------------------------------------------------------------------


@dataclass
class MetricFigures:
    """What the summary shows of one metric of a run: its final value and its best, with their steps."""

    label: str  # the candidate's label ("Held-out accuracy")
    chart: str  # where it is from: "role/key"
    direction: str  # "max" or "min"
    final: float
    final_step: int
    best: float
    best_step: int


@dataclass
class RunSummary:
    run: Run
    progress: queries.Progress
    wall_seconds: float | None
    tokens_trained: float | None  # prompt + response tokens of the trainer's batches
    tokens_generated: float | None  # response tokens the explorer and evals generated
    metrics: dict[str, MetricFigures] = field(default_factory=dict)  # by SUMMARY_METRICS title


def run_summaries(runs: list[Run]) -> list[RunSummary]:
    """Each run's summary, in as many queries however many runs: a query per role for the keys of
    the token counts, one for each token count and for the wall time of runs never started, one
    for the metrics' figures and one per chart they show. Read a run at a time it was 17 queries
    a run (a sweep page of 6 runs: 106 queries, 1.6 s)."""
    keys = chart_keys(runs)
    walls = _wall_seconds(runs)
    trained = _sums_of_products(runs, keys, "trainer", *TRAINED)
    generated = [_sums_of_products(runs, keys, role, *GENERATED) for role in GENERATED_ROLES]
    metrics = metric_figures(runs)
    summaries = []
    for run in runs:
        counts = [sums[run.pk] for sums in generated if run.pk in sums]
        summary = RunSummary(run, queries.run_progress(run), walls.get(run.pk), trained.get(run.pk),
                             sum(counts) if counts else None)
        summary.metrics = {title: found[run.pk] for title, found in metrics.items() if run.pk in found}
        summaries.append(summary)
    return summaries


def chart_keys(runs: list[Run]) -> dict[int, dict[str, list[str]]]:
    """{run id: {"role/key": JSON path}} of the metrics in the first and last point of each role: the
    keys a run reports rarely change, and reading two points a role is cheap however long the run."""
    keys = {run.pk: {} for run in runs}
    for role in MetricPoint.Role.values:
        points = MetricPoint.objects.filter(run=OuterRef("pk"), role=role)
        ends = Run.objects.filter(pk__in=keys).annotate(
            first=Subquery(points.order_by("step").values("values")[:1], output_field=JSONField()),
            last=Subquery(points.order_by("-step").values("values")[:1], output_field=JSONField()),
        ).values_list("pk", "first", "last")
        for pk, *values in ends:
            for point in values:
                for key, path in _paths(point or {}):
                    keys[pk].setdefault(f"{role}/{key}", path)
    return keys


def _paths(values: dict):
    """("a/b", ["a", "b"]) for each number in nested values; a flat "a/b" key is ["a/b"]."""
    for path, value in leaves(values):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield "/".join(path), path


def _number_at(points, path: list[str], name: str = "v"):
    """The points with `name`, the number at path (points where it is none left out)."""
    lookup = "values__" + "__".join(path)
    return points.filter(**{f"{lookup}__regex": NUMBER}).annotate(**{name: Cast(KT(lookup), FloatField())})


def _by_chart(runs: list[Run], keys: dict, charts) -> dict[tuple, list[int]]:
    """{(chart, its JSON path as a tuple): run ids} for each run that reports all of `charts`."""
    groups = {}
    for run in runs:
        paths = [keys[run.pk].get(chart) for chart in charts]
        if all(paths):
            groups.setdefault(tuple(tuple(path) for path in paths), []).append(run.pk)
    return groups


def metric_figures(runs: list[Run]) -> dict[str, dict[int, MetricFigures]]:
    """{SUMMARY_METRICS title: {run id: the figures of the first of its candidate charts the run
    records}}, from the runs' summaries (summaries.py: the final is the latest, the best the lowest
    or the highest): a query for the summaries of every candidate, then one per chart shown for the
    step of its best, the one figure a summary does not keep. Read from the points, the best sorted
    every point of the chart's role: 8 runs × 2,000 steps took 360 ms on Postgres, 1,510 on SQLite,
    where this takes 100 and 212 (bench/compare_page.py, docs/runs-list.md)."""
    candidates = {chart for _, charts in SUMMARY_METRICS for chart, _ in charts}
    wanted = Q()
    for chart in candidates:
        role, key = chart.split("/", 1)
        wanted |= Q(role=role, key=key)
    recorded = {(run, f"{role}/{key}") for run, role, key in MetricSummary.objects.filter(
        wanted, run__in=[run.pk for run in runs]).values_list("run", "role", "key")}
    picked = {}  # (title, chart, label) -> run ids
    for title, charts in SUMMARY_METRICS:
        for run in runs:
            found = next(((chart, label) for chart, label in charts if (run.pk, chart) in recorded), None)
            if found:
                picked.setdefault((title, *found), []).append(run.pk)
    figures = {title: {} for title, _ in SUMMARY_METRICS}
    for (title, chart, label), ids in picked.items():
        figures[title].update(_figures(chart, label, ids))
    return {title: found for title, found in figures.items() if found}


def _figures(chart: str, label: str, ids: list[int]) -> dict[int, MetricFigures]:
    """The figures of one chart for these runs, which all record it: their summaries, and the first
    step whose point holds the best (the first from the run's start that reaches it: an index scan
    of the run's points of the role in step order that stops there)."""
    role, key = chart.split("/", 1)
    direction = metric_direction(chart)
    reaches = "lte" if direction == "min" else "gte"  # equal to the best, which no point passes
    first_best = MetricPoint.objects.filter(run=OuterRef("run"), role=role).alias(value=metric_number(key)).filter(
        **{f"value__{reaches}": OuterRef(direction)}).order_by("step").values("step")[:1]
    rows = MetricSummary.objects.filter(run__in=ids, role=role, key=key).annotate(best_step=Subquery(first_best))
    return {run: MetricFigures(label, chart, direction, final, final_step, best, best_step)
            for run, final, final_step, best, best_step in rows.values_list(
                "run", "latest", "latest_step", direction, "best_step")}


# Tokens: what the trainer trained on, prompt and response (its tokens_per_s is those tokens over
# its step's `seconds`, so their product is the count), and what was generated, responses only
# (the mean response_length over the step's rollouts × rollouts). The explorer's tokens_per_s is
# over generation time alone, not its step's `seconds` (which adds the pipeline and the buffer
# write): rate × seconds said 41,183 tokens of a run that generated 24,014.
TRAINED = ("tokens_per_s", "seconds")
GENERATED = ("response_length", "rollouts")
GENERATED_ROLES = ("explorer", "eval")


def _sums_of_products(runs: list[Run], keys: dict, role: str, a: str, b: str) -> dict[int, float]:
    """{run id: Σ a × b over the role's points} for the runs that report both keys, a query per
    layout of the keys (nested or flat)."""
    sums = {}
    for (path_a, path_b), ids in _by_chart(runs, keys, (f"{role}/{a}", f"{role}/{b}")).items():
        points = _number_at(MetricPoint.objects.filter(run__in=ids, role=role), list(path_a), "a")
        points = _number_at(points, list(path_b), "b")
        sums.update(points.values("run").annotate(total=Sum(F("a") * F("b"))).values_list("run", "total"))
    return sums


def _wall_seconds(runs: list[Run]) -> dict[int, float]:
    """From its start to its end (now, while it is unfinished); a run never marked started: from
    its first metric point to its last."""
    walls = {run.pk: ((run.finished_at or timezone.now()) - run.started_at).total_seconds()
             for run in runs if run.started_at}
    spans = MetricPoint.objects.filter(run__in=[run.pk for run in runs if not run.started_at]).exclude(
        role=MetricPoint.Role.SYSTEM).values("run").annotate(first=Min("time"), last=Max("time"))
    walls.update((span["run"], (span["last"] - span["first"]).total_seconds()) for span in spans)
    return walls


def summary_rows(summaries: list[RunSummary]) -> list[dict]:
    """The summary as the compare page's table, a column per run: [{label, cells: [{text, title}]}]."""
    rows = [
        {"label": "Status", "cells": [{"text": s.run.status, "status": True} for s in summaries]},
        {"label": "Steps", "cells": [{"text": f"{s.progress.done} / {s.progress.total or '?'}"} for s in summaries]},
        {"label": "Wall time", "cells": [{"text": duration(s.wall_seconds)} for s in summaries]},
    ]
    for label, counts, how in (
        ("Tokens trained (prompt + response)", [s.tokens_trained for s in summaries],
         "the trainer's batches, prompt and response tokens: its tokens per second × seconds, summed over its steps"),
        ("Tokens generated (responses)", [s.tokens_generated for s in summaries],
         "the response tokens of every rollout and eval answer: mean response length × rollouts, summed over the "
         "steps"),
    ):
        if any(count is not None for count in counts):
            rows.append({"label": label, "cells": [
                {"text": None if count is None else f"{count:,.0f}", "title": how} for count in counts
            ]})
    for title, _ in SUMMARY_METRICS:
        metrics = [s.metrics.get(title) for s in summaries]
        if not any(metrics):
            continue
        direction = next(m.direction for m in metrics if m)
        rows.append({"label": f"{title}, final", "cells": [
            {"text": short_number(m.final), "title": f"{m.label}: {m.chart} at step {m.final_step}"} if m else {}
            for m in metrics
        ]})
        rows.append({"label": f"{title}, best ({'lowest' if direction == 'min' else 'highest'})", "cells": [
            {"text": short_number(m.best), "title": f"{m.label}: {m.chart} at step {m.best_step}"} if m else {}
            for m in metrics
        ]})
    return rows


def short_number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def duration(seconds: float | None) -> str | None:
    """3 h 05 min · 4 min 10 s · 12 s"""
    if seconds is None:
        return None
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


# ---- metric rows, for the downloads --------------------------------------------------------------


def metric_points(run: Run):
    """(role, step, time, values) of every point of the run, by role and step, read in batches (a
    run can have a million points)."""
    return run.metrics.order_by("role", "step").values_list("role", "step", "time", "values").iterator(
        chunk_size=2000
    )


def flat_values(values: dict):
    """("key", value) of each value of a point, nested mappings joined with "/" as the charts
    name them."""
    for path, value in leaves(values):
        yield "/".join(path), value


def safe_cell(value):
    """Text a spreadsheet would run as a formula, quoted to stay text (a run named "=HYPERLINK(…)")."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def runs_in_order(ids: list[int]) -> list[Run]:
    """The runs of the ids given (?runs=1&runs=2), in that order, repeats and unknown ids dropped."""
    found = Run.objects.select_related("owner").in_bulk(ids)
    return [found[pk] for pk in dict.fromkeys(ids) if pk in found]


def picked_ids(query) -> tuple[list[int], list[str]]:
    """The ids of ?runs=1&runs=2, and a problem naming each value that is no id (numbers.ids_sent)."""
    return ids_sent(query.getlist("runs"), "runs")

