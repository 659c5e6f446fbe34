"""The columns of the runs table (the runs list and its CSV): the run's own fields, its config keys
and summaries of its metrics (MetricSummary, kept as points are written: summaries.py), each with
what sorts and filters the runs by it in SQL, the same on Postgres and SQLite, so that the list
sorts and pages in the database.

A column's id is what ?cols=, ?sort= and ?where= name (docs/runs-list.md):
  status, progress, reward, mode, owner, created    the run's own (the name is always shown)
  trainer.lr, algorithm.name, ...                   a config key, dotted (docs/config.md)
  explorer/reward_mean, trainer/loss, ...           a metric's latest value ("role/key", as the charts name it)
  best:explorer/reward_mean                         its best over the run: the lowest for a loss-like
                                                    key, else the highest (metric_direction)
  min:trainer/grad_norm, max:explorer/reward_mean   its lowest or highest over the run, whichever is best
"""

import json
import math
import posixpath
import re
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

from django.conf import settings
from django.db import NotSupportedError
from django.db.models import Case, F, FloatField, Func, JSONField, OuterRef, Q, Subquery, TextField, Value, When
from django.db.models.functions import Cast, Coalesce, Lower, NullIf

from workers.rft.config import ModelConfig
from workers.rft.config_docs import rows as config_rows
from workers.rft.config_issues import architectures_of, hint

from . import queries
from .config_keys import get_key, shown
from .models import MetricPoint, MetricSummary, Run

RUN, CONFIG, METRIC = "run", "config", "metric"
LATEST, BEST, MIN, MAX = "latest", "best", "min", "max"
# A metric's summary other than its latest, named before it: "best:explorer/reward_mean".
SUMMARY_PREFIXES = {"best:": BEST, "min:": MIN, "max:": MAX}
ROLES = tuple(MetricPoint.Role.values)
# A metric key "a/b/c" may be stored flat ({"a/b/c": 1}) or nested ({"a": {"b": {"c": 1}}}), and
# runs of different engine versions differ (comparison._paths): each split is looked up, up to this
# many slashes (2**3 = 8 lookups); past it, only the flat and the fully nested ones.
SPLIT_SLASHES = 3
# Lower is better for these; higher for everything else (rewards, accuracy, throughput): which of a
# metric's summaries is its best, here and on the compare page. A reviewer found "best" the worst
# for the engine's health figures (explorer/truncated_frac, advantage/zero_variance_groups,
# trainer/logprob_mismatch, failed_tasks, idle_share, grad_norm); min: and max: say which outright.
LOWER_IS_BETTER = re.compile(r"(^|[/_])(loss|kl|perplexity|error|seconds|staleness|truncated|zero_variance|failed|"
                             r"mismatch|idle|grad_norm)($|[/_])")
# What a metric key may hold: SQLite's JSON paths quote a key ($."a b") with no escape for a quote.
MAX_KEY_CHARS = MetricSummary.MAX_KEY_CHARS
METRIC_KEY = re.compile(rf'[^"\x00-\x1f\x7f]{{1,{MAX_KEY_CHARS}}}')


class JSONScalar(Func):
    """The value at `path` (a list of keys) of a JSON column when it is of `kind`, else NULL:
    "number" as a float, "string" as text, "boolean" as 'false' or 'true'. Django's key transform
    gives a jsonb on Postgres and, on SQLite, text for true, false and null: neither sorts numbers
    as numbers with nulls last on both, nor filters `≥ 0.5` without casting a string."""

    TYPES = {  # kind: (Postgres jsonb_typeof, SQLite json_type)
        "number": (("number",), ("integer", "real")),
        "string": (("string",), ("text",)),
        "boolean": (("boolean",), ("true", "false")),
    }

    def __init__(self, expression, path: list[str], kind: str):
        self.path, self.kind = list(path), kind
        output = FloatField() if kind == "number" else TextField()
        super().__init__(expression, output_field=output)

    def as_postgresql(self, compiler, connection):
        sql, params = compiler.compile(self.source_expressions[0])
        types = self.TYPES[self.kind][0]
        value = f"(({sql}) #>> %s)" + ("::double precision" if self.kind == "number" else "")
        return (f"(CASE WHEN jsonb_typeof(({sql}) #> %s) IN ({', '.join(['%s'] * len(types))}) THEN {value} END)",
                (*params, self.path, *types, *params, self.path))

    def as_sqlite(self, compiler, connection):
        sql, params = compiler.compile(self.source_expressions[0])
        types = self.TYPES[self.kind][1]
        path = "$" + "".join("." + json.dumps(key) for key in self.path)
        value = "json_type(%s, %%s)" if self.kind == "boolean" else "json_extract(%s, %%s)"
        return (f"(CASE WHEN json_type({sql}, %s) IN ({', '.join(['%s'] * len(types))}) THEN {value % sql} END)",
                (*params, path, *types, *params, path))

    def as_sql(self, compiler, connection, **extra):
        raise NotSupportedError("the runs table's JSON columns are written for Postgres and SQLite")


