
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
    names = ("addition", "addition-eval", "arithmetic", "arithmetic-eval", "countdown")
    return [Taskset.objects.create(name=name) for name in names]


@pytest.fixture
def worker_queue(monkeypatch):
    """Stands in for the workers: records the run ids launch_run and resume_run hand to them."""
    from apps.runs import services

    queued = []

    def enqueue(name, run_id, **options):
        assert name == "workers.tasks.start_run"
        queued.append(run_id)

    monkeypatch.setattr(services, "enqueue", enqueue)
    return queued
