"""The runs list as a table a researcher reads as W&B's runs table or MLflow's experiment view: the
columns picked (?cols=, else the ones last saved, else DEFAULT_COLUMNS), the sort (?sort=, any
column, either way), the cells of a page, and the CSV of every matching run. The columns and their
SQL are run_columns.py's; the filters (?where= among them) RunFilterForm's."""

import csv
import io
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import F, OrderBy

from workers.rft.config_issues import MAX_REPORTED_ISSUES, hint, unknown_hint

from . import comparison, queries, run_columns, run_groups, waits
from .models import MetricSummary, Run, RunListColumns
from .notes import shown_tags
from .run_columns import CONFIG, DEFAULT_COLUMNS, METRIC, NAME, RUN, Column, UnknownColumn

MAX_COLUMNS = 40
SHOWN_PARAMETER = 40  # an unknown parameter's name is quoted back this far
DEFAULT_SORT = "-created"
# The metric keys the column picker offers are those of the newest runs listed (every key their
# summaries hold, one query), not of every run ever.
PICKER_RUNS = 200
CSV_CHUNK_RUNS = 500
HOME_COLUMNS = ("status", "progress", "reward", "mode", "owner", "created")  # the dashboard's half-width card
# What the list reads of its query (RunFilterForm's fields, the view's, the page): the CSV, which
# scripts fetch, refuses any other as the API does (api.routes.reads_only_its_query).
FILTERS = ("q", "status", "owner", "tag", "where")
QUERY_PARAMETERS = (*FILTERS, "cols", "sort", "group", "expand", "page")


@dataclass
class TableView:
    """What the table shows and in which order; `errors` say what of the query was not applied."""

    columns: list[Column]
    sort: Column = field(default_factory=lambda: run_columns.RUN_COLUMNS["created"])
    descending: bool = True
    errors: list[str] = field(default_factory=list)
    offered: list[str] = field(default_factory=list)  # the metrics the picker offers ("role/key")
    group: list[Column] = field(default_factory=list)  # the keys the runs are grouped by (run_groups)

    @property
    def group_text(self) -> str:
        return ",".join(column.id for column in self.group)

    @property
    def cols(self) -> str:
        return ",".join(column.id for column in self.columns)

    @property
    def sort_text(self) -> str:
        return ("-" if self.descending else "") + self.sort.id

    def order(self, runs):
        """`runs` in this view's order: nulls last either way, ties by id (the same way)."""
        keys = [OrderBy(key, descending=self.descending, nulls_last=True) for key in self.sort.sort_keys()]
        return runs.order_by(*keys, OrderBy(F("pk"), descending=self.descending))

    def headers(self, query) -> list[dict]:
        """The name and each column: {column, sort (its ?sort= on a click), sorted ("ascending",
        "descending" or "")} ; the query's other parameters are kept, its page is not."""
        headers = []
        for column in [NAME, *self.columns]:
            sorted_ = ("descending" if self.descending else "ascending") if column == self.sort else ""
            descending = not self.descending if sorted_ else column.first_descending
            params = query.copy()
            params.pop("page", None)
            params["sort"] = ("-" if descending else "") + column.id
            params["cols"] = self.cols  # the columns shown: a bad one the page named is left behind
            headers.append({"column": column, "query": params.urlencode(safe=",/:"), "sorted": sorted_})
        return headers


def parse_columns(text: str) -> tuple[list[Column], list[str]]:
    """The columns of "a,b,c" in that order, repeats and the name dropped, and what was wrong with
    the others."""
    columns, errors = [], []
    for column_id in dict.fromkeys(part.strip() for part in text.split(",") if part.strip()):
        try:
            found = run_columns.column(column_id)
        except UnknownColumn as err:
            errors.append(str(err))
            continue
        if found != NAME:
            columns.append(found)
    if len(columns) > MAX_COLUMNS:
        errors.append(f"{len(columns)} columns: the table shows at most {MAX_COLUMNS}; the first {MAX_COLUMNS} shown")
        columns = columns[:MAX_COLUMNS]
    return columns, errors


