"""Stop and Pause reach a `feedback.rated_only` run's trainer while its step waits for ratings
(`rating_wait_s`): the wait checks them as an explorer step does (workers/rft/stopping.py). It
checked neither: a stop left the run "stopping" for the whole wait (up to an hour), then counted a
step that trained on nothing; a pause let the step train while the run was paused.

supervision.serve in a thread of this process, as a worker serves the run's duty; the run's one
trainer step waits for its explorer step's 4 rollouts to be rated, and none is until the test says."""
import threading
import time

import pytest

from apps.buffer.models import Experience
from apps.feedback import services as feedback
from apps.runs import services, supervision
from apps.runs.models import Run
from tests.support import make_taskset

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RATING_WAIT_S = 60  # the old wait ran out only after this: far beyond what the test allows a stop
TAKES_EFFECT_S = 10  # a check every 2 s, a poll of 0.5 s, and a checkpoint-free stop on a loaded box


@pytest.fixture
def run(researcher, monkeypatch):
    monkeypatch.setattr(services, "enqueue", lambda *args, **kwargs: None)  # a resume's start: the test serves it
    make_taskset()
    config = services.validate_config({
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "micro_batch_size": 4, "total_steps": 1},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory", "interval": 1, "offset": 0},
        "feedback": {"reward_mode": "override", "rated_only": True, "rating_wait_s": RATING_WAIT_S},
    }).to_dict()
    return Run.objects.create(name="rated only", owner=researcher, config=config, status=Run.Status.STARTING)


def serving(run) -> tuple[threading.Thread, dict]:
    """The run's loop duty served in a thread; once its rollouts are stored, its trainer waits for ratings."""
    outcome = {}

    def serve():
        try:
            outcome["status"] = supervision.serve(run.pk, "loop")
        finally:
            from django.db import connection

            connection.close()

    thread = threading.Thread(target=serve)
    thread.start()
    deadline = time.monotonic() + 300
    while Experience.objects.filter(run=run, source="rollout").count() < 4:
        assert thread.is_alive() and time.monotonic() < deadline, "the explorer step never stored its rollouts"
        time.sleep(0.2)
    time.sleep(1.0)  # the trainer's step has begun its wait
    return thread, outcome


def rate_all(run, annotator) -> None:
    for pk in Experience.objects.filter(run=run, source="rollout").values_list("pk", flat=True):
        feedback.rate(pk, annotator, "5")


def trainer_steps(run) -> list[int]:
    return list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True))


def test_a_stop_ends_the_rating_wait_within_seconds_without_a_step_and_a_resume_goes_on(run, annotator):
    thread, outcome = serving(run)
    asked = time.monotonic()
    services.stop_run(Run.objects.get(pk=run.pk))
    thread.join(RATING_WAIT_S + 60)
    assert time.monotonic() - asked < TAKES_EFFECT_S, "the stop waited for the rating wait to run out"
    run.refresh_from_db()
    assert (outcome["status"], run.status, run.trainer_step, trainer_steps(run)) == ("stopped", "stopped", 0, [])
    assert not Experience.objects.filter(run=run).exclude(status="ready").exists()  # nothing consumed

    services.resume_run(run)
    services.set_status(Run.objects.get(pk=run.pk), Run.Status.STARTING)  # what start_run does on a worker
    rate_all(run, annotator)
    assert supervision.serve(run.pk, "loop") == "completed"
    run.refresh_from_db()
    assert (run.status, run.trainer_step, trainer_steps(run)) == ("completed", 1, [1])
    assert run.metrics.get(role="trainer").values["experiences"] == 4  # it trained on the rated rollouts


def test_a_pause_holds_the_rating_wait_and_the_step_trains_once_resumed(run, annotator):
    thread, outcome = serving(run)
    services.pause_run(Run.objects.get(pk=run.pk))
    time.sleep(3.0)  # the wait's next check finds the pause and holds there
    rate_all(run, annotator)  # annotators go on judging a paused run
    time.sleep(5.0)
    run.refresh_from_db()
    assert (run.status, run.trainer_step, trainer_steps(run)) == ("paused", 0, []), "it trained while paused"
    # Not even sampled: the paused step claims nothing.
    held = Experience.objects.filter(run=run).exclude(status="ready", claimed_at__isnull=True)
    assert not held.exists(), "the paused step sampled its rollouts"

    services.resume_run(Run.objects.get(pk=run.pk))  # in place
    thread.join(120)
    assert not thread.is_alive()
    run.refresh_from_db()
    assert (outcome["status"], run.status, run.trainer_step) == ("completed", "completed", 1)
    assert run.metrics.get(role="trainer").values["experiences"] == 4
