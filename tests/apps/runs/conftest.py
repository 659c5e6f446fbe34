import sys
import types

import pytest
from django.utils import timezone

from apps.runs.models import Run
from apps.tasksets.models import Taskset


@pytest.fixture
def make_run(researcher):
    """A run in `status`; an active one (running, paused...) is held by a live worker, as it would
    be (pass heartbeats={} for one whose worker is gone)."""

    def make(name="run", *, owner=None, status=Run.Status.QUEUED, config=None, **fields):
        config = {"trainer": {"total_steps": 100}} if config is None else config
        if status in Run.ACTIVE and status != Run.Status.STARTING:
            fields.setdefault("heartbeats", {"loop": {"at": timezone.now().isoformat(), "worker": "test-worker"}})
        return Run.objects.create(name=name, owner=owner or researcher, status=status, config=config, **fields)

    return make


@pytest.fixture
def tasksets(db):
    """The built-in tasksets' names (empty: the launch pages only check that they exist)."""
    return [Taskset.objects.create(name=name) for name in ("addition", "addition-eval", "arithmetic", "arithmetic-eval", "countdown")]


@pytest.fixture
def worker_queue(monkeypatch):
    """Stands in for workers.tasks: records the run ids launch_run hands to the workers."""
    import workers

    queued = []
    start_run = types.SimpleNamespace(name="start_run", delay=queued.append)
    fake = types.SimpleNamespace(start_run=start_run, enqueue=lambda task, run_id, **options: queued.append(run_id))
    monkeypatch.setitem(sys.modules, "workers.tasks", fake)
    monkeypatch.setattr(workers, "tasks", fake, raising=False)
    return queued
