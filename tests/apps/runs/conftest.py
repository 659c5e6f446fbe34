
import pytest

from apps.tasksets.models import Taskset


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