def table_view(query, saved: list[str] | None = None) -> TableView:
    """The view a list's query asks for: ?cols= (else `saved`, the user's last pick, else the
    default) and ?sort= ("-" first: descending). A bad column or sort is left out and said."""
    if "cols" in query:
        columns, errors = parse_columns(query["cols"])
        errors = [f"Columns: {error}" for error in errors]
    else:  # a saved pick that names a column gone since (a metric no longer logged) drops it quietly
        columns, errors = parse_columns(",".join(DEFAULT_COLUMNS if saved is None else saved))[0], []
    view = TableView(columns, errors=errors)
    sort = query.get("sort", DEFAULT_SORT).strip() or DEFAULT_SORT
    try:
        view.sort, view.descending = run_columns.column(sort.removeprefix("-")), sort.startswith("-")
    except UnknownColumn as err:
        view.errors.append(f"Sort: {err}; sorted newest first")
    view.group, errors = run_groups.parse_group(query.get("group", ""))
    view.errors += [f"Group: {error}; not grouped" for error in errors]
    return view


def saved_columns(user) -> list[str] | None:
    """The user's last pick (save_columns), None if they never picked; a stored value that is no
    list of ids (written by hand) reads as none."""
    saved = RunListColumns.objects.filter(user=user).values_list("columns", flat=True).first()
    return [item for item in saved if isinstance(item, str)] if isinstance(saved, list) else None


def save_columns(user, text: str) -> list[str]:
    """Keep the valid columns of "a,b,c" as `user`'s pick; returns their ids."""
    ids = [column.id for column in parse_columns(text)[0]]
    RunListColumns.objects.update_or_create(user=user, defaults={"columns": ids})
    return ids


def forget_columns(user) -> None:
    RunListColumns.objects.filter(user=user).delete()


def unknown_parameters(names: list[str]) -> str:
    """As the API says it (api.bodies.known_query): the closest known one for one, else them all."""
    shown = [name[:SHOWN_PARAMETER] for name in names][:MAX_REPORTED_ISSUES]
    known = list(QUERY_PARAMETERS)
    close = unknown_hint(shown[0], known, 0, "known query parameters") if len(shown) == 1 else (
        f"; known query parameters: {', '.join(known)}")
    return f"unknown query parameter{'s' * (len(shown) > 1)}: {', '.join(map(repr, shown))}{close}"


# ---- the page's links and picker -------------------------------------------------------------------


def _without(query, *names, where: str | None = None):
    params = query.copy()
    for name in ("page", *names):
        params.pop(name, None)
    if where is not None:
        kept = list(params.getlist("where"))
        kept.remove(where)
        params.setlist("where", kept)
    return params


def csv_query(query, filters, view: TableView) -> str:
    """The CSV's query for the page's view: its valid filters (the page left the others out), its
    columns and sort."""
    params = _without(query, "expand", "group", *filters.errors)
    params["cols"], params["sort"] = view.cols, view.sort_text
    if view.group:  # a bad ?group= the page left out is left out here too
        params["group"] = view.group_text
    return params.urlencode(safe=",/:")


def group_keys() -> list[str]:
    """What the Group box offers: the run's status, mode and owner, and every config key
    (run_groups.parse_group takes no other)."""
    return list(dict.fromkeys([*run_groups.RUN_KEYS, *run_columns.config_columns()]))


def where_chips(query) -> list[dict]:
    """Each ?where= sent, {text, remove: the query without it, bad: whether it was refused}."""
    return [{"text": text, "bad": not run_columns.is_condition(text),
             "remove": _without(query, where=text).urlencode(safe=",/:")}
            for text in query.getlist("where") if text.strip()]


def picker(view: TableView) -> list[dict]:
    """The column picker's groups, {title, items: [{id, label, help, checked}]}: the columns shown
    first, in their order (so that saving keeps it, and adds the newly ticked after them), then the
    run's own, the config's by section and the metrics by role, each offered as latest and best."""
    shown = {column.id for column in view.columns}

    def items(columns):
        return [{"id": c.id, "label": c.label, "help": c.help, "checked": c.id in shown} for c in columns]

    groups = [{"title": "Shown", "items": items(view.columns)},
              {"title": "Run", "items": items(c for c in run_columns.RUN_COLUMNS.values()
                                              if c != NAME and c.id not in shown)}]
    sections = {}
    for column in run_columns.config_columns().values():
        if column.id not in shown:
            section = column.id.split(".")[0] if "." in column.id else "run config"
            sections.setdefault(section, []).append(column)
    groups += [{"title": f"Config: {section}", "items": items(columns)} for section, columns in sections.items()]
    roles = {}
    for chart in view.offered:
        role, key = chart.split("/", 1)
        for summary in (run_columns.LATEST, run_columns.BEST, run_columns.MIN, run_columns.MAX):
            column = run_columns.metric_column(role, key, summary)
            if column.id not in shown:
                roles.setdefault(role, []).append(column)
    groups += [{"title": f"Metrics: {role}", "items": items(columns)} for role, columns in roles.items()]
    return [group for group in groups if group["items"]]


