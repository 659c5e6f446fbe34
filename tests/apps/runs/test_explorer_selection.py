"""A learning task selector (buffer.task_selector difficulty_based) with explorers that share each
step (store.DjangoStepClaims), on this run's database: the run draws the batches, learns the
stats and logs the selector's metrics that one explorer alone does. The engine and reward are
tests/workers/rft/test_task_selectors.py's stand-in, whose tasks pass at known rates; the selection,
claims and stores are the product's."""
import pytest
from django.utils import timezone

from apps.buffer.models import Experience as ExperienceRow
from apps.buffer.store import DjangoExperienceBuffer
from apps.runs.models import ExplorerStep, MetricPoint, Run
from apps.runs.store import DjangoMetricSink, DjangoStepClaims
from apps.tasksets.models import Task, TaskDraw, Taskset
from apps.tasksets.store import DjangoTaskSource
from tests.workers.rft.conftest import make_config
from tests.workers.rft.test_task_selectors import RATES, KnownRates
from workers.rft.explorer import Explorer

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host:1", "host:2"
STEPS = 10
CONFIG = make_config(explorer={"batch_size": 6}, algorithm={"repeat_times": 8},
                     buffer={"task_selector": {"name": "difficulty_based", "retire_after": 1}})


@pytest.fixture
def taskset():
    taskset = Taskset.objects.create(name="rates", task_count=24)
    Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", metadata={"rate": RATES[i % len(RATES)]})
                             for i in range(24))
    return taskset


def explorer(run, taskset, duty: str, worker: str | None) -> Explorer:
    claims = DjangoStepClaims(run, worker, duty) if worker else None
    return Explorer(CONFIG, KnownRates(), DjangoTaskSource(taskset, run.pk), DjangoExperienceBuffer(run.pk, duty),
                    DjangoMetricSink(run), claims=claims)


def batches(run) -> list[list[int]]:
    """Each step's tasks by their index in the taskset, in batch order."""
    rows = ExperienceRow.objects.filter(run=run, rollout_index=0).order_by("explorer_step", "id")
    found = [[] for _ in range(STEPS)]
    for step, index in rows.values_list("explorer_step", "task__index"):
        found[step].append(index)
    return found


def learned(run) -> dict[int, tuple]:
    return {row[0]: row[1:] for row in TaskDraw.objects.filter(run=run).values_list(
        "task__index", "count", "successes", "failures", "seen_step", "solved_streak")}


def selector_metrics(run) -> list[dict]:
    return [{key: value for key, value in values.items() if key.startswith("selector/")}
            for values in MetricPoint.objects.filter(run=run, role="explorer").order_by("step")
            .values_list("values", flat=True)]


def test_two_explorers_sharing_the_steps_draw_and_learn_what_one_explorer_does(researcher, taskset):
    now = timezone.now().isoformat()
    beats = {"explorer": {"at": now, "worker": A}, "explorer-1": {"at": now, "worker": B}}
    two = Run.objects.create(name="two", owner=researcher, status="running", config=CONFIG.to_dict(), heartbeats=beats)
    a, b = explorer(two, taskset, "explorer", A), explorer(two, taskset, "explorer-1", B)
    while a.step < STEPS or b.step < STEPS:
        for one in (a, b):
            if one.step < STEPS:
                one.explore_step()
    assert {part["explorer"] for step in ExplorerStep.objects.filter(run=two) for part in step.parts} == {
        "explorer", "explorer-1"}  # both rolled out groups

    # Draws are per run: another run on the taskset starts from nothing, as the first did.
    one = Run.objects.create(name="one", owner=researcher, status="running", config=CONFIG.to_dict())
    alone = explorer(one, taskset, "explorer", None)
    for _ in range(STEPS):
        alone.explore_step()

    assert batches(two) == batches(one)
    pks = dict(Task.objects.filter(taskset=taskset).values_list("index", "pk"))
    assert [row.task_ids for row in ExplorerStep.objects.filter(run=two).order_by("step")] == [
        [pks[i] for i in batch] for batch in batches(one)]  # the batch as its first explorer picked it
    assert learned(two) == pytest.approx(learned(one)) and len(learned(one)) == 24
    assert selector_metrics(two) == pytest.approx(selector_metrics(one))
    assert len(selector_metrics(one)) == STEPS and selector_metrics(one)[-1]["selector/unseen"] == 0
    # What it learned: the tasks passing at 0.5 were drawn most, those passing every time retired.
    # Summed over the three tasks of a rate: which task of a rate the Thompson draws favour turns on
    # the tasks' ids (the tie order), so one 0.5 task may be drawn as seldom as a 0.0 task (135 of
    # 300 id offsets, in memory); the sums were 2.6x apart or more in all 300 (3.0x in the default
    # order's place would be 1x).
    by_rate = {}
    for index, (count, *_) in learned(one).items():
        by_rate.setdefault(RATES[index % len(RATES)], []).append(count)
    assert sum(by_rate[0.5]) > 2 * sum(by_rate[0.0]) and by_rate[1.0] == [1, 1]
    # The two tasks passing every time retired in the first epoch (steps 0-3 draw all 24) and stay so.
    retired = [metrics["selector/retired_total"] for metrics in selector_metrics(one)]
    assert retired == sorted(retired) and retired[3:] == [2] * (STEPS - 3)

    # Resumed halfway, in a new explorer (its selector new): it reads what the run stored, and goes
    # on drawing, learning and counting what the run that went straight through did.
    resumed = Run.objects.create(name="resumed", owner=researcher, status="running", config=CONFIG.to_dict())
    before = explorer(resumed, taskset, "explorer", None)
    for _ in range(STEPS // 2):
        before.explore_step()
    after = explorer(resumed, taskset, "explorer", None)
    after.step = before.step
    while after.step < STEPS:
        after.explore_step()
    assert batches(resumed) == batches(one)
    assert selector_metrics(resumed) == pytest.approx(selector_metrics(one))
