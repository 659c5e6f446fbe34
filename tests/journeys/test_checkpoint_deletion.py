"""A curator deletes a stopped run's checkpoints in the admin, and its researcher presses Resume: the
run starts over from step 0, and its page, its snapshot, its duty line and the API say so. Before,
the trainer restarted from step 0 while the page said "explorer 25 · model v5" and the duty line
"rolling out step 6 with v5": the run's explorer step never went back, and the weight versions the
first life had published (checkpoint sync) were still there, so the explorer ran ahead of the
trainer on the old run's v5. The counters go back as soon as Resume is accepted.

supervision.serve in this process, as a worker serves the duty; the admin and the run page through
the test client, as the curator and the researcher use them."""
import re

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs import logs, services, supervision, waits
from apps.runs.models import MetricPoint, Run
from tests.support import make_taskset
from workers.rft.loop import Loop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STOPPED_AT = 5


def config() -> dict:
    return services.validate_config({
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "micro_batch_size": 4, "total_steps": 8, "save_interval": 2, "save_interval_s": 0},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory", "interval": 1, "offset": 0},
    }).to_dict()


def stop_after(run, step, monkeypatch, seen=None):
    """The Stop button, pressed once the trainer has trained `step` (its duty line then, in `seen`)."""
    train = Loop.train

    def train_then_stop(loop):
        metrics = train(loop)
        if loop.trainer.step == step:
            if seen is not None:
                seen.extend(state.detail for state in waits.duty_states(Run.objects.get(pk=run.pk)))
            services.stop_run(Run.objects.get(pk=run.pk))
        return metrics

    monkeypatch.setattr(Loop, "train", train_then_stop)


def test_a_run_whose_checkpoints_a_curator_deleted_resumes_from_the_start_and_says_so(
        researcher, researcher_client, curator, monkeypatch, django_capture_on_commit_callbacks):
    make_taskset()
    run = Run.objects.create(name="pruned", owner=researcher, config=config(), status=Run.Status.STARTING)
    stop_after(run, STOPPED_AT, monkeypatch)
    assert supervision.serve(run.pk, "loop") == "stopped"
    run.refresh_from_db()
    assert (run.trainer_step, run.model_version) == (STOPPED_AT, STOPPED_AT) and run.explorer_step >= STOPPED_AT
    explored = run.explorer_step
    rolled_out = list(run.metrics.filter(role="explorer").values_list("step", "values"))

    # The curator deletes every checkpoint of the run; the page said what Resume would then do.
    admin = Client()
    admin.force_login(curator)
    selected = {"action": "delete_selected", "_selected_action": list(run.checkpoints.values_list("pk", flat=True))}
    page = admin.post(reverse("admin:runs_checkpoint_changelist"), selected).content.decode()
    assert f"would resume from the start (step 0), not v{STOPPED_AT} (step {STOPPED_AT})" in page
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(reverse("admin:runs_checkpoint_changelist"), {**selected, "post": "yes"})
    assert not run.checkpoints.exists() and not any((supervision.run_dir(run) / "checkpoints").glob("step_*"))

    # The researcher resumes it; a worker serves it (as start_run sends it) until its trainer's first step again.
    queued = []
    monkeypatch.setattr(services, "enqueue", lambda name, run_id, **options: queued.append((name, run_id)))
    answer = researcher_client.post(reverse("run-resume", args=[run.pk]), follow=True).content.decode()
    assert "has no checkpoint (none yet, or deleted): it starts again from step 0" in answer
    assert queued == [("workers.tasks.start_run", run.pk)]
    # As soon as Resume is accepted, not once a worker has started it, the page it lands on and the
    # API say where it goes on from: they said "explorer 6 · model v5" until then.
    for state in ("trainer_step", "explorer_step", "model_version"):
        assert f'<span data-state="{state}">0</span>' in answer, state
    api = researcher_client.get(reverse("api-run", args=[run.pk])).json()
    assert (api["status"], api["trainer_step"], api["explorer_step"], api["model_version"]) == ("queued", 0, 0, 0)
    services.set_status(Run.objects.get(pk=run.pk), Run.Status.STARTING)
    seen = []
    stop_after(run, 1, monkeypatch, seen)
    assert supervision.serve(run.pk, "loop") == "stopped"

    run.refresh_from_db()
    # Trainer step 1 trained on explorer step 1, replayed from its stored rollouts; the explorer did not
    # run ahead on the first life's v5 (it said "rolling out step 6 with v5" and "model v5").
    assert (run.trainer_step, run.explorer_step, run.model_version) == (1, 1, 1)
    assert any(re.search(r"from the start \(no checkpoint to go on from\)", line) for line in seen), seen
    assert not any("with v5" in line for line in seen), seen
    assert run.heartbeats["loop"]["from_checkpoint"] == {"version": 0, "step": 0}
    lines = [line["message"] for line in logs.read(supervision.run_dir(run))["lines"]]
    assert f"run {run.pk} (loop): resumed with no checkpoint (none yet, or deleted): from step 0 (same run)" in lines
    # The rolled-out steps' explorer points stay as they were: those rollouts are stored and replayed.
    assert list(run.metrics.filter(role="explorer", step__lte=explored).values_list("step", "values")) == rolled_out
    assert list(run.metrics.filter(role=MetricPoint.Role.TRAINER).values_list("step", flat=True)) == [1]

    detail = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert '<span data-state="explorer_step">1</span>' in detail
    assert '<span data-state="model_version">1</span>' in detail
    snapshot = researcher_client.get(reverse("run-live", args=[run.pk])).json()["run"]
    assert (snapshot["trainer_step"], snapshot["explorer_step"], snapshot["model_version"]) == (1, 1, 1)
    api = researcher_client.get(reverse("api-run", args=[run.pk])).json()
    assert (api["trainer_step"], api["explorer_step"], api["model_version"]) == (1, 1, 1)
