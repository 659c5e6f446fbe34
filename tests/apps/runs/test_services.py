import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.runs import services
from apps.runs.live import publisher
from apps.runs.models import Run
from apps.runs.store import DjangoMetricSink


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


def test_progress_only_moves_forward_and_the_page_hears_what_moved(run, monkeypatch,
                                                                    django_capture_on_commit_callbacks):
    heard = []
    monkeypatch.setattr(publisher, "publish", lambda run_id, update: heard.append(update))
    with django_capture_on_commit_callbacks(execute=True):
        services.set_progress(run, explorer_step=5, model_version=2)
        services.set_progress(run, explorer_step=3, model_version=4)  # a replayed step: its counter stays
        services.set_progress(run, trainer_step=0)  # not past the stored 0: nothing to say
    with pytest.raises(ValueError, match=r"unknown progress field\(s\) \['status'\]"):
        services.set_progress(run, status=1)
    run.refresh_from_db()
    assert (run.explorer_step, run.model_version, run.trainer_step) == (5, 4, 0)
    assert heard == [
        {"type": "progress", "explorer_step": 5, "model_version": 2}, {"type": "progress", "model_version": 4}
    ]


def test_a_trainer_back_at_its_checkpoint_takes_the_run_and_its_points_back_once(run, monkeypatch,
                                                                                    django_capture_on_commit_callbacks):
    heard = []
    monkeypatch.setattr(publisher, "publish", lambda run_id, update: heard.append(update))
    for step in range(1, 9):  # the lost worker reached trainer step 8; its checkpoint is step 5
        services.record_metrics(run, "trainer", step, {"loss": 1.0})
        services.record_metrics(run, "explorer", step, {"reward_mean": 0.5})
    for step in (0, 4, 8):
        services.record_metrics(run, "eval", step, {"accuracy": 0.5})
    Run.objects.filter(pk=run.pk).update(trainer_step=8, explorer_step=8, model_version=8)
    heard.clear()
    with django_capture_on_commit_callbacks(execute=True):
        DjangoMetricSink(run).rewind(5, 5, explorer_step=4)  # a single loop: its explorer back at step 4
        DjangoMetricSink(run).rewind(5, 5, explorer_step=4)  # there already: nothing to say
    run.refresh_from_db()
    # The run is where its loop is (it said "explorer 8" at trainer step 5); the explorer points stand.
    assert (run.trainer_step, run.model_version, run.explorer_step) == (5, 5, 4)
    steps = lambda role: list(run.metrics.filter(role=role).order_by("step").values_list("step", flat=True))  # noqa: E731
    assert (steps("trainer"), steps("eval"), steps("explorer")) == ([1, 2, 3, 4, 5], [0, 4], list(range(1, 9)))
    assert heard == [{"type": "rewind", "trainer_step": 5, "model_version": 5, "explorer_step": 4}]
    # Its explorer replays step 5 from the stored rollouts: the run is at step 5 again, the point as it was.
    point = run.metrics.get(role="explorer", step=5)
    DjangoMetricSink(run).replayed("explorer", 5)
    run.refresh_from_db()
    assert run.explorer_step == 5 and run.metrics.get(role="explorer", step=5).values == point.values
    # The weights it holds as it replays the next: the model version follows (it stayed at the
    # rewind's until the replay got past the stored steps, as no point is logged).
    DjangoMetricSink(run).replayed("explorer", 6, 6)
    run.refresh_from_db()
    assert (run.explorer_step, run.model_version) == (6, 6)
    DjangoMetricSink(run).rewind(0, 0)  # a split run's trainer, with no checkpoint yet: its explorers' evals stay
    run.refresh_from_db()
    assert (run.trainer_step, run.model_version, steps("trainer"), steps("eval")) == (0, 0, [], [0, 4])


@pytest.mark.django_db(transaction=True)
def test_progress_from_eight_threads_at_once_ends_at_the_largest(run):
    """No read-then-write: each field is one conditional UPDATE, and the row lock orders them."""
    steps = list(range(1, 41))
    random.Random(0).shuffle(steps)

    def move(step):
        try:
            services.set_progress(Run.objects.get(pk=run.pk), trainer_step=step)
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(move, steps))
    run.refresh_from_db()
    assert run.trainer_step == 40
