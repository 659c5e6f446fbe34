"""The runs list grouped by one or two keys (?group=algorithm.name,trainer.lr): config keys, or the
run's status, mode or owner, as W&B's runs table groups by config, state or user: a row per
distinct value (or pair), how many runs hold it, and for each numeric column the mean and the
spread (std, min-max) over them; a row opens to its runs (?expand=). A metric's
figures are its runs' summaries (MetricSummary, through Column.number), never their points.

The runs are grouped in Python from one query (a row per matching run: its group values and its
numeric columns): std is no aggregate SQLite has, and a config value's type (1 against "1" against
true) tells groups apart, which a GROUP BY on either database's text of it would not. Runs without
the key, or with null there, are one group: "(not set)"."""

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from django.db import NotSupportedError
from django.db.models import Func, TextField

from apps.core.templatetags.text import ago

from . import comparison, run_columns
from .run_columns import CONFIG, Column, UnknownColumn

MAX_GROUP_KEYS = 2
# The run's own columns a list groups by, and the row field each reads. Not name, created (a group
# a run), progress or reward (numbers: their mean is the group's figure).
RUN_KEYS = {"status": "status", "mode": "mode", "owner": "owner__username"}
NOT_SET = "(not set)"
FIGURES = ("mean", "std", "min", "max")  # a numeric column's, per group (the CSV's columns)
SHOWN_VALUES = 3  # a non-numeric column of a group names this many of its values, then counts the rest


