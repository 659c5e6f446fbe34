"""Counts that stay fast on big tables, for the admin's changelists.

Postgres counts by visiting every matching row, so "N results" over a million experiences costs
seconds on every page view. A changelist counts exactly up to EXACT_COUNT_LIMIT rows (stopping
there, so that costs at most that many rows); past it, the planner's row estimate serves, and the
page says "about".
"""

import json

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

EXACT_COUNT_LIMIT = 10_000


def planner_estimate(queryset) -> int | None:
    """How many rows Postgres expects the queryset to return (None on other databases)."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """A paginator whose count is exact up to EXACT_COUNT_LIMIT and the planner's estimate beyond
    (`estimated` is then True, and `count_prefix` says "about"). Where the estimate is at or below
    the limit (statistics older than the rows: a run wrote them since the last ANALYZE) all we
    know is that there are more: "more than 10,000" (it said "about 10001"). Pages past the real
    end are simply empty."""

    estimated = False
    count_prefix = ""

    @cached_property
    def count(self) -> int:
        capped = self.object_list.order_by().values("pk")[: EXACT_COUNT_LIMIT + 1].count()
        if capped <= EXACT_COUNT_LIMIT:
            return capped
        estimate = planner_estimate(self.object_list)
        if estimate is None:
            return super().count
        self.estimated = True
        if estimate <= EXACT_COUNT_LIMIT:
            self.count_prefix = "more than "
            return EXACT_COUNT_LIMIT
        self.count_prefix = "about "
        return estimate
