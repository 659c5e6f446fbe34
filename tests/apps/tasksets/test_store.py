import pytest
from django.contrib.auth import get_user_model

from apps.runs.models import Run
from apps.tasksets.models import Task, TaskDraw, Taskset
from apps.tasksets.store import DjangoTaskSource
from workers.rft.experience import Task as EngineTask

pytestmark = pytest.mark.django_db


def a_run(name="r"):
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    return Run.objects.create(name=name, owner=owner, config={})


def test_mark_sampled_counts_every_draw():
    taskset = Taskset.objects.create(name="t", task_count=4)
    rows = Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", answer="a") for i in range(4))
    run = a_run()
    source = DjangoTaskSource(taskset, run.pk)
    source.mark_sampled([rows[0].pk, rows[1].pk, rows[2].pk])
    source.mark_sampled([rows[0].pk, rows[0].pk, rows[3].pk])  # a task drawn twice in one step
    counts = {task.id: task.times_sampled for task in source.tasks()}
    assert counts == {rows[0].pk: 3, rows[1].pk: 1, rows[2].pk: 1, rows[3].pk: 1}


def test_two_runs_on_one_taskset_keep_their_own_draws_and_synthetic_tasks():
    """A sweep's runs differ in the swept key only: each draws as it would alone. Draws were a
    count on the task (the second of two runs started from the first one's picks), and a
    synthetic task joined the taskset for every run and its curator."""
    from workers.rft.task_selectors import first_tasks

    taskset = Taskset.objects.create(name="t", task_count=10)
    Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", answer="a") for i in range(10))
    first, second = DjangoTaskSource(taskset, a_run("a").pk), DjangoTaskSource(taskset, a_run("b").pk)
    picked = [task.id for task in first_tasks(first.task_keys(), 0, 4)]
    first.mark_sampled(picked)
    assert [task.id for task in first_tasks(second.task_keys(), 0, 4)] == picked  # not moved by the first run
    assert [task.id for task in first_tasks(first.task_keys(), 0, 4)] != picked

    (made,) = first.add_tasks([EngineTask(None, "q10 harder", "b", {"harder_variant_of": picked[0]})])
    assert made.id in {task.id for task in first.tasks()}
    assert made.id not in {task.id for task in second.tasks()} | {key.id for key in second.task_keys()}
    assert list(taskset.own_tasks.values_list("index", flat=True)) == list(range(10))
    assert Taskset.objects.get(pk=taskset.pk).task_count == 10

    eval_source = DjangoTaskSource(taskset)  # no run: the taskset's own tasks, undrawn
    assert len(eval_source.tasks()) == 10 and {task.times_sampled for task in eval_source.tasks()} == {0}
    with pytest.raises(ValueError, match="only a run's task source counts draws"):
        eval_source.mark_sampled(picked)

    Run.objects.filter(name="a").delete()  # its draws and its tasks go with it
    assert not TaskDraw.objects.filter(task__taskset=taskset, run__name="a").exists()
    assert Task.objects.filter(taskset=taskset).count() == 10


def test_an_explorer_without_a_task_pipeline_picks_from_the_keys_what_it_picked_from_the_rows():
    """select_tasks reads every task's (id, priority, times_sampled), then its batch's rows: the
    batch is the one it picked when it read every row (first_tasks over either)."""
    from workers.rft.experience import TaskKey
    from workers.rft.task_selectors import first_tasks

    taskset = Taskset.objects.create(name="t", task_count=40)
    rows = Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=f"q{i}", answer="a", priority=float(i % 3 == 0)) for i in range(40)
    )
    run = a_run()
    TaskDraw.objects.bulk_create(TaskDraw(run=run, task=r, count=r.index % 4) for r in rows if r.index % 4)
    source = DjangoTaskSource(taskset, run.pk)
    assert sorted(source.task_keys()) == sorted(TaskKey(r.pk, r.priority, r.index % 4) for r in rows)
    by_rows = [task.id for task in first_tasks(source.tasks(), 7, 8)]
    by_keys = [task.id for task in source.tasks_with_ids([key.id for key in first_tasks(source.task_keys(), 7, 8)])]
    assert by_keys == by_rows and len(by_rows) == 8
