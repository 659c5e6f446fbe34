"""Sweeps (W&B's sweeps, MLflow's parent runs): a base config and a search over named keys, launched
as one group of runs. A grid takes every combination of the listed values; a random search draws
`count` distinct combinations, a listed key by choice and a range `low .. high` uniformly (or
log-uniformly; whole numbers where the config types the key as one). Every run's config is
validated as a launch is before any run is made, so a sweep is launched whole or not at all; its
runs then queue through the same capacity rules as any run."""

import copy
import itertools
import json
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from django.db import transaction
from django.urls import reverse

from workers.rft.config import ConfigError, ConfigIssue, RunConfig
from workers.rft.config_issues import leaf_types, section_of

from . import comparison, queries, services
from .config_keys import reset_unread, set_key, shown
from .models import Run, Sweep

MAX_RUNS = 32  # what one sweep may ask of shared workers at once
MAX_KEYS = 8
MAX_VALUES = 32  # listed values per key
MAX_TEXT = 4000  # the launch form's sweep box, in characters
RANGE = re.compile(r"^\s*(\S+)\s*\.\.\s*(\S+)\s*(log|linear)?\s*$", re.IGNORECASE)
# A `..` after a digit, a space or the start and before one, a sign or the end: a line meant as a range
# (`1 .. 2 .. 3`, `.. 1e-3`), which RANGE not matching makes a mistake, not a listed text value
# (those three were each swept as one string, then "the space holds 1 distinct point");
# `../data` and a list (a comma) or quoted text are values.
MEANT_AS_RANGE = re.compile(r"(^|[\s\d])\.\.(?=[\s\d.+-]|$)")
RANGE_SHAPE = "a range is `low .. high`, then `log` or `linear` if wanted: `1e-5 .. 1e-3 log`"


class SweepError(ValueError):
    """What is wrong with a sweep's space (`key` is "sweep" or the swept key), or with the configs it
    makes (`of_configs`: ConfigIssues of the launch's own keys). The form shows the first beside the
    sweep box and the second where a launch's are (a grid's range beside a valid repeat_times
    field sent the person looking in the config)."""

    def __init__(self, issues: list[ConfigIssue], of_configs: bool = False):
        self.errors, self.of_configs = issues, of_configs
        super().__init__("\n".join(f"{issue.key}: {issue.message}" for issue in issues))


# ---- the space -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One swept key: listed `values`, or (random only) a range low .. high on a linear or log scale,
    of whole numbers where `integer` (axes_of reads that off the key, so it is not stored)."""

    key: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    scale: str = "linear"
    integer: bool = False

    def to_json(self) -> dict:
        if self.values:
            return {"key": self.key, "values": list(self.values)}
        return {"key": self.key, "low": self.low, "high": self.high, "scale": self.scale}

    def text(self) -> str:
        if self.values:
            return f"{self.key}: {', '.join(shown(value) for value in self.values)}"
        return f"{self.key}: {shown(self.low)} .. {shown(self.high)} {self.scale}"


def _scalar(text: str):
    """A listed value as typed: a JSON number, true/false/null or quoted string, else the text."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float, str, bool)) or value is None else text


def parse_space(text: str) -> list[Axis]:
    """The launch form's box, a key a line: `trainer.lr: 1e-5, 3e-5, 1e-4` or
    `algorithm.kl.coef: 0.001 .. 0.1 log`. Blank lines and lines starting with # are skipped."""
    if len(text) > MAX_TEXT:
        raise SweepError([ConfigIssue("sweep", f"at most {MAX_TEXT} characters")])
    axes, issues = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, colon, rest = line.partition(":")
        if not colon or not rest.strip():
            issues.append(ConfigIssue("sweep", f"line {number}: write `key: value, value` or `key: low .. high`"))
            continue
        found = RANGE.match(rest)
        if found:
            axes.append({"key": key.strip(), "low": _scalar(found[1]), "high": _scalar(found[2]),
                         "scale": (found[3] or "linear").lower()})
        elif MEANT_AS_RANGE.search(rest) and not any(mark in rest for mark in ',"\''):
            issues.append(ConfigIssue("sweep", f"line {number}: {RANGE_SHAPE}"))
        else:
            axes.append({"key": key.strip(), "values": [_scalar(value) for value in rest.split(",")]})
    if issues:
        raise SweepError(issues)
    return axes_of(axes)


