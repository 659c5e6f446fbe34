import pytest

from apps.buffer.models import Experience
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    """Uploads and export files of these tests go to their own directory."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


@pytest.fixture
def tasks(db):
    taskset = Taskset.objects.create(name="ts")
    return [
        Task.objects.create(taskset=taskset, index=i, prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(4)
    ]


@pytest.fixture
def make_experience(run, tasks):
    """An experience of `run` with tokens and a reward; fields override the defaults."""
    counter = iter(range(10**6))

    def make(**fields):
        n = next(counter)
        task = fields.pop("task", tasks[n % len(tasks)])
        response_ids = fields.pop("response_ids", [n, n + 1, n + 2])
        tokens = len(response_ids or [])
        values = {
            "run": run,
            "task": task,
            "explorer_step": n // 8,
            "rollout_index": n,
            "group_id": f"g{n // 4}",
            "prompt_text": task.prompt if task else f"prompt {n}",
            "response_text": f"response number {n}",
            "prompt_ids": [1, 2, 3],
            "response_ids": response_ids,
            "action_mask": [1] * tokens,
            "logprobs": [-0.5] * tokens,
            "reward": 1.0,
            "reward_components": {"exact_match": 1.0},
            "model_version": 1,
        }
        return Experience.objects.create(**(values | fields))

    return make


@pytest.fixture
def curator_client(client, curator):
    client.force_login(curator)
    return client
