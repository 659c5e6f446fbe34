"""The storage protocols' implementations side by side: the in-memory ones (workers/rft/memory.py)
and the Django ones (apps/buffer/store.py, apps/tasksets/store.py), the latter on whatever
database DATABASE_URL names. `make test` runs this directory twice, on Postgres and on SQLite (the
embedded `make demo`): the Django tests' ids and the report header name the engine."""
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from apps.buffer.models import Experience as ExperienceRow
from apps.buffer.store import DjangoExperienceBuffer
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task as TaskRow
from apps.tasksets.models import TaskDraw, Taskset
from apps.tasksets.store import DjangoTaskSource
from workers.rft.config import RunConfig
from workers.rft.experience import Experience, PreferencePair, Task
from workers.rft.memory import InMemoryBuffer, InMemoryTaskSource
from workers.rft.protocols import ExperienceBuffer

ENGINE = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]  # 'postgresql' | 'sqlite3'
IMPLEMENTATIONS = ["memory", f"django-{ENGINE}"]


def pytest_report_header(config):
    return f"contract: the Django stores run on {ENGINE} ({settings.DATABASES['default']['NAME']})"


@dataclass
class BufferHarness:
    """One buffer, the ids of the tasks its experiences may name, and how to add a preference
    pair (the protocol reads pairs but does not say how they arrive)."""

    buffer: ExperienceBuffer
    task_ids: list[int]
    add_pair: Callable[[Experience, Experience], None]  # (chosen, rejected)


def rollout(task_id, step=0, index=0, version=0, source="rollout", **fields) -> Experience:
    """A two-token response of `task_id` at explorer step `step`; fields override the rest."""
    values = dict(
        task_id=task_id, group_id=f"{step}-{task_id}", rollout_index=index, prompt_ids=[1, 2], response_ids=[3, 4],
        action_mask=[1, 1], logprobs=[-0.5, -0.25], source=source, explorer_step=step, model_version=version,
    )
    return Experience(**(values | fields))


def memory_buffer(config: dict) -> BufferHarness:
    buffer = InMemoryBuffer(RunConfig.from_dict(config))

    def add_pair(chosen, rejected):
        pair = PreferencePair(chosen.prompt_ids, chosen.response_ids, rejected.response_ids, chosen.task_id)
        buffer.add_pairs([pair])

    return BufferHarness(buffer, list(range(4)), add_pair)


def django_buffer(request, config: dict) -> BufferHarness:
    request.getfixturevalue("db")  # transactional where the test is marked django_db(transaction=True)
    user, _ = get_user_model().objects.get_or_create(username="contract")
    run = Run.objects.create(name="contract", owner=user, config=config)
    taskset = Taskset.objects.create(name=f"contract-{run.pk}")
    task_ids = [TaskRow.objects.create(taskset=taskset, index=i, prompt=f"{i}+1?").pk for i in range(4)]
    buffer = DjangoExperienceBuffer(run.pk)

    def add_pair(chosen, rejected):
        # An annotator's verdict on two stored experiences of the run: `chosen` is the better.
        buffer.write([chosen, rejected])
        rows = ExperienceRow.objects.filter(run=run)
        chosen_row, rejected_row = (
            rows.get(explorer_step=e.explorer_step, task_id=e.task_id, rollout_index=e.rollout_index)
            for e in (chosen, rejected)
        )
        Feedback.objects.create(
            experience=chosen_row, other=rejected_row, user=user, kind=Feedback.Kind.PREFERENCE, value=1.0
        )

    return BufferHarness(buffer, task_ids, add_pair)


@pytest.fixture(params=IMPLEMENTATIONS)
def make_buffer(request):
    """make_buffer(config={}): a fresh harness of this implementation, for a run with `config`."""

    def make(config: dict | None = None) -> BufferHarness:
        if request.param == "memory":
            return memory_buffer(config or {})
        return django_buffer(request, config or {})

    return make


@pytest.fixture
def harness(make_buffer) -> BufferHarness:
    return make_buffer()


@pytest.fixture
def buffer(harness):
    return harness.buffer


@pytest.fixture(params=IMPLEMENTATIONS)
def make_task_source(request):
    """make_task_source(tasks): a task source holding `tasks` (their ids are the source's own)."""

    def make(tasks: list[Task]):
        if request.param == "memory":
            return InMemoryTaskSource([replace(task, id=i) for i, task in enumerate(tasks)])
        request.getfixturevalue("db")
        taskset = Taskset.objects.create(name="contract", task_count=len(tasks))
        run = Run.objects.create(name="contract", owner=get_user_model().objects.create(username="tasks"), config={})
        rows = TaskRow.objects.bulk_create(
            TaskRow(taskset=taskset, index=i, prompt=t.prompt, answer=t.answer, metadata=t.metadata,
                    difficulty=t.difficulty, priority=t.priority)
            for i, t in enumerate(tasks)
        )
        TaskDraw.objects.bulk_create(TaskDraw(run=run, task=row, count=t.times_sampled)
                                     for row, t in zip(rows, tasks, strict=True) if t.times_sampled)
        return DjangoTaskSource(taskset, run.pk)

    return make
