"""Each run's summary of its metrics, as W&B keeps a run's summary: for each role and metric key,
the latest value and its step, the lowest and the highest (MetricSummary), folded in as each point
is written (services.record_metrics, system.record) so that the runs table sorts, filters and shows
them without reading the points. Sorting 200 runs of 2,000 steps by a best read all 808,200 of
their points: 1,118-1,278 ms a page, 102-110 ms from the summaries (docs/runs-list.md).

A key is named as the charts and the table's columns name it after the role: "reward_mean", and
"reward/mean" whether the point holds it flat or nested (run_columns.metric_paths, the flat layout
first where a point has both). Only numbers count; text, booleans and nulls do not.

"Latest" is the value at the highest step that has the key, as the points say it. A trainer that
goes back to its checkpoint (a resume, a hand-over) deletes the points of the steps it lost
(DjangoMetricSink.rewind, through forget), so its summaries go back with it; it then writes those
steps again as new. A point written again (an explorer's or eval step replayed, a duty's second
merged) replaces its old values: a key whose old value was the lowest or the highest, or which the
latest point no longer holds, is summed up again from the points (recompute); the others are folded
in as a new point's are. Points deleted otherwise (the admin) are summed up again the same way.
"""

import json
import math

from django.db import connection, transaction
from django.db.models import Max, Min

from .models import MetricPoint, MetricSummary
from .run_columns import METRIC_KEY, leaves, metric_number, metric_paths

# Rows a statement of rebuild's bulk_create writes (7 parameters each: SQLite takes 32,766).
BATCH = 1000


