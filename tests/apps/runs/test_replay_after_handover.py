"""A trainer that goes on from a checkpoint behind the step its lost worker reached (a hand-over after
kill -9, or a resume) replays the steps after it: from then on the run is where that trainer is.
Its stop line, its page's snapshot and the API name the replayed trainer's step, and the lost
steps' trainer points are gone until the replay records them again.

supervision.serve in this process, as a worker serves the duty; "killed" is an exception no
handler of the product catches, raised after the trainer's 5th step (its checkpoint: step 3)."""
import pytest
from django.urls import reverse

from apps.runs import logs, services, supervision
from apps.runs.models import Run
from tests.support import make_taskset
from workers.rft.loop import Loop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHECKPOINT, KILLED_AT = 3, 5


class Killed(BaseException):
    """kill -9 as the engine sees it: nothing runs after it, no checkpoint on the way out."""


def config() -> dict:
    return services.validate_config({
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "micro_batch_size": 4, "total_steps": 8, "save_interval": CHECKPOINT,
                    "save_interval_s": 0},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory", "interval": 1, "offset": 0},
    }).to_dict()


def test_a_run_stopped_as_its_replacement_trainer_loaded_names_the_step_that_trainer_is_at(
        researcher, researcher_client, monkeypatch):
    make_taskset()
    run = Run.objects.create(name="handed over", owner=researcher, config=config(), status=Run.Status.STARTING)
    train, resume = Loop.train, Loop.resume

    def killed_after_its_step(loop):
        metrics = train(loop)
        if loop.trainer.step == KILLED_AT:
            raise Killed
        return metrics

    monkeypatch.setattr(Loop, "train", killed_after_its_step)
    with pytest.raises(Killed):
        supervision.serve(run.pk, "loop")
    run.refresh_from_db()
    assert (run.trainer_step, run.checkpoints.get().step) == (KILLED_AT, CHECKPOINT)
    monkeypatch.setattr(Loop, "train", train)

    def stopped_while_it_loaded(loop, path):  # the Stop button, pressed while the new worker loaded
        resume(loop, path)
        services.stop_run(Run.objects.get(pk=run.pk))

    monkeypatch.setattr(Loop, "resume", stopped_while_it_loaded)
    assert supervision.serve(run.pk, "loop") == "stopped"  # another worker took the duty over

    run.refresh_from_db()
    reached = run.checkpoints.order_by("-step").first().step  # the stop saves one at the step it stopped at
    assert CHECKPOINT <= reached < KILLED_AT, "the replay got past the lost step: nothing was tested"
    lines = [line["message"] for line in logs.read(supervision.run_dir(run))["lines"]]
    assert f"run {run.pk} (loop): resumed from checkpoint v{CHECKPOINT} (trainer step {CHECKPOINT})" in lines
    assert f"run {run.pk} (loop): stopped at trainer step {reached}, checkpoint v{reached}" in lines
    assert (run.trainer_step, run.model_version) == (reached, reached)
    steps = list(range(1, reached + 1))
    assert list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True)) == steps
    assert run.metrics.filter(role="explorer").count() >= KILLED_AT  # their rollouts are stored: those steps stand
    snapshot = researcher_client.get(reverse("run-live", args=[run.pk])).json()
    assert snapshot["run"]["trainer_step"] == reached
    assert [point["step"] for point in snapshot["metrics"]["trainer"]] == steps
    assert researcher_client.get(reverse("api-run", args=[run.pk])).json()["trainer_step"] == reached