def json_sort_keys(expression, path: list[str]) -> list:
    """Sort keys of a JSON value of any type: numbers (as numbers), then strings, then booleans;
    NULL (the key missing, or null) in each, so that with nulls last a null comes after them all."""
    return [JSONScalar(expression, path, kind) for kind in ("number", "string", "boolean")]


def metric_direction(chart: str) -> str:
    """"min" when a lower value of the metric ("role/key") is better, else "max"."""
    return "min" if LOWER_IS_BETTER.search(chart.split("/", 1)[-1]) else "max"


def metric_paths(key: str) -> list[list[str]]:
    """The JSON paths a metric key may be stored at: "reward/mean" -> [["reward/mean"], ["reward", "mean"]]."""
    parts = key.split("/")
    if len(parts) - 1 > SPLIT_SLASHES:
        return [[key], parts]
    paths = []
    for joins in product((False, True), repeat=len(parts) - 1):  # whether each slash splits a level
        path = [parts[0]]
        for part, split in zip(parts[1:], joins):
            if split:
                path.append(part)
            else:
                path[-1] += "/" + part
        paths.append(path)
    return paths


def leaves(values: dict, prefix=()):
    """(path as a list of keys, value) of each value of a metric point that is not a mapping."""
    for key, value in values.items():
        if isinstance(value, dict):
            yield from leaves(value, (*prefix, key))
        else:
            yield [*prefix, key], value


def _number_at(expression, paths: list[list[str]]):
    numbers = [JSONScalar(expression, path, "number") for path in paths]
    return numbers[0] if len(numbers) == 1 else Coalesce(*numbers)


def metric_number(key: str):
    """A metric point's number at `key` (in any of the layouts it may be stored in); else NULL."""
    return _number_at(F("values"), metric_paths(key))


@dataclass(frozen=True)
class Column:
    id: str
    label: str
    kind: str  # RUN, CONFIG or METRIC
    numeric: bool = False  # shown right-aligned, sorted biggest first on a first click, and ≥ ≤ filter it
    help: str = ""
    role: str = ""  # a metric's
    key: str = ""  # a metric's key in its role, or the config key
    summary: str = ""  # a metric's: LATEST, BEST, MIN or MAX
    value_kind: str = ""  # a config key's, as its schema says: "number", "string or null", "boolean", "list"...

    @property
    def right_aligned(self) -> bool:
        """Shown as a number (the progress column shows a bar)."""
        return self.numeric and self.id != "progress"

    @property
    def first_descending(self) -> bool:
        """A first click on its header sorts the biggest and newest first; A to Z for text."""
        return self.numeric or self.id == "created"

    @property
    def training_only(self) -> bool:
        """A config key only training reads (Run.TRAINING_SECTIONS): a bench run has none."""
        return self.kind == CONFIG and self.key.split(".")[0] in Run.TRAINING_SECTIONS

    def config(self):
        """The config a config column reads in SQL: none (NULL) for a bench run where the key is
        training_only, so that it sorts last, groups as not set and matches no filter's value, as
        its row shows it (config_value). A bench run's stored config keeps the schema's
        defaults there (algorithm.name grpo, trainer.lr 1e-6), which it never used."""
        if not self.training_only:
            return F("config")
        return Case(When(mode=Run.Mode.BENCH, then=Value(None)), default=F("config"), output_field=JSONField())

    @property
    def direction(self) -> str:
        """A metric's "min" or "max": which value is its best."""
        return metric_direction(f"{self.role}/{self.key}")

    def sort_keys(self) -> list:
        """The expressions that order runs by this column, each sorted with nulls last."""
        if self.kind == CONFIG:
            return json_sort_keys(self.config(), self.key.split("."))
        return [self.number()] if self.numeric else [RUN_SORT_KEYS[self.id]()]

    def number(self):
        """The column's value as a float, NULL where it has none (a numeric column)."""
        if self.kind == CONFIG:
            return JSONScalar(self.config(), self.key.split("."), "number")
        if self.kind == RUN:
            return RUN_SORT_KEYS[self.id]()
        # The run's summary (summaries.py), one row by the unique index. The best read every point
        # of the role: a page of 200 runs × 2,000 steps sorted by it took 1,118-1,278 ms where it
        # now takes 102-110 (bench/runs_table.py, in turn on one loaded machine).
        field = {LATEST: "latest", BEST: self.direction, MIN: "min", MAX: "max"}[self.summary]
        summary = MetricSummary.objects.filter(run=OuterRef("pk"), role=self.role, key=self.key)
        return Subquery(summary.values(field)[:1], output_field=FloatField())