def numbers(values: dict) -> dict[str, float]:
    """{key: number} of a point's values, nested ones under "a/b": what its summaries are made of."""
    found = {}  # key: (rank of its layout in metric_paths, number)
    for path, value in leaves(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            continue
        key = "/".join(path)
        if not METRIC_KEY.fullmatch(key):  # what no column can name
            continue
        if len(path) == 1:
            rank = 0  # flat: metric_paths' first
        elif path in (paths := metric_paths(key)):
            rank = paths.index(path)
        else:  # partly nested past run_columns.SPLIT_SLASHES: a layout the table never looked up
            continue
        if key not in found or rank < found[key][0]:
            found[key] = (rank, float(value))
    return {key: number for key, (_, number) in found.items()}


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        return False


def record(run_id: int, role: str, step: int, values: dict, replaced: dict | None = None) -> None:
    """Fold the point just written at `step` into the run's summaries of `role`: `values` what it
    holds now, `replaced` what it held before (None: a new point). Inside the point's transaction."""
    new = numbers(values)
    old = numbers(replaced) if replaced else {}
    # A key the point no longer holds is folded in with its old value: its row, which holds that
    # value already, does not change, but the one upsert locks every row this touches in key order,
    # as another writer's fold of the role does (two explorers): neither waits on the other in a circle.
    fold(run_id, role, step, {**old, **new})
    changed = {key: value for key, value in old.items() if new.get(key) != value}
    if changed:  # an old value that is still the lowest or highest, or the latest gone: summed up again
        rows = MetricSummary.objects.filter(run_id=run_id, role=role, key__in=changed)
        recompute(run_id, role, sorted(row.key for row in rows if changed[row.key] in (row.min, row.max) or (
            row.key not in new and row.latest_step == step)))


def fold(run_id: int, role: str, step: int, new: dict[str, float]) -> None:
    """One upsert: each key's row made from this value, or kept with it folded in. It takes the
    rows in key order, so two writers of the same keys never wait on each other in a circle."""
    if not new:
        return
    table, quote = MetricSummary._meta.db_table, connection.ops.quote_name
    latest, latest_step, low, high, key = map(quote, ("latest", "latest_step", "min", "max", "key"))
    newer = f"excluded.{latest_step} >= {table}.{latest_step}"
    update = (f"{latest} = CASE WHEN {newer} THEN excluded.{latest} ELSE {table}.{latest} END, "
              f"{latest_step} = CASE WHEN {newer} THEN excluded.{latest_step} ELSE {table}.{latest_step} END, "
              f"{low} = CASE WHEN excluded.{low} < {table}.{low} THEN excluded.{low} ELSE {table}.{low} END, "
              f"{high} = CASE WHEN excluded.{high} > {table}.{high} THEN excluded.{high} ELSE {table}.{high} END")
    if connection.vendor == "postgresql":
        # Two arrays: 30 rows of VALUES were 210 parameters, past the 50 of a statement psycopg keeps
        # parsed, and parsing it again each step took 1.75 ms of client time where this takes 1.2.
        given, params = "unnest(%s::text[], %s::float8[]) AS given(k, v)", [list(new), list(new.values())]
    else:
        given, params = "(SELECT key AS k, value AS v FROM json_each(%s)) AS given", [json.dumps(new)]
    with connection.cursor() as cursor:
        # "WHERE true": SQLite reads an upsert's SELECT that ends in FROM as a join's ON otherwise.
        cursor.execute(f"INSERT INTO {table} (run_id, role, {key}, {latest}, {latest_step}, {low}, {high}) "
                       f"SELECT %s, %s, given.k, given.v, %s, given.v, given.v FROM {given} WHERE true "
                       f"ORDER BY given.k ON CONFLICT (role, {key}, run_id) DO UPDATE SET {update}",
                       [run_id, role, step, *params])


def recompute(run_id: int, role: str, keys) -> None:
    """The summaries of `keys` made again from the run's points of the role; a key no point holds any
    more loses its summary. One read of every point for the lowest and highest of them all, then
    the points from the newest back until each key's latest is found (the newest holds them all,
    as a rule): for rewritten or deleted points, never a step's write."""
    keys = list(keys)
    if not keys:
        return
    points = MetricPoint.objects.filter(run_id=run_id, role=role)
    numbers_at = [metric_number(key) for key in keys]
    extremes = points.aggregate(**{f"low{index}": Min(number) for index, number in enumerate(numbers_at)},
                                **{f"high{index}": Max(number) for index, number in enumerate(numbers_at)})
    held = {key: (extremes[f"low{index}"], extremes[f"high{index}"]) for index, key in enumerate(keys)}
    summaries = MetricSummary.objects.filter(run_id=run_id, role=role)
    summaries.filter(key__in=[key for key, (low, _) in held.items() if low is None]).delete()
    wanted = {key for key, (low, _) in held.items() if low is not None}
    for step, values in points.order_by("-step").values_list("step", "values").iterator(chunk_size=50):
        if not wanted:
            break
        for key, value in numbers(values).items():
            if key in wanted:
                wanted.discard(key)
                low, high = held[key]
                summaries.filter(key=key).update(latest=value, latest_step=step, min=low, max=high)


def forget(points) -> int:
    """Delete metric points (a queryset: the admin's, or a rewound trainer's) and make the summaries
    of their runs' roles true again; returns the points deleted. The rows are summed up again once
    locked (in key order, as record locks them): a point written meanwhile is either in what is
    summed up or folded in after it."""
    with transaction.atomic():
        touched = sorted(set(points.order_by().values_list("run_id", "role").distinct()))
        deleted, _ = points.delete()
        for run_id, role in touched:
            rows = MetricSummary.objects.select_for_update().filter(run_id=run_id, role=role).order_by("key")
            recompute(run_id, role, list(rows.values_list("key", flat=True)))
    return deleted


def rebuild(point_model, summary_model, run_ids=None, chunk: int = 2000) -> int:
    """Every summary of the runs (all of them with run_ids None) made again from their points, read
    in order a chunk at a time; returns the summaries written. The models are arguments so that
    the data migration passes its historical ones."""
    points = point_model.objects.all() if run_ids is None else point_model.objects.filter(run_id__in=run_ids)
    summary_model.objects.filter(**({} if run_ids is None else {"run_id__in": run_ids})).delete()
    written, current, summaries = 0, None, {}

    def flush():
        run_id, role = current
        summary_model.objects.bulk_create(
            [summary_model(run_id=run_id, role=role, key=key, latest=latest, latest_step=step, min=low, max=high)
             for key, (latest, step, low, high) in summaries.items()], batch_size=BATCH)
        return len(summaries)

    rows = points.order_by("run_id", "role", "step").values_list("run_id", "role", "step", "values")
    for run_id, role, step, values in rows.iterator(chunk_size=chunk):
        if (run_id, role) != current:
            written += flush() if current else 0
            current, summaries = (run_id, role), {}
        for key, value in numbers(values).items():
            _, _, low, high = summaries.get(key, (value, step, value, value))
            summaries[key] = (value, step, min(low, value), max(high, value))  # steps come in order: latest
    written += flush() if current else 0
    return written
