"""The engine's TaskSource protocol (workers/rft/protocols.py) over one Taskset in Postgres."""
from collections.abc import Sequence

from django.db import transaction
from django.db.models import F, Max

from workers.rft.experience import Task, TaskKey

from .models import Task as TaskRow
from .models import Taskset


def to_task(row: TaskRow) -> Task:
    return Task(id=row.pk, prompt=row.prompt, answer=row.answer, metadata=row.metadata,
                difficulty=row.difficulty, priority=row.priority, times_sampled=row.times_sampled)


class DjangoTaskSource:
    def __init__(self, taskset: Taskset):
        self.taskset = taskset

    def tasks(self) -> list[Task]:
        return [to_task(row) for row in TaskRow.objects.filter(taskset=self.taskset).order_by("index")]

    def task_keys(self) -> list[TaskKey]:
        rows = TaskRow.objects.filter(taskset=self.taskset).values_list("pk", "priority", "times_sampled")
        return [TaskKey(*row) for row in rows]

    def tasks_with_ids(self, task_ids: Sequence[int]) -> list[Task]:
        rows = TaskRow.objects.in_bulk(list(task_ids))
        return [to_task(rows[task_id]) for task_id in task_ids]

    def mark_sampled(self, task_ids: Sequence[int]) -> None:
        counts: dict[int, int] = {}
        for task_id in task_ids:
            counts[task_id] = counts.get(task_id, 0) + 1
        # One UPDATE per distinct count (usually one: each task of a step is drawn once).
        by_count: dict[int, list[int]] = {}
        for task_id, count in counts.items():
            by_count.setdefault(count, []).append(task_id)
        with transaction.atomic():
            for count, ids in by_count.items():
                TaskRow.objects.filter(pk__in=ids).update(times_sampled=F("times_sampled") + count)

    def add_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        with transaction.atomic():
            taskset = Taskset.objects.select_for_update().get(pk=self.taskset.pk)
            start = (TaskRow.objects.filter(taskset=taskset).aggregate(m=Max("index"))["m"] or -1) + 1
            rows = TaskRow.objects.bulk_create(
                TaskRow(taskset=taskset, index=start + i, prompt=t.prompt, answer=t.answer, metadata=t.metadata,
                        difficulty=t.difficulty, priority=t.priority)
                for i, t in enumerate(tasks)
            )
            Taskset.objects.filter(pk=taskset.pk).update(task_count=F("task_count") + len(rows))
        return [to_task(row) for row in rows]