def _finite_number(value) -> bool:
    """A number a range can be drawn from: a float's range (isfinite raised OverflowError on an int
    of 400 digits, a 500)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _typed_integer(key: str) -> bool | None:
    """Whether the config schema types the key as a whole number (trainer.batch_size: int | None) or
    as something else (trainer.lr: float); None where it types no such key (a key inside a mapping,
    explorer.workflow_args.max_turns, or a misspelt one, which the launch's validation names)."""
    section, *sections, name = [RunConfig, *key.split(".")]
    for part in sections:
        field = section.model_fields.get(part) if section else None
        section = section_of(field.annotation) if field else None
    field = section.model_fields.get(name) if section else None
    if field is None:
        return None
    types = leaf_types(field.annotation)
    return int in types and float not in types


def _is_integer_range(key: str, low, high, scale: str) -> bool:
    """A range of whole numbers: a key the schema types as one (`trainer.batch_size: 2 .. 64 log` drew
    2.71 and 45.3, refused at launch), never a float key (`trainer.weight_decay: 0 .. 1` drew only 0
    and 1); a key the schema does not type, as the bounds are written: linear between two integers."""
    typed = _typed_integer(key)
    if typed is not None:
        return typed
    return scale == "linear" and all(isinstance(v, int) for v in (low, high))


def axes_of(space) -> list[Axis]:
    """The space as the API takes it ([{"key", "values"} or {"key", "low", "high", "scale"}]),
    checked: known shape, bounded sizes, one axis per key, ranges of numbers with low < high (whole
    numbers for an integer key)."""
    if not isinstance(space, list) or not space:
        raise SweepError([ConfigIssue("sweep", "name at least one key to sweep")])
    if len(space) > MAX_KEYS:
        raise SweepError([ConfigIssue("sweep", f"at most {MAX_KEYS} keys")])
    axes, issues = [], []
    for item in space:
        key = item.get("key") if isinstance(item, dict) else None
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key or "") \
                or len(key) > 200:
            issues.append(ConfigIssue("sweep", f"{str(key)[:60]!r} is not a config key (dotted, as trainer.lr)"))
            continue
        if any(axis.key == key for axis in axes):
            issues.append(ConfigIssue(key, "swept twice"))
            continue
        if "values" in item:
            values = item["values"]
            if not isinstance(values, list) or not values or len(values) > MAX_VALUES:
                issues.append(ConfigIssue(key, f"list 1 to {MAX_VALUES} values"))
            elif any(isinstance(value, (dict, list)) for value in values):
                issues.append(ConfigIssue(key, "sweep plain values (numbers, words, true/false)"))
            elif len({json.dumps(value) for value in values}) < len(values):
                issues.append(ConfigIssue(key, "a value is listed twice"))
            else:
                axes.append(Axis(key, tuple(values)))
            continue
        low, high, scale = item.get("low"), item.get("high"), item.get("scale", "linear")
        numbers = all(_finite_number(v) for v in (low, high))
        if not numbers or not low < high:
            issues.append(ConfigIssue(key, "a range needs two numbers, low < high: `0.001 .. 0.1`"))
        elif scale not in ("linear", "log"):
            issues.append(ConfigIssue(key, "a range's scale is linear or log"))
        elif scale == "log" and low <= 0:
            issues.append(ConfigIssue(key, "a log range needs low > 0"))
        elif not _is_integer_range(key, low, high, scale):
            axes.append(Axis(key, low=low, high=high, scale=scale))
        elif not all(float(v).is_integer() for v in (low, high)):
            issues.append(ConfigIssue(key, "takes whole numbers: write the range's bounds as whole numbers, "
                                           "`2 .. 64`"))
        else:
            axes.append(Axis(key, low=int(low), high=int(high), scale=scale, integer=True))
    if issues:
        raise SweepError(issues)
    return axes