class JSONText(Func):
    """The JSON text of the value at `path` of a JSON column ('"grpo"', '1e-05', 'true', '[1, 2]'),
    NULL where the key is missing: its type survives, which the key transforms' text does not."""

    output_field = TextField()

    def __init__(self, expression, path: list[str]):
        self.path = list(path)
        super().__init__(expression)

    def as_postgresql(self, compiler, connection):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(({sql}) #> %s)::text", (*params, self.path)

    def as_sqlite(self, compiler, connection):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(({sql}) -> %s)", (*params, "$" + "".join("." + json.dumps(key) for key in self.path))

    def as_sql(self, compiler, connection, **extra):
        raise NotSupportedError("the runs table's JSON columns are written for Postgres and SQLite")


def parse_group(text: str) -> tuple[list[Column], list[str]]:
    """The keys of "a,b" to group by, and what was wrong (each naming the key): a key that is no
    column, a column that is neither a config key nor one of RUN_KEYS, more than MAX_GROUP_KEYS."""
    keys, errors = [], []
    for key in dict.fromkeys(part.strip() for part in text.split(",") if part.strip()):
        try:
            found = run_columns.column(key)
        except UnknownColumn as err:
            errors.append(str(err))
            continue
        if found.kind != CONFIG and found.id not in RUN_KEYS:
            errors.append(f"{key[:100]!r} is not a key runs are grouped by: a config key (algorithm.name, trainer.lr, "
                          f"model.path) or the run's {', '.join(RUN_KEYS)}")
        else:
            keys.append(found)
    if len(keys) > MAX_GROUP_KEYS:
        errors.append(f"{len(keys)} keys: runs are grouped by at most {MAX_GROUP_KEYS}")
    return ([] if errors else keys), errors


@dataclass
class Group:
    values: tuple  # each key's value: in the runs' config (None: not set), shown as the config wrote it; or the run's
    runs: list[int] = field(default_factory=list)  # their ids, in the view's order
    cells: list = field(default_factory=list)  # (column, cell) as the template draws them
    newest: object = None  # the newest run's created_at
    sorted_by: float | None = None  # the mean of the view's sort column (shown or not), where numeric

    @property
    def token(self) -> str:
        """What ?expand= names it by."""
        return token(self.values)

    @property
    def shown(self) -> list[dict]:
        """Each key's {text, set}: "(not set)" where the runs have none."""
        return [{"text": NOT_SET, "set": False} if value is None else
                {"text": run_columns.config_text(value), "set": True} for value in self.values]

    def filters(self, keys: list[Column]) -> list[tuple[str, str]] | None:
        """The list's filters that list its runs, (parameter, value) each: the status and owner
        menus, else a ?where=; None where a filter cannot (a key not set, a list)."""
        found = [filter_of(key, value) for key, value in zip(keys, self.values)]
        return None if None in found else found


def filter_of(key: Column, value) -> tuple[str, str] | None:
    if key.id in ("status", "owner"):  # the list's menus (forms.RunFilterForm)
        return None if value is None else (key.id, value)
    text = where_text(key, value)
    return None if text is None else ("where", text)


def token(values) -> str:
    return json.dumps(list(values), separators=(",", ":"))


def where_text(key: Column, value) -> str | None:
    """"key = value" as a filter reads it back to this value (run_columns.condition), or None."""
    if value is None or isinstance(value, (list, dict)):
        return None
    for typed in ((value, json.dumps(value)) if isinstance(value, str) else (json.dumps(value),)):
        text = f"{key.id} = {typed}"
        try:
            if run_columns.condition(text).value == value:
                return text
        except run_columns.BadCondition:
            pass
    return None


def grouped(runs, keys: list[Column], columns: list[Column], sort: Column) -> list[Group]:
    """The groups of `runs` (ordered: each group's runs keep that order; the groups are in the
    order their first run comes) by `keys`, with their cells for `columns` and the mean of `sort`
    where it is numeric. One query."""
    names = {key.id: f"g{index}" if key.kind == CONFIG else RUN_KEYS[key.id] for index, key in enumerate(keys)}
    configs = {names[key.id]: JSONText(key.config(), key.key.split(".")) for key in keys if key.kind == CONFIG}
    numbers = {f"n{index}": column.number() for index, column in enumerate(columns) if column.numeric}
    if sort.numeric:
        numbers["sort"] = sort.number()
    texts = {f"t{index}": JSONText(column.config(), column.key.split("."))
             for index, column in enumerate(columns) if column.kind == CONFIG and not column.numeric}
    rows = runs.values("pk", "status", "mode", "owner__username", "created_at", **configs, **numbers, **texts)
    groups: dict[str, Group] = {}
    members: dict[str, list[dict]] = {}
    for row in rows:
        values = tuple(_loaded(key, row[names[key.id]]) if key.kind == CONFIG else row[names[key.id]] for key in keys)
        found = groups.setdefault(token(values), Group(values))
        found.runs.append(row["pk"])
        members.setdefault(found.token, []).append(row)
    for group in groups.values():
        rows = members[group.token]
        group.newest = max(row["created_at"] for row in rows)
        group.cells = [(column, _cell(column, index, rows)) for index, column in enumerate(columns)]
        if sort.numeric:
            group.sorted_by = spread(sort, [row["sort"] for row in rows])["mean"]
    return list(groups.values())


def _loaded(column: Column, text):
    """A group value from its JSON text: null and a missing key alike None; a model path as written."""
    value = None if text is None else json.loads(text)
    if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
        value = int(value) if abs(value) < 2**53 else value  # Postgres's 1.0 and SQLite's 1 are one group
    return run_columns.written(column, value)


def _cell(column: Column, index: int, rows: list[dict]) -> dict:
    """A group's cell: numbers' {mean, std, min, max, count, text, spread, title}, else {text, title}."""
    if column.numeric:
        return spread(column, [row[f"n{index}"] for row in rows])
    if column.id == "created":
        newest = max(row["created_at"] for row in rows)
        return {"text": f"newest {ago(newest)}", "title": str(newest), "csv": newest.isoformat()}  # as the list's
    if column.kind == CONFIG:
        values = [run_columns.config_text(_loaded(column, row[f"t{index}"])) for row in rows]
    else:
        values = [row[RUN_KEYS.get(column.id, column.id)] for row in rows]
    counts = Counter(value for value in values if value is not None)
    if not counts:
        return {"text": None, "title": ""}
    if len(counts) == 1:
        return {"text": next(iter(counts)), "title": f"{column.id}: every run with one"}
    named = [f"{value} {count}" for value, count in counts.most_common(SHOWN_VALUES)]
    rest = len(counts) - SHOWN_VALUES
    return {"text": " · ".join(named) + (f" · +{rest} more" if rest > 0 else ""),
            "title": f"{column.id}: " + ", ".join(f"{value} ({count})" for value, count in counts.most_common())}


def spread(column: Column, numbers: list) -> dict:
    """Mean, std (of the runs themselves: 0 for one), min and max of the runs that have a value."""
    found = [number for number in numbers if number is not None and math.isfinite(number)]
    if not found:
        return {"mean": None, "std": None, "min": None, "max": None, "count": 0, "text": None, "spread": "",
                "title": ""}
    mean, std = statistics.fmean(found), statistics.pstdev(found)
    low, high = min(found), max(found)
    short = comparison.short_number
    of = f"{len(found)} of {len(numbers)} runs" if len(found) < len(numbers) else f"{len(found)} runs"
    return {"mean": mean, "std": std, "min": low, "max": high, "count": len(found), "text": short(mean),
            # one value (one run, or the key the groups are by): the value alone, no spread to read
            "spread": f"± {short(std)}" if low != high else "",
            "range": f"{short(low)} – {short(high)}" if low != high else "",
            "title": f"{column.label} over {of}: mean {mean!r}, std {std!r}, min {low!r}, max {high!r}"}


def sort_groups(groups: list[Group], sort: Column, descending: bool) -> list[Group]:
    """Groups by the view's sort: a numeric column's mean, a run's column by its cell, the name by
    the group's values, created by the newest run; a group without one last either way."""

    def key(group: Group):
        if sort.id == "name":
            return None if set(group.values) == {None} else tuple(map(_comparable, group.values))
        if sort.id == "created":
            return group.newest
        if sort.numeric:
            return group.sorted_by
        # a text column (status, owner, a config key's text) by what its cell says; not shown: none
        return next((cell["text"] for column, cell in group.cells if column.id == sort.id), None)

    keyed = [(key(group), group) for group in groups]
    present = sorted([pair for pair in keyed if pair[0] is not None], key=lambda pair: pair[0], reverse=descending)
    return [group for _, group in present] + [group for value, group in keyed if value is None]


def _comparable(value):
    """Numbers, then texts, then the rest (JSON), then not set: one order for any values."""
    if value is None:
        return (3, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, value) if isinstance(value, str) else (2, json.dumps(value, sort_keys=True))

