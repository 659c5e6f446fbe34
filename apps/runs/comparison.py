"""Read-side of the compare page and the metric downloads: the config keys in which runs differ,
each run's summary (steps, wall time, tokens, final and best of its key metrics), and a run's
metric points as rows for CSV or JSON."""

import json
import re
from dataclasses import dataclass, field

from django.db.models import F, FloatField, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from apps.core.numbers import whole_numbers

from . import queries
from .config_keys import shown
from .models import MetricPoint, Run

# A JSON number as Postgres and SQLite write it out: what may be cast to a float.
NUMBER = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"
# Lower is better for these; higher for everything else the summary shows (rewards, accuracy,
# throughput).
LOWER_IS_BETTER = re.compile(r"(^|[/_])(loss|kl|perplexity|error|seconds|staleness)($|[/_])")
# The summary's metrics: the run page's figures (queries.key_figures), and the loss beside the reward.
SUMMARY_METRICS = (
    ("Held-out", queries.HELD_OUT),
    ("Train reward", [candidate for candidate in queries.TRAIN_REWARD if candidate[0] != "trainer/loss"]),
    ("Train loss", [("trainer/loss", "Train loss")]),
    ("Throughput", queries.THROUGHPUT),
)
# Tokens a step processed: the trainer's (explorer's, for a run that only explores) rate × time.
TOKEN_ROLES = ("trainer", "explorer")


def metric_direction(chart: str) -> str:
    """"min" when a lower value of the metric ("role/key") is better, else "max"."""
    return "min" if LOWER_IS_BETTER.search(chart.split("/", 1)[-1]) else "max"


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
class MetricSummary:
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
    tokens: float | None
    metrics: dict[str, MetricSummary] = field(default_factory=dict)  # by SUMMARY_METRICS title


def _chart_keys(run: Run) -> dict[str, list[str]]:
    """{"role/key": JSON path} of the metrics in the first and last point of each role: the keys a
    run reports rarely change, and reading two points is cheap however long the run."""
    keys = {}
    for role in MetricPoint.Role.values:
        points = run.metrics.filter(role=role)
        for point in (points.order_by("step").first(), points.order_by("-step").first()):
            for key, path in _paths(point.values if point else {}):
                keys.setdefault(f"{role}/{key}", path)
    return keys


def _paths(values: dict):
    """("a/b", ["a", "b"]) for each number in nested values; a flat "a/b" key is ["a/b"]."""
    for path, value in _leaves(values):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield "/".join(path), path


def _leaves(values: dict, prefix=()):
    """(path as a list of keys, value) of each value of a point that is not a mapping."""
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield [*prefix, key], value


def _numbers(run: Run, role: str, path: list[str]):
    """The role's points with `v`, the number at path (points where it is none left out)."""
    lookup = "values__" + "__".join(path)
    return run.metrics.filter(role=role, **{f"{lookup}__regex": NUMBER}).annotate(v=Cast(KT(lookup), FloatField()))


def _metric_summary(run: Run, keys: dict, label_candidates) -> MetricSummary | None:
    found = next(((chart, label) for chart, label in label_candidates if chart in keys), None)
    if found is None:
        return None
    chart, label = found
    role = chart.split("/", 1)[0]
    points = _numbers(run, role, keys[chart]).values_list("v", "step")
    final = points.order_by("-step").first()
    if final is None:
        return None
    direction = metric_direction(chart)
    best = points.order_by("v" if direction == "min" else "-v", "step").first()
    return MetricSummary(label, chart, direction, final[0], final[1], best[0], best[1])


def _tokens(run: Run, keys: dict) -> float | None:
    for role in TOKEN_ROLES:
        rate, seconds = keys.get(f"{role}/tokens_per_s"), keys.get(f"{role}/seconds")
        if rate and seconds:
            lookup = "values__" + "__".join(seconds)
            steps = _numbers(run, role, rate).filter(**{f"{lookup}__regex": NUMBER})
            steps = steps.annotate(s=Cast(KT(lookup), FloatField()))
            return steps.aggregate(tokens=Sum(F("v") * F("s")))["tokens"] or 0.0
    return None


def _wall_seconds(run: Run) -> float | None:
    """From its start to its end (now, while it is unfinished); a run never marked started: from
    its first metric point to its last."""
    if run.started_at:
        return ((run.finished_at or timezone.now()) - run.started_at).total_seconds()
    times = run.metrics.exclude(role=MetricPoint.Role.SYSTEM).values_list("time", flat=True)
    first, last = times.order_by("time").first(), times.order_by("-time").first()
    return (last - first).total_seconds() if first else None


def run_summary(run: Run) -> RunSummary:
    keys = _chart_keys(run)
    summary = RunSummary(run, queries.run_progress(run), _wall_seconds(run), _tokens(run, keys))
    for title, candidates in SUMMARY_METRICS:
        metric = _metric_summary(run, keys, candidates)
        if metric:
            summary.metrics[title] = metric
    return summary


def summary_rows(summaries: list[RunSummary]) -> list[dict]:
    """The summary as the compare page's table, a column per run: [{label, cells: [{text, title}]}]."""
    rows = [
        {"label": "Status", "cells": [{"text": s.run.status, "status": True} for s in summaries]},
        {"label": "Steps", "cells": [{"text": f"{s.progress.done} / {s.progress.total or '?'}"} for s in summaries]},
        {"label": "Wall time", "cells": [{"text": duration(s.wall_seconds)} for s in summaries]},
    ]
    if any(s.tokens is not None for s in summaries):
        how = "tokens per second × seconds, summed over the steps"
        rows.append({"label": "Tokens", "cells": [
            {"text": None if s.tokens is None else f"{s.tokens:,.0f}", "title": how} for s in summaries
        ]})
    for title, _ in SUMMARY_METRICS:
        metrics = [s.metrics.get(title) for s in summaries]
        if not any(metrics):
            continue
        direction = next(m.direction for m in metrics if m)
        rows.append({"label": f"{title}, final", "cells": [
            {"text": _number(m.final), "title": f"{m.label}: {m.chart} at step {m.final_step}"} if m else {}
            for m in metrics
        ]})
        rows.append({"label": f"{title}, best ({'lowest' if direction == 'min' else 'highest'})", "cells": [
            {"text": _number(m.best), "title": f"{m.label}: {m.chart} at step {m.best_step}"} if m else {}
            for m in metrics
        ]})
    return rows


def _number(value: float) -> str:
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
    for path, value in _leaves(values):
        yield "/".join(path), value


def runs_in_order(ids: list[int]) -> list[Run]:
    """The runs of the ids given (?runs=1&runs=2), in that order, repeats and unknown ids dropped."""
    found = Run.objects.select_related("owner").in_bulk(ids)
    return [found[pk] for pk in dict.fromkeys(ids) if pk in found]


def picked_ids(query) -> list[int]:
    return whole_numbers(query.getlist("runs"))

