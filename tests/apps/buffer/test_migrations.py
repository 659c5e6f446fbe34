"""Data migrations of the buffer, run backwards and forwards on real rows."""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.runs.models import Run

BEFORE, AFTER = ("buffer", "0004_experience_sample_order"), ("buffer", "0005_experience_arrays_aligned")


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    return executor.loader.project_state([target]).apps


@pytest.mark.django_db(transaction=True)
def test_arrays_are_aligned_for_the_engine(researcher):
    old = migrate(BEFORE)
    Experience = old.get_model("buffer", "Experience")
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")  # runs stays migrated
    common = {"run_id": run.pk, "prompt_ids": [1], "response_ids": [5, 6, 7]}
    edit = Experience.objects.create(source="human_edit", action_mask=[1, 1, 1], logprobs=[], rollout_index=0, **common)
    imported = Experience.objects.create(source="expert", action_mask=None, rollout_index=1, **common)
    rollout = Experience.objects.create(source="rollout", action_mask=[1, 0, 1], logprobs=[-1.0, -2.0, -3.0],
                                        rollout_index=2, **common)
    try:
        new = migrate(AFTER).get_model("buffer", "Experience")
        rows = {row.pk: row for row in new.objects.all()}
        assert rows[edit.pk].logprobs is None
        assert rows[imported.pk].action_mask == [1, 1, 1]
        assert (rows[rollout.pk].action_mask, rows[rollout.pk].logprobs) == ([1, 0, 1], [-1.0, -2.0, -3.0])
    finally:
        leaf = max(name for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes() if app == "buffer")
        migrate(("buffer", leaf))