def _progress():
    """Steps done over trainer.total_steps (explorer steps for a run that only explores); a bench
    run's evaluation, 1 once completed, else 0: as queries.run_progress, which its row shows (a
    completed one was 0 here, grouped, filtered and sorted, and 1 / 1 in its row)."""
    done = Case(When(mode=Run.Mode.EXPLORE, then=F("explorer_step")), default=F("trainer_step"))
    total = NullIf(JSONScalar(F("config"), ["trainer", "total_steps"], "number"), Value(0.0))
    return Case(When(mode=Run.Mode.BENCH, status=Run.Status.COMPLETED, then=Value(1.0)),
                When(mode=Run.Mode.BENCH, then=Value(0.0)),
                default=Cast(done, FloatField()) / total, output_field=FloatField())


def _reward():
    """The latest explorer point's reward (queries.latest_reward: the first of REWARD_KEYS it holds)."""
    last = MetricPoint.objects.filter(run=OuterRef("pk"), role=MetricPoint.Role.EXPLORER).order_by("-step")
    values = Subquery(last.values("values")[:1])
    return Coalesce(*(JSONScalar(values, [key], "number") for key in queries.REWARD_KEYS))


RUN_SORT_KEYS = {
    "name": lambda: Lower("name"),
    "status": lambda: F("status"),
    "progress": _progress,
    "reward": _reward,
    "mode": lambda: F("mode"),
    "owner": lambda: Lower("owner__username"),
    "created": lambda: F("created_at"),
}
RUN_COLUMNS = {
    column.id: column for column in (
        Column("name", "Run", RUN),
        Column("status", "Status", RUN),
        Column("progress", "Progress", RUN, numeric=True, help="steps done of trainer.total_steps"),
        Column("reward", "Reward", RUN, numeric=True,
               help=f"the latest explorer step's mean reward ({', '.join(queries.REWARD_KEYS)})"),
        Column("mode", "Mode", RUN),
        Column("owner", "Owner", RUN),
        Column("created", "Created", RUN),
    )
}
NAME = RUN_COLUMNS["name"]
# What the list shows until a person picks: the old fixed columns' figures, and the three config
# keys that tell a list of GRPO/SFT/DPO runs apart at a glance.
DEFAULT_COLUMNS = ("status", "progress", "reward", "algorithm.name", "model.path", "trainer.lr", "owner", "created")


@cache
def config_columns() -> dict[str, Column]:
    """A column per key of the config schema (not per section), in the schema's order."""
    columns = {}
    for key, kind, _default, _allowed, about in config_rows():
        if kind != "mapping":
            numeric = kind.split(" or ")[0] in ("integer", "number")
            columns[key] = Column(key, key, CONFIG, numeric=numeric, help=about, key=key, value_kind=kind)
    return columns


def metric_column(role: str, key: str, summary: str = LATEST) -> Column:
    chart = f"{role}/{key}"
    if summary == LATEST:
        return Column(chart, chart, METRIC, numeric=True, help=f"{chart} at the run's latest step that has it",
                      role=role, key=key, summary=LATEST)
    field = metric_direction(chart) if summary == BEST else summary
    about = {"min": "lowest", "max": "highest"}[field]
    return Column(f"{summary}:{chart}", f"{chart} ({summary})", METRIC, numeric=True,
                  help=f"the {about} {chart} over the run", role=role, key=key, summary=summary)


