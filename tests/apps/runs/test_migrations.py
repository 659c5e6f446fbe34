"""Data migrations of the runs app, run backwards and forwards on real rows."""
import pytest
from django.db import connection

from tests.support import migrate_to, migrate_to_newest

BEFORE, AFTER = ("runs", "0019_run_list_columns"), ("runs", "0020_metric_summaries")


@pytest.mark.django_db(transaction=True)
def test_the_runs_there_are_get_the_summaries_of_their_points(researcher):
    old = migrate_to(BEFORE)
    Run, MetricPoint = old.get_model("runs", "Run"), old.get_model("runs", "MetricPoint")
    run = Run.objects.create(name="r", owner_id=researcher.pk, config={})
    silent = Run.objects.create(name="silent", owner_id=researcher.pk, config={})
    for step, loss in ((1, 0.9), (2, 0.2), (3, 0.5)):
        MetricPoint.objects.create(run=run, role="trainer", step=step, values={"loss": loss, "note": "x"})
    MetricPoint.objects.create(run=run, role="explorer", step=2, values={"reward": {"mean": 0.7}, "done": True})
    MetricPoint.objects.create(run=run, role="explorer", step=1, values={"reward": {"mean": 0.1}})  # written late
    try:
        summaries = migrate_to(AFTER).get_model("runs", "MetricSummary").objects
        rows = {(row.role, row.key): (row.latest, row.latest_step, row.min, row.max)
                for row in summaries.filter(run_id=run.pk)}
        assert rows == {("trainer", "loss"): (0.5, 3, 0.2, 0.9), ("explorer", "reward/mean"): (0.7, 2, 0.1, 0.7)}
        assert not summaries.filter(run_id=silent.pk).exists()
        migrate_to(BEFORE)  # back: the table goes, the points stay
        assert "runs_metricsummary" not in connection.introspection.table_names()
        assert MetricPoint.objects.filter(run=run).count() == 5
    finally:
        migrate_to_newest()
