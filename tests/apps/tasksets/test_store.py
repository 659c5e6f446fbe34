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
