import pytest

from apps.runs import services
from apps.runs.models import Run


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


def test_legal_lifecycle(run):
    for status in ["starting", "running", "paused", "running", "stopping", "stopped"]:
        services.set_status(run, status)
    run.refresh_from_db()
    assert run.status == "stopped" and run.started_at and run.finished_at


@pytest.mark.parametrize("path", [["completed"], ["starting", "paused"], ["stopped", "running"]])
def test_illegal_transitions_are_refused_and_change_nothing(run, path):
    with pytest.raises(services.InvalidTransition):
        for status in path:
            services.set_status(run, status)
    run.refresh_from_db()
    assert run.status != path[-1]


def test_record_metrics_updates_the_step_row(run):
    services.record_metrics(run, "trainer", 1, {"loss": 1.0})
    services.record_metrics(run, "trainer", 1, {"loss": 0.5})
    assert list(run.metrics.values_list("values", flat=True)) == [{"loss": 0.5}]
