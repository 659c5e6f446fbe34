
import pytest

from tests.support import taskset_with_a_task


@pytest.fixture
def tasksets(db):
    """The built-in tasksets' names, a task each (the launch pages check that they exist and hold one)."""
    names = ("addition", "addition-eval", "arithmetic", "arithmetic-eval", "countdown")
    return [taskset_with_a_task(name) for name in names]


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