class UnknownColumn(ValueError):
    pass


def column(column_id: str) -> Column:
    """The column of an id (as ?cols= names it); UnknownColumn says why not, with the closest id.
    A metric is any "role/key": whether the runs record it is the table's to say (run_table)."""
    column_id = column_id.strip()
    if column_id in RUN_COLUMNS:
        return RUN_COLUMNS[column_id]
    if column_id in config_columns():
        return config_columns()[column_id]
    prefix, _, after = column_id.partition(":")
    summary = SUMMARY_PREFIXES.get(prefix + ":", LATEST) if after else LATEST
    chart = after if summary != LATEST else column_id
    if "/" in chart:
        role, key = chart.split("/", 1)
        if role not in ROLES:
            raise UnknownColumn(f"unknown metric role {role!r} in {column_id!r}: a metric is role/key, the role one "
                                f"of {', '.join(ROLES)}")
        if not key:
            raise UnknownColumn(f"{column_id!r} names no metric key after {role}/")
        if not METRIC_KEY.fullmatch(key):
            raise UnknownColumn(f"{column_id[:100]!r} is no metric key: at most {MAX_KEY_CHARS} characters, without "
                                "quotes or control characters")
        return metric_column(role, key, summary)
    close = hint(column_id, [*RUN_COLUMNS, *config_columns()])
    raise UnknownColumn(f"unknown column {column_id[:100]!r}" + (close or ": a column is one of the run's own ("
                        f"{', '.join(RUN_COLUMNS)}), a config key (trainer.lr) or a metric (explorer/reward_mean, "
                        "best:explorer/reward_mean, min:trainer/loss, max:explorer/reward_mean)"))


# ---- cells -------------------------------------------------------------------------------------


def metric_values(runs: list[Run], columns: list[Column]) -> dict[int, dict[str, float | None]]:
    """{run id: {column id: value}} of the metric columns for these runs, in one query."""
    metrics = [column for column in columns if column.kind == METRIC]
    if not runs or not metrics:
        return {}
    names = {column.id: f"m{index}" for index, column in enumerate(metrics)}
    found = Run.objects.filter(pk__in=[run.pk for run in runs]).annotate(
        **{names[column.id]: column.number() for column in metrics})
    rows = found.values("pk", *names.values())
    return {row["pk"]: {column_id: row[name] for column_id, name in names.items()} for row in rows}


# The config keys that name a model directory. A launch stores each resolved, absolute
# (services.validate_config: what the workers load is what was checked), while people wrote it
# relative to the data dir: `model.path: models/con` (a saved model). The table shows and matches
# the written form; the engine's stored value is left as it is.
MODEL_PATH_KEYS = frozenset(f"model.{name}" for name, field in ModelConfig.model_fields.items()
                            if architectures_of(field))


def data_dir() -> str:
    return str(Path(settings.DATA_DIR).resolve())


def written(column: Column, value):
    """A config value as the run's config wrote it: a model directory under the data dir relative
    to it (as config_checks.shown says it), any other value as stored."""
    if column.key in MODEL_PATH_KEYS and isinstance(value, str) and posixpath.isabs(value):
        root = data_dir()
        if value.startswith(root.rstrip("/") + "/"):
            return value[len(root.rstrip("/")) + 1:]
    return value


def stored_paths(value: str) -> list[str]:
    """What a model directory typed in a filter (models/con, ./models/con/, or absolute) is stored
    as: the absolute directory under the data dir, and the text itself (a built-in's name: tiny)."""
    typed = posixpath.normpath(value) if value else value
    found = [value, typed, posixpath.normpath(posixpath.join(data_dir(), typed))]
    return list(dict.fromkeys(found))


# A training_only column's cell in a bench run's row, where it has no value.
NOT_TRAINED = "a bench run trains nothing"


def config_value(run: Run, column: Column):
    """The run's value of a config column as its config wrote it; None for a bench run's
    training_only key (Column.config: the SQL reads it so)."""
    if column.training_only and run.mode == Run.Mode.BENCH:
        return None
    return written(column, get_key(run.config, column.key))


def config_text(value) -> str | None:
    return None if value is None else shown(value)