def combinations(axes: list[Axis], method: str, count: int | None, seed: int) -> list[dict]:
    """The swept values of each run, in launch order: {key: value}."""
    if method == Sweep.Method.GRID:
        ranged = [axis.key for axis in axes if not axis.values]
        if ranged:
            raise SweepError([ConfigIssue(key, "a grid takes listed values; a range needs method random")
                              for key in ranged])
        total = math.prod(len(axis.values) for axis in axes)
        if total > MAX_RUNS:
            raise SweepError([ConfigIssue("sweep", f"the grid makes {total} runs; at most {MAX_RUNS}")])
        return [dict(zip((axis.key for axis in axes), values)) for values in
                itertools.product(*(axis.values for axis in axes))]
    if method != Sweep.Method.RANDOM:
        raise SweepError([ConfigIssue("sweep", "method is grid or random")])
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RUNS:
        raise SweepError([ConfigIssue("sweep", f"a random search's count is 1 to {MAX_RUNS} runs")])
    return _random_points(axes, count, seed)


# ---- a random search -----------------------------------------------------------------------------
# Distinct points, as Optuna's and W&B's random searches draw them: a point drawn again is drawn
# anew (seed 0, count 2 and explorer.batch_size: 1 .. 8 made two runs of batch_size=7, named
# alike). A range's draws are rounded to FIGURES significant figures, or more where the range
# holds fewer than `count` such numbers (0.5 .. 0.502 holds 0.500, 0.501 and 0.502), and never
# outside it (0.1234 .. 0.1236 drew only 0.123 and 0.124, neither of them in it).

FIGURES = 3  # what a person writes and reads in a run's name
MAX_FIGURES = 15  # a double keeps 15 significant figures: more would not be distinct numbers


def _random_points(axes: list[Axis], count: int, seed: int) -> list[dict]:
    """`count` distinct points, the same for the same seed; SweepError when the space holds fewer."""
    figures = {axis.key: _figures(axis, count) for axis in axes if not (axis.values or axis.integer)}
    # 1e-5 .. 1.0000000000000002e-5 holds no number of 15 significant figures (a double's): it was
    # "lower the count to 0"
    empty = [axis for axis in axes if _size(axis, figures.get(axis.key), count) == 0]
    if empty:
        raise SweepError([ConfigIssue(axis.key, f"the range {shown(axis.low)} .. {shown(axis.high)} is too narrow to "
                                                "draw from: widen it") for axis in empty])
    distinct = math.prod(_size(axis, figures.get(axis.key), count) for axis in axes)
    if distinct < count:
        raise SweepError([ConfigIssue("sweep", f"the space holds {distinct} distinct point{'s' * (distinct != 1)}, "
                                               f"and a random search draws each of its {count} runs once: lower "
                                               f"the count to {distinct}, or list or range more values")])
    rng = random.Random(seed)
    points, seen = [], set()
    while len(points) < count:
        point = {axis.key: _draw(axis, rng, figures.get(axis.key)) for axis in axes}
        if (key := json.dumps(list(point.values()))) not in seen:
            seen.add(key)
            points.append(point)
    return points


def _size(axis: Axis, figures: int | None, enough: int) -> int:
    """How many distinct values the axis draws, counted up to `enough`."""
    if axis.values:
        return len(axis.values)
    if axis.integer:
        return min(axis.high - axis.low + 1, enough)
    return _grid_size(axis.low, axis.high, figures, enough)


def _figures(axis: Axis, count: int) -> int:
    """The significant figures the range's draws are rounded to: the fewest from FIGURES up that
    give it `count` values (MAX_FIGURES where none do: _random_points then refuses the space)."""
    return next((figures for figures in range(FIGURES, MAX_FIGURES)
                 if _grid_size(axis.low, axis.high, figures, count) >= count), MAX_FIGURES)


