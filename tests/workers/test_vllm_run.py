"""A run with `explorer.engine: vllm` end to end: launched like any run, on a real Celery worker
(`--pool solo`: vLLM starts its own processes, which prefork's daemonic children cannot)."""
import importlib.util

import pytest

from apps.buffer.models import Experience
from apps.runs import services
from tests.support import wait_for

from .test_tasks import finished, make_taskset

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed: `make install`"),
]


def vllm_config(steps: int, tasks: int = 4, repeats: int = 4) -> dict:
    return {
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": repeats},
        "explorer": {"engine": "vllm", "batch_size": tasks, "max_new_tokens": 8},
        "trainer": {"lr": 1e-3, "micro_batch_size": 16, "total_steps": steps},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory"},
    }


def test_a_run_with_explorer_engine_vllm_on_a_worker(celery_worker_factory, researcher):
    make_taskset()
    celery_worker_factory(pool="solo")
    steps = 3
    run = services.launch_run(researcher, "vllm", vllm_config(steps))
    wait_for(lambda: finished(run), timeout=600, what="completion")
    assert run.status == "completed", run.error
    assert run.trainer_step == steps
    explored = dict(run.metrics.filter(role="explorer").values_list("step", "values"))
    assert [explored[s]["model_version"] for s in sorted(explored)][:steps] == list(range(steps))
    rollouts = Experience.objects.filter(run=run, source="rollout")
    assert rollouts.count() == steps * 4 * 4
    assert all(len(lp) == len(ids) for lp, ids in rollouts.values_list("logprobs", "response_ids"))
    mismatch = list(run.metrics.filter(role="trainer").values_list("values__logprob_mismatch", flat=True))
    assert len(mismatch) == steps and max(mismatch) < 2e-3  # vLLM's logprobs are the trainer's, up to kernels