# ---- which metrics ---------------------------------------------------------------------------------


def offered_metrics(runs) -> list[str]:
    """The "role/key" of each number the newest PICKER_RUNS of `runs` log (their summaries), by role then key."""
    newest = runs.order_by("-created_at", "-pk").values("pk")[:PICKER_RUNS]
    charts = {f"{role}/{key}" for role, key in
              MetricSummary.objects.filter(run__in=newest).values_list("role", "key").distinct()}
    return sorted(charts, key=lambda chart: (queries.ROLE_ORDER.index(chart.split("/", 1)[0]), chart))


def unrecorded(view: TableView, conditions, offered: list[str]) -> list[str]:
    """Leave out of the view the metric columns that no run records (a typo: explorer/rewrd_mean),
    saying so with the closest one offered; a filter on one is said too (it matches no run)."""
    problems, checked = [], {}

    def recorded(column: Column) -> bool:
        chart = f"{column.role}/{column.key}"
        if chart not in offered and chart not in checked:
            checked[chart] = MetricSummary.objects.filter(role=column.role, key=column.key).exists()
        return chart in offered or checked[chart]

    def problem(column: Column, where: str) -> str:
        chart = f"{column.role}/{column.key}"
        return f"{where}: no run records {chart!r} as a number" + hint(chart, offered)

    for column in [c for c in view.columns if c.kind == METRIC and not recorded(c)]:
        view.columns.remove(column)
        problems.append(problem(column, "Columns"))
    if view.sort.kind == METRIC and not recorded(view.sort):
        problems.append(problem(view.sort, "Sort") + "; sorted newest first")
        view.sort, view.descending = run_columns.RUN_COLUMNS["created"], True
    problems += [problem(c.column, f"Filter {c.text!r}") for c in conditions
                 if c.column.kind == METRIC and not recorded(c.column)]
    return problems