def _grid_size(low: float, high: float, figures: int, enough: int) -> int:
    """How many numbers of `figures` significant figures lie in low .. high, counted up to `enough`
    (exactly: as fractions, decade by decade)."""
    if low <= 0 <= high:
        return enough  # numbers ever nearer 0: as many as wanted
    near, far = sorted((abs(low), abs(high)))
    exponent, found = Decimal(near).adjusted(), 0  # near's decade: 10**exponent <= near
    near, far = Fraction(near), Fraction(far)
    while found < enough and Fraction(10) ** exponent <= far:
        step = Fraction(10) ** (exponent - figures + 1)
        first, last = max(near, Fraction(10) ** exponent), min(far, Fraction(10) ** (exponent + 1) - step)
        found += max(0, math.floor(last / step) - math.ceil(first / step) + 1)
        exponent += 1
    return min(found, enough)


def _on_grid(value: float, figures: int, rounding) -> float:
    """`value` to `figures` significant figures, rounded by `rounding` (math.ceil: up, math.floor: down)."""
    step = Fraction(10) ** (Decimal(abs(value)).adjusted() - figures + 1)
    return float(rounding(Fraction(value) / step) * step)


def _draw(axis: Axis, rng: random.Random, figures: int | None):
    """One value of the axis: a listed one, a whole number of an integer range, or a number of the
    range rounded to `figures` significant figures within it."""
    if axis.values:
        return rng.choice(axis.values)
    if axis.integer and axis.scale == "log":
        # Optuna's log-uniform integers: log-uniform over low - 0.5 .. high + 0.5, rounded, so each
        # whole number k gets its stretch k - 0.5 .. k + 0.5: 2 .. 64 draws 2 one time in 7
        # (log 2.5/1.5 of log 64.5/1.5) and 64 one in 240, the ends as likely as their neighbours'
        # spacing says (rounding log-uniform 2 .. 64 drew 2 half as often: only 2 .. 2.5 rounds to it).
        value = round(math.exp(rng.uniform(math.log(axis.low - 0.5), math.log(axis.high + 0.5))))
        return min(max(value, axis.low), axis.high)
    if axis.integer:
        return rng.randint(axis.low, axis.high)
    if axis.scale == "log":
        value = math.exp(rng.uniform(math.log(axis.low), math.log(axis.high)))
    else:
        value = rng.uniform(axis.low, axis.high)
    value = float(f"{value:.{figures}g}")
    if value < axis.low:  # rounded below the range: its lowest number of these figures
        return _on_grid(axis.low, figures, math.ceil)
    if value > axis.high:
        return _on_grid(axis.high, figures, math.floor)
    return value


# ---- launching -----------------------------------------------------------------------------------


NAME_MAX = Run._meta.get_field("name").max_length  # 200
NAME_KEPT = 20  # of a sweep's name, at least, where it must be cut


def run_name(name: str, swept: dict, number: int) -> str:
    """"lr sweep · lr=1e-05 · kl.coef=0.01": each key by its last part, or by more where two share it.
    Too long for a name (NAME_MAX), the sweep's name is cut, not the values that tell its runs apart
    (a 200-character sweep name gave each run that name alone); values too long to fit then are cut
    after the run's `number` in the sweep, which keeps the names distinct."""
    parts = []
    for key, value in swept.items():
        short = key.rsplit(".", 1)[-1]
        if sum(other.rsplit(".", 1)[-1] == short for other in swept) > 1:
            short = key
        parts.append(f"{short}={shown(value)}")
    values = " · ".join(parts)
    if len(name) + len(" · ") + len(values) <= NAME_MAX:
        return f"{name} · {values}"
    room = NAME_MAX - len("… · ") - len(values)
    if room >= NAME_KEPT:
        return f"{name[:room]}… · {values}"
    return f"{name[:NAME_KEPT]}… #{number} · {values}"[:NAME_MAX - 1] + "…"


