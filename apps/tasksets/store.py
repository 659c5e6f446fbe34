"""The engine's TaskSource protocol (workers/rft/protocols.py) over one Taskset, as one run sees it."""
from collections.abc import Mapping, Sequence

from django.db import connection, transaction
from django.db.models import Max, Q

from workers.rft.experience import Task, TaskKey, TaskStats

from .models import Task as TaskRow
from .models import TaskDraw, Taskset

STATS_COLUMNS = ("task_id", "successes", "failures", "seen_step", "solved_streak")


def to_task(row: TaskRow, draws: dict[int, int] | None = None, stats: dict[int, TaskStats] | None = None) -> Task:
    """The engine's Task of a row; `draws`, `stats`: a run's count of draws and TaskStats by task id
    (none: never drawn, nothing learned)."""
    return Task(id=row.pk, prompt=row.prompt, answer=row.answer, metadata=row.metadata, difficulty=row.difficulty,
                priority=row.priority, times_sampled=(draws or {}).get(row.pk, 0), stats=(stats or {}).get(row.pk))


class DjangoTaskSource:
    """The taskset's own tasks and those `run_id`'s pipeline made, with that run's draws (TaskDraw).
    run_id None: the taskset's own tasks, never drawn (eval and expert data)."""

    def __init__(self, taskset: Taskset, run_id: int | None = None):
        self.taskset = taskset
        self.run_id = run_id

    def _rows(self):
        return TaskRow.objects.filter(Q(run=None) | Q(run_id=self.run_id), taskset=self.taskset)

    def _run_draws(self, task_ids: Sequence[int] | None = None):
        draws = TaskDraw.objects.filter(run_id=self.run_id, task__taskset=self.taskset)
        return draws if task_ids is None else draws.filter(task_id__in=list(task_ids))

    def _draws(self, task_ids: Sequence[int] | None = None) -> dict[int, int]:
        if self.run_id is None:
            return {}
        return dict(self._run_draws(task_ids).values_list("task_id", "count"))

    def _stats(self, task_ids: Sequence[int] | None = None) -> dict[int, TaskStats]:
        """What the run's selector learned, of the tasks it learned something of. A query of its
        own, which the default selector's pick does not make: at 90,000 drawn tasks, the keys took
        0.17 s on Postgres (0.13 SQLite) without the stats, 0.35 (0.27) with them; read with
        every draw, as dataclasses, they took 0.6."""
        if self.run_id is None:
            return {}
        learned = self._run_draws(task_ids).filter(seen_step__isnull=False).values_list(*STATS_COLUMNS)
        return {task_id: TaskStats(successes, failures, seen_step, streak)
                for task_id, successes, failures, seen_step, streak in learned}

    def _runs_own(self, what: str) -> None:
        if self.run_id is None:
            raise ValueError(f"only a run's task source {what}: taskset {self.taskset.name!r} has none")

    def tasks(self) -> list[Task]:
        draws, stats = self._draws(), self._stats()
        return [to_task(row, draws, stats) for row in self._rows().order_by("index")]

    def task_keys(self, with_stats: bool = False) -> list[TaskKey]:
        draws, stats = self._draws(), self._stats() if with_stats else {}
        rows = self._rows().order_by("index").values_list("pk", "priority")
        return [TaskKey(pk, priority, draws.get(pk, 0), stats.get(pk)) for pk, priority in rows]

    def tasks_with_ids(self, task_ids: Sequence[int]) -> list[Task]:
        rows, draws, stats = self._rows().in_bulk(list(task_ids)), self._draws(task_ids), self._stats(task_ids)
        return [to_task(rows[task_id], draws, stats) for task_id in task_ids]

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

    def count_solved(self, streak: int) -> int:
        """A count, once a step: at 90,000 drawn tasks 0.05 s on Postgres (0.07 SQLite), where the
        step's pick read their keys and stats in 1.7 s (2.9) on the same loaded 2-core machine."""
        if self.run_id is None:
            return 0
        return self._run_draws().filter(solved_streak__gte=streak).count()

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
