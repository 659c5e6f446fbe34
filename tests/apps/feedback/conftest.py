import pytest

from apps.accounts.roles import ANNOTATOR
from apps.buffer.models import Experience
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

# Ratings reach the trainer as rewards (feedback.reward_mode), so a rating can have been trained on.
TRAINS_ON_RATINGS = {"feedback": {"reward_mode": "weight"}}


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config=TRAINS_ON_RATINGS, status=Run.Status.RUNNING)


@pytest.fixture
def tasks(db):
    taskset = Taskset.objects.create(name="ts")
    return [
        Task.objects.create(taskset=taskset, index=i, prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(4)
    ]


@pytest.fixture
def make_experience(run, tasks):
    """A rollout of `run`: experiences n and n+1 of one task share a group (they answer one prompt)."""
    counter = iter(range(10**6))

    def make(**fields):
        n = next(counter)
        task = fields.pop("task", tasks[(n // 2) % len(tasks)])
        values = {
            "run": run, "task": task, "explorer_step": n // 4, "rollout_index": n, "group_id": f"g{n // 2}",
            "prompt_text": task.prompt, "response_text": f"response number {n}", "prompt_ids": [1, 2, 3],
            "response_ids": [n, n + 1], "action_mask": [1, 1], "logprobs": [-0.5, -0.5], "reward": 1.0,
            "reward_components": {"exact_match": 1.0}, "model_version": 1,
        }
        return Experience.objects.create(**(values | fields))

    return make


@pytest.fixture
def make_annotator(db):
    from apps.accounts.services import create_user

    def make(username):
        return create_user(username, "pw-for-tests-123", roles=(ANNOTATOR,))

    return make