def launch_sweep(owner, name: str, base: dict, space, method: str, count: int | None = None,
                 seed: int = 0) -> Sweep:
    """Validate every run's config, then make the sweep and its runs in one transaction (each run
    handed to the workers once it commits). SweepError names what is wrong: the space, or each
    config problem once with the first values that made it."""
    axes = axes_of(space)
    swept = combinations(axes, method, count, seed)
    configs, issues = [], {}
    base_keys = set(comparison.flatten_config(base))
    for values in swept:
        config = copy.deepcopy(base)
        for key, value in values.items():
            set_key(config, key, value)
        reset_unread(config, base_keys - set(values), swept=values)  # the base's keys this run's values leave unread
        try:
            services.validate_config(config)
        except ConfigError as err:
            made_by = ", ".join(f"{key}={shown(value)}" for key, value in values.items())
            for issue in err.errors:
                issues.setdefault((issue.key, issue.message),
                                  ConfigIssue(issue.key, f"{issue.message} (with {made_by})"))
        configs.append(config)
    if issues:
        raise SweepError(list(issues.values())[:50], of_configs=True)
    with transaction.atomic():
        sweep = Sweep.objects.create(name=name, owner=owner, method=method, space=[a.to_json() for a in axes],
                                     count=len(swept), seed=seed, base_config=base)
        for number, (values, config) in enumerate(zip(swept, configs), 1):
            run = services.launch_run(owner, run_name(name, values, number), config)
            Run.objects.filter(pk=run.pk).update(sweep=sweep, swept=values)
    return sweep


def space_text(sweep: Sweep) -> str:
    """The sweep's space as the launch form's box writes it."""
    return "\n".join(Axis(**{**axis, "values": tuple(axis.get("values", ()))}).text() for axis in sweep.space)


# ---- reading -------------------------------------------------------------------------------------


# What a sweep ranks its runs by, the first that any of its runs reports (comparison's summary
# titles): the best held-out figure; without one (no explorer.eval_interval, or none evaluated
# yet) the final train reward, or the final loss of a run that only trains.
RESULTS = (("Held-out", "best"), ("Train reward", "final"), ("Train loss", "final"))


def table(sweep: Sweep) -> dict:
    """The sweep page's table and chart: its keys, and a row per run with the swept values, status,
    steps, its held-out and train reward figures and its `result` (RESULTS), best first (runs
    without one last, in launch order). `result_label` names the result ("Held-out accuracy (best)"),
    `held_out_label` the held-out column; both None where nothing is reported yet."""
    runs = list(queries.with_latest_explorer_metrics(sweep.runs.select_related("owner")).order_by("pk"))
    summaries = comparison.run_summaries(runs)
    title, which = next(((t, w) for t, w in RESULTS if any(t in s.metrics for s in summaries)), (None, None))
    ranked_by = next((s.metrics[title] for s in summaries if title in s.metrics), None)  # its label, direction
    rows = []
    for run, summary in zip(runs, summaries):
        metric = summary.metrics.get(title)
        rows.append({
            "run": run, "values": [run.swept.get(axis["key"]) for axis in sweep.space],
            "progress": summary.progress, "held_out": summary.metrics.get("Held-out"),
            "reward": summary.metrics.get("Train reward"),
            "result": getattr(metric, which) if metric else None,
        })
    sign = -1 if ranked_by and ranked_by.direction == "max" else 1
    rows.sort(key=lambda row: (row["result"] is None, sign * (row["result"] or 0), row["run"].pk))
    held_out = next((row["held_out"].label for row in rows if row["held_out"]), None)
    return {"keys": [axis["key"] for axis in sweep.space], "rows": rows, "held_out_label": held_out,
            "result_label": f"{ranked_by.label} ({which})" if ranked_by else None}


def chart_data(rows: dict) -> dict:
    """The parallel-coordinates chart's data (static/js/sweep_page.js): an axis per key and the result."""
    return {
        "axes": [*rows["keys"], rows["result_label"] or "Result"],
        "runs": [{"name": row["run"].name, "url": reverse("run-detail", args=[row["run"].pk]),
                  "values": [*row["values"], row["result"]]}
                 for row in rows["rows"]],
    }
