import pytest

from apps.tasksets.models import Task, Taskset
from apps.tasksets.store import DjangoTaskSource

pytestmark = pytest.mark.django_db


def test_mark_sampled_counts_every_draw():
    taskset = Taskset.objects.create(name="t", task_count=4)
    rows = Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", answer="a") for i in range(4))
    source = DjangoTaskSource(taskset)
    source.mark_sampled([rows[0].pk, rows[1].pk, rows[2].pk])
    source.mark_sampled([rows[0].pk, rows[0].pk, rows[3].pk])  # a task drawn twice in one step
    counts = dict(Task.objects.values_list("index", "times_sampled"))
    assert counts == {0: 3, 1: 1, 2: 1, 3: 1}


def test_an_explorer_without_a_task_pipeline_picks_from_the_keys_what_it_picked_from_the_rows():
    """select_tasks reads every task's (id, priority, times_sampled), then its batch's rows: the
    batch is the one it picked when it read every row (first_tasks over either)."""
    from workers.rft.experience import TaskKey
    from workers.rft.explorer import first_tasks

    taskset = Taskset.objects.create(name="t", task_count=40)
    rows = Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=f"q{i}", answer="a", priority=float(i % 3 == 0), times_sampled=i % 4)
        for i in range(40)
    )
    source = DjangoTaskSource(taskset)
    assert sorted(source.task_keys()) == sorted(TaskKey(r.pk, r.priority, r.times_sampled) for r in rows)
    by_rows = [task.id for task in first_tasks(source.tasks(), 7, 8)]
    by_keys = [task.id for task in source.tasks_with_ids([key.id for key in first_tasks(source.task_keys(), 7, 8)])]
    assert by_keys == by_rows and len(by_rows) == 8
