"""A drained Celery worker (capacity.set_drain, or a curator's POST /api/workers/<name>/drain/)
takes no new task of its queues: they wait in the broker; undrained, it takes them again. Real
worker, real Redis (the page's tests: tests/apps/runs/test_worker_drain.py; the API's refusals:
tests/apps/runs/test_worker_drain_api.py)."""
import time

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs import capacity
from apps.runs.api import token_for
from apps.runs.models import Run, TaskRun, Worker
from apps.runs.supervision import SERVE_TASK
from rftweb.celery import enqueue, queue_lengths
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def by_service(name: str, drain: bool) -> None:
    capacity.set_drain(name, "cur", drain)


def by_api(curator):
    """A curator's script: its answer is the worker's page's data, drained or not, and what it does now."""
    script = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}")

    def call(name: str, drain: bool) -> None:
        response = script.post(reverse("api-worker-drain" if drain else "api-worker-undrain", kwargs={"name": name}))
        assert response.status_code == 200, response.content
        answer = response.json()
        assert bool(answer["worker"]["drain"]) == drain and answer["worker"]["name"] == name
        assert answer["message"] == (f"draining {name}: it finishes what it holds and takes no new duty" if drain
                                     else f"{name} takes duties again")

    return call


@pytest.mark.parametrize("how", ["service", "api"])
def test_a_drained_worker_leaves_its_queue_to_others_until_undrained(celery_worker_factory, researcher, curator,
                                                                     how):
    set_drain = by_service if how == "service" else by_api(curator)
    worker = celery_worker_factory(queues="train")
    wait_for(lambda: Worker.objects.filter(name=worker.name).exists(), timeout=30, what="the worker's registration")
    # A stopped run: a task for it that a worker takes ends at once ("skipped"), its row naming the worker.
    run = Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.STOPPED)

    set_drain(worker.name, True)
    assert Worker.objects.get(name=worker.name).drain["by"] == "cur"
    enqueue(SERVE_TASK, run.pk, "loop", queue="train", task_id="while-drained")
    time.sleep(3)  # a worker consuming the queue takes it in milliseconds
    assert queue_lengths(["train"]) == {"train": 1} and not TaskRun.objects.filter(task_id="while-drained").exists()

    set_drain(worker.name, False)
    taken = wait_for(lambda: TaskRun.objects.filter(task_id="while-drained", outcome="success").first(), timeout=30,
                     what="the undrained worker taking the task")
    assert taken.worker == worker.name and taken.result == "skipped" and queue_lengths(["train"]) == {"train": 0}
    assert Worker.objects.get(name=worker.name).drain == {}
