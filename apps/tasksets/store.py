"""The engine's TaskSource protocol (workers/rft/protocols.py) over one Taskset, as one run sees it."""
from collections.abc import Mapping, Sequence

from django.db import connection, transaction
from django.db.models import Max, Q

from workers.rft.experience import Task, TaskKey, TaskStats

from .models import Task as TaskRow
from .models import TaskDraw, Taskset

NEVER_DRAWN = (0, None)
DRAW_COLUMNS = ("task_id", "count", "successes", "failures", "seen_step", "solved_streak")


def to_task(row: TaskRow, draws: dict[int, tuple] | None = None) -> Task:
    """The engine's Task of a row; `draws`: a run's (count, stats) by task id (none: never drawn)."""
    count, stats = (draws or {}).get(row.pk, NEVER_DRAWN)
    return Task(id=row.pk, prompt=row.prompt, answer=row.answer, metadata=row.metadata,
                difficulty=row.difficulty, priority=row.priority, times_sampled=count, stats=stats)


class DjangoTaskSource:
    """The taskset's own tasks and those `run_id`'s pipeline made, with that run's draws (TaskDraw).
    run_id None: the taskset's own tasks, never drawn (eval and expert data)."""

    def __init__(self, taskset: Taskset, run_id: int | None = None):
        self.taskset = taskset
        self.run_id = run_id

    def _rows(self):
        return TaskRow.objects.filter(Q(run=None) | Q(run_id=self.run_id), taskset=self.taskset)

    def _draws(self, task_ids: Sequence[int] | None = None) -> dict[int, tuple[int, TaskStats | None]]:
        """The run's (count, stats) by task id, of the tasks it drew."""
        if self.run_id is None:
            return {}
        draws = TaskDraw.objects.filter(run_id=self.run_id, task__taskset=self.taskset)
        if task_ids is not None:
            draws = draws.filter(task_id__in=list(task_ids))
        return {
            task_id: (count, None if seen_step is None else TaskStats(successes, failures, seen_step, streak))
            for task_id, count, successes, failures, seen_step, streak in draws.values_list(*DRAW_COLUMNS)
        }

    def _runs_own(self, what: str) -> None:
        if self.run_id is None:
            raise ValueError(f"only a run's task source {what}: taskset {self.taskset.name!r} has none")

    def tasks(self) -> list[Task]:
        draws = self._draws()
        return [to_task(row, draws) for row in self._rows().order_by("index")]

    def task_keys(self) -> list[TaskKey]:
        draws = self._draws()
        rows = self._rows().order_by("index").values_list("pk", "priority")
        return [TaskKey(pk, priority, *draws.get(pk, NEVER_DRAWN)) for pk, priority in rows]

    def tasks_with_ids(self, task_ids: Sequence[int]) -> list[Task]:
        rows, draws = self._rows().in_bulk(list(task_ids)), self._draws(task_ids)
        return [to_task(rows[task_id], draws) for task_id in task_ids]

    def mark_sampled(self, task_ids: Sequence[int], stats: Mapping[int, TaskStats] | None = None) -> None:
        self._runs_own("counts draws")
        stats = stats or {}
        counts: dict[int, int] = {}
        for task_id in task_ids:
            counts[task_id] = counts.get(task_id, 0) + 1
        # Upserts, the same on Postgres and SQLite: the run's explorers may finish steps at once.
        # A task without new stats keeps its own; every column is named (the model's defaults are
        # Django's, not the table's).
        table, count = TaskDraw._meta.db_table, connection.ops.quote_name("count")
        insert = f"INSERT INTO {table} (run_id, task_id, {count}, successes, failures, seen_step, solved_streak) "
        conflict = f"ON CONFLICT (run_id, task_id) DO UPDATE SET {count} = {table}.{count} + excluded.{count}"
        counted = [(self.run_id, task_id, n) for task_id, n in counts.items() if task_id not in stats]
        learned = [(self.run_id, task_id, counts.get(task_id, 0), s.successes, s.failures, s.seen_step,
                    s.solved_streak) for task_id, s in stats.items()]
        with transaction.atomic(), connection.cursor() as cursor:
            if counted:
                cursor.executemany(f"{insert} VALUES (%s, %s, %s, 0, 0, NULL, 0) {conflict}", counted)
            if learned:
                cursor.executemany(
                    f"{insert} VALUES (%s, %s, %s, %s, %s, %s, %s) {conflict}, successes = excluded.successes, "
                    "failures = excluded.failures, seen_step = excluded.seen_step, "
                    "solved_streak = excluded.solved_streak",
                    learned,
                )

    def add_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        """The run's own: the taskset and other runs do not see them."""
        self._runs_own("adds tasks")
        with transaction.atomic():
            taskset = Taskset.objects.select_for_update().get(pk=self.taskset.pk)  # one index at a time
            start = (TaskRow.objects.filter(taskset=taskset).aggregate(m=Max("index"))["m"] or -1) + 1
            rows = TaskRow.objects.bulk_create(
                TaskRow(taskset=taskset, run_id=self.run_id, index=start + i, prompt=t.prompt, answer=t.answer,
                        metadata=t.metadata, difficulty=t.difficulty, priority=t.priority)
                for i, t in enumerate(tasks)
            )
        return [to_task(row) for row in rows]