# ---- conditions (?where=) -----------------------------------------------------------------------

# "trainer.lr = 1e-5", "best:explorer/reward_mean >= 0.5": a column, an operator, a value.
OPERATORS = {"=": "exact", "!=": "exact", ">=": "gte", "<=": "lte", ">": "gt", "<": "lt"}
ALIASES = {"==": "=", "≠": "!=", "≥": ">=", "≤": "<="}
CONDITION = re.compile(r"\s*(?P<column>.*?)\s*(?P<operator>==|!=|>=|<=|≠|≥|≤|=|>|<)\s*(?P<value>.*?)\s*", re.S)
# What the operators are made of, but "!" ("!=" only: a path may hold one). A column that ends in
# "!" ("trainer.lr ! = 1"), or a value that starts with "!" or holds one of these unquoted ("= 1",
# "> 1", "grpo = sft"), was typed with two operators.
OPERATOR_CHARS = frozenset("=<>≠≥≤")
# A number as a person writes it: 1e-5, .5, 5., +3. Python's float() takes more (inf, nan, 1_000,
# " 1") and JSON less (.5, +3).
NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
WORDS = {"true": True, "false": False, "null": None}
NOT_FINITE = re.compile(r"[-+]?(nan|inf|infinity)", re.I)
MAX_CONDITION_CHARS = 300
MAX_CONDITIONS = 10
LARGEST_INTEGER = 2**63 - 1  # what both databases hold as a whole number
SHOWN_VALUE = 40  # a value is quoted back this far


class BadCondition(ValueError):
    pass


@dataclass(frozen=True)
class Condition:
    column: Column
    operator: str  # a key of OPERATORS
    value: object  # a JSON scalar (a float or int for the comparisons)

    @property
    def text(self) -> str:
        return f"{self.column.id} {self.operator} {config_text(self.value)}"

    def apply(self, runs, name: str):
        """`runs` narrowed to those meeting it; `name`: an alias of its own for the value. "!="
        keeps the runs without a value, as "differs from"; the comparisons never do."""
        if self.column.id == "mode":  # the run's field: every run has one
            equal = Q(mode=self.value)
            return runs.exclude(equal) if self.operator == "!=" else runs.filter(equal)
        if self.column.kind == CONFIG and self.operator in ("=", "!="):
            # JSON equality, any type: 1e-5 matches 0.00001 and 1e-05; "grpo" a string; true a boolean.
            lookup = "config__" + "__".join(self.column.key.split("."))
            equal = Q(**{lookup: self.value})
            if self.column.key in MODEL_PATH_KEYS and isinstance(self.value, str):
                equal = Q(**{f"{lookup}__in": stored_paths(self.value)})  # as written, or as stored
            if self.column.training_only:  # a bench run holds none (Column.config)
                equal &= ~Q(mode=Run.Mode.BENCH)
            if self.operator == "!=":  # by id: NOT (x = v) is NULL, not true, where the key is missing
                return runs.exclude(pk__in=Run.objects.filter(equal).values("pk"))
            return runs.filter(equal)
        runs = runs.alias(**{name: self.column.number()})
        if self.operator == "!=":
            return runs.filter(Q(**{f"{name}__isnull": True}) | ~Q(**{name: self.value}))
        return runs.filter(**{f"{name}__{OPERATORS[self.operator]}": self.value})


