"""A drained Celery worker (capacity.set_drain) takes no new task of its queues: they wait in the
broker; undrained, it takes them again. Real worker, real Redis (the page's tests:
tests/apps/runs/test_worker_drain.py)."""
import time

import pytest

from apps.runs import capacity
from apps.runs.models import Run, TaskRun, Worker
from apps.runs.supervision import SERVE_TASK
from rftweb.celery import enqueue, queue_lengths
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_drained_worker_leaves_its_queue_to_others_until_undrained(celery_worker_factory, researcher):
    worker = celery_worker_factory(queues="train")
    wait_for(lambda: Worker.objects.filter(name=worker.name).exists(), timeout=30, what="the worker's registration")
    # A stopped run: a task for it that a worker takes ends at once ("skipped"), its row naming the worker.
    run = Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.STOPPED)

    capacity.set_drain(worker.name, "cur", True)
    assert Worker.objects.get(name=worker.name).drain["by"] == "cur"
    enqueue(SERVE_TASK, run.pk, "loop", queue="train", task_id="while-drained")
    time.sleep(3)  # a worker consuming the queue takes it in milliseconds
    assert queue_lengths(["train"]) == {"train": 1} and not TaskRun.objects.filter(task_id="while-drained").exists()

    capacity.set_drain(worker.name, "cur", False)
    taken = wait_for(lambda: TaskRun.objects.filter(task_id="while-drained", outcome="success").first(), timeout=30,
                     what="the undrained worker taking the task")
    assert taken.worker == worker.name and taken.result == "skipped" and queue_lengths(["train"]) == {"train": 0}
    assert Worker.objects.get(name=worker.name).drain == {}
