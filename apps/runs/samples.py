"""The compare page's samples panel (issue #44, item 3): for a chosen task, what each compared run
wrote at a chosen explorer step, side by side. Runs of one taskset and seed (a sweep's) pick the
same tasks at the same steps; where a run did not roll the task out at that step, its nearest
step that did is shown, and says so."""

from dataclasses import dataclass, field

from django.db.models import Max

from apps.buffer.models import Experience

from .models import Run

SHOWN_ROLLOUTS = 16  # of a group, per run
TASK_CHOICES = 100
WINDOWS = (0, 8, 64, 512, None)  # steps either side searched for the task, widening: the index is (run, step)


@dataclass
class Column:
    run: Run
    step: int | None = None  # the step shown: the one asked for, or the nearest with the task
    rollouts: list = field(default_factory=list)


def rollouts(run: Run):
    return Experience.objects.filter(run=run, source=Experience.Source.ROLLOUT)


def default_step(runs: list[Run]) -> int:
    """The last explorer step every run reached (their rollouts' latest, the least of those)."""
    lasts = [rollouts(run).aggregate(last=Max("explorer_step"))["last"] for run in runs]
    return min((last for last in lasts if last is not None), default=0)


def task_choices(runs: list[Run], step: int) -> list[tuple[int, str]]:
    """(task id, prompt) of the tasks the runs rolled out at `step` (the first run's first), for the picker."""
    seen = {}
    for run in runs:
        rows = rollouts(run).filter(explorer_step=step, task__isnull=False).order_by("task_id")
        for task_id, prompt in rows.values_list("task_id", "prompt_text").distinct()[:TASK_CHOICES]:
            seen.setdefault(task_id, prompt)
        if len(seen) >= TASK_CHOICES:
            break
    return list(seen.items())[:TASK_CHOICES]


def columns(runs: list[Run], task_id: int, step: int) -> list[Column]:
    return [_column(run, task_id, step) for run in runs]


def _column(run: Run, task_id: int, step: int) -> Column:
    of_task = rollouts(run).filter(task_id=task_id)
    for window in WINDOWS:
        near = of_task if window is None else of_task.filter(explorer_step__gte=max(step - window, 0),
                                                             explorer_step__lte=step + window)
        steps = sorted(set(near.values_list("explorer_step", flat=True)), key=lambda s: (abs(s - step), s))
        if steps:
            rows = of_task.filter(explorer_step=steps[0]).order_by("rollout_index")[:SHOWN_ROLLOUTS]
            return Column(run, steps[0], list(rows.values("rollout_index", "response_text", "reward", "model_version")))
    return Column(run)