def condition(text: str) -> Condition:
    """The condition typed; BadCondition says what is wrong with it. Whatever could match no run
    by its form alone is refused, not applied as an empty list: no column or no value, two
    operators, no finite number where the column holds numbers, a value the config key cannot hold."""
    if len(text) > MAX_CONDITION_CHARS:
        raise BadCondition(f"a filter of {len(text):,} characters: at most {MAX_CONDITION_CHARS}")
    match = CONDITION.fullmatch(text)
    if not match:
        raise BadCondition(f"{text!r} is not a filter: write a column, an operator ({', '.join(OPERATORS)}) and a "
                           "value, e.g. trainer.lr = 1e-5 or explorer/reward_mean >= 0.5")
    where, typed = f"in {text.strip()!r}", match["value"]
    operator = ALIASES.get(match["operator"], match["operator"])
    if not match["column"]:
        raise BadCondition(f"no column before {operator!r} {where}: write the column first, e.g. trainer.lr = 1e-5")
    if match["column"].endswith("!") or (not typed.startswith('"') and (
            typed.startswith("!") or OPERATOR_CHARS.intersection(typed))):
        raise BadCondition(f"two operators {where}: write one of {', '.join(OPERATORS)} between the column and the "
                           'value (quote a text that holds one: model.path = "a=b")')
    if not typed:
        raise BadCondition(f"no value after {operator!r} {where}: write one, e.g. trainer.lr = 1e-5, "
                           "algorithm.name = grpo or explorer/reward_mean >= 0.5")
    try:
        found = column(match["column"])
    except UnknownColumn as err:
        raise BadCondition(str(err)) from None
    if found.kind == RUN and not found.numeric and found.id != "mode":
        raise BadCondition(f"{found.id} is not filtered here {where}: use the search box and the status and owner "
                           "menus for the run's own fields; config keys, mode and metrics are filtered here")
    value = _value(typed, where)
    if found.id == "mode":  # the run's (no menu has it): what a group by mode lists (run_groups)
        if operator not in ("=", "!=") or value not in Run.Mode.values:
            raise BadCondition(f"mode takes = or != and one of {', '.join(Run.Mode.values)} {where}")
        return Condition(found, operator, value)
    if found.kind == CONFIG and operator in ("=", "!="):
        return Condition(found, operator, _config_value(found, value, typed, where))
    if not found.numeric:
        raise BadCondition(f"{found.id} is not compared as a number {where}: it takes = and !=")
    return Condition(found, operator, _finite(value, typed, where, found))


def is_condition(text: str) -> bool:
    try:
        condition(text)
    except BadCondition:
        return False
    return True


def _value(typed: str, where: str):
    """What was typed: a number (1e-5, .5, +3: an int where it is whole), true, false, null, a
    "quoted text" (JSON's escapes), else the text as it is (grpo)."""
    if NUMBER.fullmatch(typed):
        whole = not any(mark in typed for mark in ".eE")
        return int(typed) if whole else float(typed)  # 1e999 is inf: _finite names it
    if typed in WORDS:
        return WORDS[typed]
    if typed.startswith('"'):
        try:
            quoted = json.loads(typed)
        except ValueError:
            quoted = None
        if not isinstance(quoted, str):
            raise BadCondition(f"{typed[:SHOWN_VALUE]!r} is no quoted text {where}: a text in quotes ends with "
                               'its closing quote, e.g. algorithm.name = "grpo"')
        return quoted
    return typed


def _finite(value, typed: str, where: str, found: Column) -> float:
    """The value as the float a numeric column is compared with; BadCondition where it is none."""
    shown = repr(typed[:SHOWN_VALUE])
    if NOT_FINITE.fullmatch(typed):  # a diverged value is stored as null, and jsonb holds no NaN
        raise BadCondition(f"{shown} is not a number {where}: no run holds NaN or an infinity")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadCondition(f"{shown} is not a number {where}: {found.id} is compared as a number")
    try:
        number = float(value)
    except OverflowError:  # a whole number past a float's range
        number = math.inf
    if not math.isfinite(number):
        raise BadCondition(f"{shown} is not a number {where}: past the largest a run holds (±1.8e308)")
    return number


def _config_value(found: Column, value, typed: str, where: str):
    """The JSON value a config key's = and != compare with, as its schema's kind reads what was
    typed: a number for a number, true or false for a boolean, the text as typed (quotes optional)
    for a text; null for any key (a run may hold null, or an old config may)."""
    holds = set(found.value_kind.split(" or "))
    if value is None:
        return None
    if "string" in holds:
        return value if isinstance(value, str) else typed
    if holds & {"number", "integer"}:
        number = _finite(value, typed, where, found)
        if isinstance(value, int) and abs(value) > LARGEST_INTEGER:
            raise BadCondition(f"{typed[:SHOWN_VALUE]!r} is too large a whole number {where}")
        return value if isinstance(value, int) else number
    if "boolean" in holds:
        if not isinstance(value, bool):
            raise BadCondition(f"{typed[:SHOWN_VALUE]!r} is not true or false {where}: {found.id} is a boolean")
        return value
    raise BadCondition(f"{found.id} holds a {found.value_kind} {where}: a filter compares one value (a number, a text, "
                       "true or false)")
