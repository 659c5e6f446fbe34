"""Real Celery workers register themselves, beat, and are stopped or lost as they end
(apps/runs/capacity.py; the page's own tests are tests/apps/runs/test_capacity.py)."""
import os
import signal

import pytest
from django.conf import settings

from apps.runs import capacity
from apps.runs.models import Worker
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def shown(state: str) -> list[str]:
    return [w.name for w in capacity.overview()[state]]


def test_workers_register_beat_and_end_stopped_or_lost(celery_worker_factory):
    calm = celery_worker_factory(queues="train,explore")
    doomed = celery_worker_factory(queues="default")
    row = wait_for(lambda: Worker.objects.filter(name=calm.name).first(), timeout=30, what="the worker's registration")
    assert (row.queues, row.slots, row.pid, row.stopped_at) == (["explore", "train"], 1, calm.pid, None)
    assert Worker.objects.get(name=doomed.name).queues == ["default"]
    first = row.last_seen
    beats = settings.RFTWEB_HEARTBEAT_INTERVAL  # on a thread of its own
    wait_for(lambda: Worker.objects.get(name=calm.name).last_seen > first, timeout=5 * beats, what="a heartbeat")
    assert Worker.objects.get(name=calm.name).started_at == row.started_at, "its beat names its life: the same"
    assert {calm.name, doomed.name} <= set(shown("workers"))

    os.killpg(calm.pid, signal.SIGTERM)  # an orderly stop
    calm.wait(timeout=30)
    assert Worker.objects.get(name=calm.name).stopped_at is not None
    assert calm.name in shown("stopped") and calm.name not in shown("workers")

    os.killpg(doomed.pid, signal.SIGKILL)  # no goodbye: lost once its heartbeat is overdue
    doomed.wait(timeout=30)
    wait_for(lambda: doomed.name in shown("lost"), timeout=3 * settings.RFTWEB_HEARTBEAT_TIMEOUT, what="the loss")
    assert Worker.objects.get(name=doomed.name).stopped_at is None