@contextmanager
def without_jit():
    """Postgres plans the queries inside without JIT compilation. When a metric summary's subquery
    read every point of the run, the page's query cost past jit_optimize_above_cost and compiled
    for 260 ms of its 560 (a page sorted by a best, 200 runs × 2,000 steps). Read from the
    summaries it costs 4,754 at most (bench/runs_table.py's cases), a cost that grows with the
    runs listed and passes jit_above_cost (100,000) at some 4,000 of them. A list page is asked
    for once: there is no run long enough to win the compilation back."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
        yield


# ---- cells -----------------------------------------------------------------------------------------


def with_cells(runs, columns: list[Column]) -> list[Run]:
    """Runs with what the table shows of them: .progress, .latest_reward, .shown_status,
    .shown_tags (the name column's), and .columns_and_cells, (column, {text, title}) in order (the
    template draws the run's own columns from the run: None for them). One query for the metric
    columns of them all."""
    with without_jit():
        runs = list(runs)
        metrics = run_columns.metric_values(runs, columns)
    for run in runs:
        run.progress = queries.run_progress(run)
        run.latest_reward = queries.latest_reward(run)
        run.shown_status = waits.shown_status(run)
        run.shown_tags = shown_tags(run.tags)
        run.columns_and_cells = [(column, _cell(run, column, metrics.get(run.pk, {}))) for column in columns]
    return runs


def _cell(run: Run, column: Column, metrics: dict):
    if column.kind == RUN:
        return None
    if column.kind == CONFIG:
        text = run_columns.config_text(run_columns.config_value(run, column))
        if text is None and column.training_only and run.mode == Run.Mode.BENCH:
            return {"text": None, "title": f"{column.id}: none, {run_columns.NOT_TRAINED}"}
        return {"text": text, "title": f"{column.id}: {text}" if text is not None else ""}
    value = metrics.get(column.id)
    return {"text": None if value is None else comparison.short_number(value),
            "title": "" if value is None else f"{column.label}: {value!r}"}


# ---- CSV -------------------------------------------------------------------------------------------


def csv_header(columns: list[Column]) -> list[str]:
    return ["id", "name", "tags", *(column.id for column in columns)]


def csv_chunks(runs, columns: list[Column]):
    """The table as CSV, every run of `runs` (ordered) in CSV_CHUNK_RUNS at a time: id, name, tags
    (space-separated) and the columns, values as they are (numbers in full, a config value as
    YAML writes it, times in ISO 8601), empty where none. Progress is a fraction (0.25):
    "25/100" a spreadsheet takes for a date."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(csv_header(columns))
    yield buffer.getvalue()
    with without_jit():
        ids = list(runs.values_list("pk", flat=True))
    for start in range(0, len(ids), CSV_CHUNK_RUNS):
        chunk = ids[start:start + CSV_CHUNK_RUNS]
        found = queries.with_latest_explorer_metrics(Run.objects.filter(pk__in=chunk).select_related("owner"))
        found = found.in_bulk()
        listed = [found[pk] for pk in chunk if pk in found]  # one deleted meanwhile is left out
        with without_jit():
            metrics = run_columns.metric_values(listed, columns)
        buffer.seek(0)
        buffer.truncate()
        for run in listed:
            values = [_csv_value(run, column, metrics.get(run.pk, {})) for column in columns]
            writer.writerow([run.pk, comparison.safe_cell(run.name), " ".join(shown_tags(run.tags) or []),
                             *map(comparison.safe_cell, values)])
        yield buffer.getvalue()


def _csv_value(run: Run, column: Column, metrics: dict):
    """A cell's value; None, which csv writes as nothing, where the run has none."""
    if column.kind == METRIC:
        return metrics.get(column.id)
    if column.kind == CONFIG:
        return run_columns.config_text(run_columns.config_value(run, column))
    if column.id == "progress":
        fraction = queries.run_progress(run).fraction
        return None if fraction is None else round(fraction, 4)
    if column.id == "reward":
        return queries.latest_reward(run)
    if column.id == "owner":
        return run.owner.username
    if column.id == "created":
        return run.created_at.isoformat()
    if column.id == "status":
        return run.status
    return getattr(run, column.id)



# ---- grouped (?group=) -----------------------------------------------------------------------------


def groups(runs, view: TableView) -> list[run_groups.Group]:
    """The view's groups of `runs` (ordered by the view), sorted as the view says."""
    with without_jit():
        found = run_groups.grouped(runs, view.group, view.columns, view.sort)
    return run_groups.sort_groups(found, view.sort, view.descending)


def ungrouped(query) -> str:
    return _without(query, "group", "expand").urlencode(safe=",/:")


def group_links(query, groups_shown: list[run_groups.Group], view: TableView) -> None:
    """Each group's .expand (the query opening it, or closing it where it is open), .is_open, and
    .listed (the list of its runs alone: not grouped, a filter for each key; None for "(not set)")."""
    open_token = query.get("expand")
    for group in groups_shown:
        group.is_open = group.token == open_token
        params = _without(query, "expand")
        if not group.is_open:
            params["expand"] = group.token
        group.expand = params.urlencode(safe=",/:")
        filters = group.filters(view.group)
        if filters is None:
            group.listed = None
            continue
        params = _without(query, "expand", "group")
        for name, value in filters:
            if name == "where":
                params.appendlist(name, value)
            else:  # the group's own status or owner: the filters' one, if any, is the same
                params[name] = value
        group.listed = params.urlencode(safe=",/:")


def expanded(query, found: list[run_groups.Group], view: TableView, most: int):
    """(the group ?expand= opens, its first `most` runs with their cells), (None, []) if none is
    asked; a token naming no group of the view is said in the view's errors."""
    token = query.get("expand")
    if not token:
        return None, []
    group = next((group for group in found if group.token == token), None)
    if group is None:
        view.errors.append(f"Expand: no group {token[:100]!r} in this view")
        return None, []
    ids = group.runs[:most]
    listed = queries.with_latest_explorer_metrics(Run.objects.filter(pk__in=ids).select_related("owner")).in_bulk()
    return group, with_cells([listed[pk] for pk in ids if pk in listed], view.columns)


def groups_csv(found: list[run_groups.Group], view: TableView):
    """The grouped view as CSV: each key's value (empty: not set), the runs, then per column its
    mean, std, min and max for a number, else what the group's cell says."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    header = [*(key.id for key in view.group), "runs"]
    for column in view.columns:
        header += [f"{column.id} {figure}" for figure in run_groups.FIGURES] if column.numeric else [column.id]
    writer.writerow(header)
    for group in found:
        row = [*("" if value is None else run_columns.config_text(value) for value in group.values), len(group.runs)]
        for column, cell in group.cells:
            figures = [cell[figure] for figure in run_groups.FIGURES] if column.numeric else None
            row += figures or [cell.get("csv", cell["text"])]  # a time as the list's CSV writes it
        writer.writerow([comparison.safe_cell(value) for value in row])
    yield buffer.getvalue()
