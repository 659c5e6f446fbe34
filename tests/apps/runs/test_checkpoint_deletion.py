"""Deleting checkpoints in the admin (apps/runs/deletion.py): the confirmation page says, for each run,
which checkpoint Resume would go on from once they are gone, and that their directories go with them;
a checkpoint of a run that has not ended (its trainer may go on from it at any moment) is refused.
Django's own delete said nothing, left the directory on disk, and a researcher's Resume then started
the run over from step 0 while its page still said "explorer 25 · model v5"."""
import json
from contextlib import contextmanager

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs import services
from apps.runs.live import publisher
from apps.runs.models import Checkpoint, Run
from apps.runs.supervision import run_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator_client(client, curator):
    client.force_login(curator)
    return client


def make_run(owner, status, *steps):
    """A run with a checkpoint (and its directory) at each of `steps`, version = step // 10."""
    run = Run.objects.create(name=f"r-{status}", owner=owner, status=status, config={}, trainer_step=55,
                             explorer_step=56, model_version=5)
    for step in steps:
        directory = run_dir(run) / "checkpoints" / f"step_{step}"
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"weights")
        Checkpoint.objects.create(run=run, version=step // 10, step=step, path=str(directory))
    return run


def delete_selected(client, checkpoints, confirm: bool):
    data = {"action": "delete_selected", "_selected_action": [checkpoint.pk for checkpoint in checkpoints]}
    return client.post(reverse("admin:runs_checkpoint_changelist"), {**data, **({"post": "yes"} if confirm else {})})


def test_the_page_says_where_each_run_would_resume_from_and_the_delete_takes_the_directories(
        curator_client, curator, worker_queue, django_capture_on_commit_callbacks):
    stopped, failed = make_run(curator, "stopped", 30, 50), make_run(curator, "failed", 20)
    completed = make_run(curator, "completed", 40, 60)
    newest, only = stopped.checkpoints.get(step=50), failed.checkpoints.get()
    older = completed.checkpoints.get(step=40)
    page = delete_selected(curator_client, [newest, only, older], confirm=False).content.decode()
    assert f"Run {stopped.pk} &#x27;r-stopped&#x27; (stopped) would resume from v3 (step 30), not v5 (step 50)" in page
    assert (f"Run {failed.pk} &#x27;r-failed&#x27; (failed) would resume from the start (step 0), not v2 (step 20)"
            in page)
    assert (f"Run {completed.pk} &#x27;r-completed&#x27; (completed) is not resumed again; its newest checkpoint (its "
            "trained model) v6 (step 60) stays") in page
    assert f"its directory {run_dir(stopped) / 'checkpoints' / 'step_50'} is deleted with it" in page
    Run.objects.filter(pk=failed.pk).update(buffer_retired_at=timezone.now())  # never resumed again
    page = delete_selected(curator_client, [completed.checkpoints.get(step=60), only], confirm=False).content.decode()
    assert (f"Run {completed.pk} &#x27;r-completed&#x27; (completed) is not resumed again; its newest checkpoint "
            "(its trained model) becomes v4 (step 40), not v6 (step 60)") in page
    assert ("(failed) cannot be resumed (its buffer was retired); no checkpoint of it is left: v2 (step 20), its "
            "trained model, goes too") in page
    Run.objects.filter(pk=failed.pk).update(buffer_retired_at=None)
    assert Checkpoint.objects.count() == 5  # the pages deleted nothing

    with django_capture_on_commit_callbacks(execute=True):  # the directories go once the rows have
        assert delete_selected(curator_client, [newest, only, older], confirm=True).status_code == 302
    assert sorted(Checkpoint.objects.values_list("step", flat=True)) == [30, 60]
    assert not (run_dir(stopped) / "checkpoints" / "step_50").exists()
    assert not (run_dir(failed) / "checkpoints" / "step_20").exists()
    assert (run_dir(stopped) / "checkpoints" / "step_30").exists()
    # What the page said is what Resume does.
    assert services.resume_run(stopped).resumes[-1]["checkpoint"] == {"version": 3, "step": 30}
    assert services.resume_run(failed).resumes[-1]["checkpoint"] is None


def test_a_single_delete_warns_the_same_way(curator_client, curator, django_capture_on_commit_callbacks):
    run = make_run(curator, "stopped", 30, 50)
    newest = run.checkpoints.get(step=50)
    url = reverse("admin:runs_checkpoint_delete", args=[newest.pk])
    assert "would resume from v3 (step 30), not v5 (step 50)" in curator_client.get(url).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        assert curator_client.post(url, {"post": "yes"}).status_code == 302
    assert list(run.checkpoints.values_list("step", flat=True)) == [30]
    assert not (run_dir(run) / "checkpoints" / "step_50").exists()


@pytest.mark.parametrize("status", [Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.STOPPING, Run.Status.QUEUED])
def test_a_checkpoint_of_a_run_that_has_not_ended_is_not_deleted(curator_client, curator, status):
    run, ended = make_run(curator, status, 30, 50), make_run(curator, "stopped", 40)
    checkpoints = [run.checkpoints.get(step=50), ended.checkpoints.get()]
    refusal = (f"run {run.pk} &#x27;r-{status}&#x27; is {status}: its trainer may go on from its checkpoints at "
               "any moment (a hand-over, a restart); stop it first")
    assert refusal in delete_selected(curator_client, checkpoints, confirm=False).content.decode()
    delete_selected(curator_client, checkpoints, confirm=True)
    assert Checkpoint.objects.count() == 3 and (run_dir(run) / "checkpoints" / "step_50").exists()  # all or none
    page = curator_client.get(reverse("admin:runs_checkpoint_delete", args=[checkpoints[0].pk]), follow=True)
    assert page.redirect_chain == [(reverse("admin:runs_checkpoint_change", args=[checkpoints[0].pk]), 302)]
    assert f"Not deleted: {refusal}." in page.content.decode()
    assert Checkpoint.objects.count() == 3


def test_resume_drops_the_weight_versions_past_where_its_trainer_goes_on(curator):
    """Checkpoint sync: the versions an earlier life published past the resume point go before any
    duty is queued (the trainer dropped them only once its model had loaded, and an explorer that
    started first rolled out on the old v5 beside a trainer at step 30)."""
    stopped, failed = make_run(curator, "stopped", 30), make_run(curator, "failed")
    for run in (stopped, failed):
        for version in range(6):
            (run_dir(run) / "versions" / f"v{version}").mkdir(parents=True)
    services.resume_run(stopped)
    services.resume_run(failed)
    assert sorted(path.name for path in (run_dir(stopped) / "versions").iterdir()) == ["v0", "v1", "v2", "v3"]
    assert [path.name for path in (run_dir(failed) / "versions").iterdir()] == ["v0"]
    resumed = make_run(curator, "stopped", 20)  # memory sync: no versions directory, none made
    services.resume_run(resumed)
    assert not (run_dir(resumed) / "versions").exists()


def with_points(run, explored: dict[int, int]):
    """The trainer's and eval points of a run at trainer step 55, and its checkpoints' trainer
    state as Loop.save writes it: `explored` {checkpoint step: the explorer step it recorded}."""
    for step in range(1, 56):
        services.record_metrics(run, "trainer", step, {"loss": 1.0})
        services.record_metrics(run, "explorer", step, {"reward_mean": 0.5})
    for step in (0, 30, 50):
        services.record_metrics(run, "eval", step, {"accuracy": 0.5})
    for checkpoint in run.checkpoints.all():
        state = {"step": checkpoint.step, "extra": {"explorer_step": explored[checkpoint.step], "skipped_steps": 0}}
        (run_dir(run) / "checkpoints" / f"step_{checkpoint.step}" / "trainer_state.json").write_text(json.dumps(state))
    return run


def steps(run, role) -> list[int]:
    return list(run.metrics.filter(role=role).order_by("step").values_list("step", flat=True))


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """What a change leaves for after its commit (the directories' deletion, the live updates), run
    now and sent at once, while this test's database is still there."""

    @contextmanager
    def commit():
        with django_capture_on_commit_callbacks(execute=True):
            yield
        publisher.flush()

    return commit


def test_resume_answers_where_the_run_goes_on_from_at_once(curator_client, curator, worker_queue, committed):
    """The Resume's answer and the run's page said "trainer 55 · explorer 56 · model v5", the
    deleted checkpoint's, until a worker started the run and took it back to the one it loaded."""
    run = with_points(make_run(curator, "stopped", 30, 50), {30: 31, 50: 51})
    with committed():
        delete_selected(curator_client, [run.checkpoints.get(step=50)], confirm=True)
    with committed():
        answer = curator_client.post(reverse("api-run-resume", args=[run.pk]), content_type="application/json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["status"], body["trainer_step"], body["explorer_step"], body["model_version"]) == ("queued", 30, 31, 3)
    assert body["message"] == f"run {run.pk} resumes from checkpoint v3 (trainer step 30)"
    # Its charts too: the trainer points past step 30 are replayed, the eval past explorer step 31 again.
    assert (steps(run, "trainer"), steps(run, "eval"), len(steps(run, "explorer"))) == (list(range(1, 31)), [0, 30], 55)

    # Every checkpoint deleted: the page's Resume, and the page it lands on, say step 0.
    gone = with_points(make_run(curator, "failed", 20), {20: 21})
    with committed():
        delete_selected(curator_client, [gone.checkpoints.get()], confirm=True)
    with committed():
        page = curator_client.post(reverse("run-resume", args=[gone.pk]), follow=True).content.decode()
    assert "has no checkpoint (none yet, or deleted): it starts again from step 0" in page
    for state in ("trainer_step", "explorer_step", "model_version"):
        assert f'<span data-state="{state}">0</span>' in page, state
    assert (steps(gone, "trainer"), steps(gone, "eval")) == ([], [0])


@pytest.mark.parametrize("config, after", [
    # Split explorers (checkpoint sync) go on after the stored steps: only the trainer goes back.
    ({"synchronizer": {"method": "checkpoint"}}, (30, 56, 3)),
    ({"mode": "train"}, (30, 56, 3)),  # no explorer
    ({"mode": "explore"}, (55, 56, 5)),  # no trainer: its worker takes nothing back
])
def test_resume_takes_back_what_the_runs_worker_will(curator, config, after):
    run = make_run(curator, "stopped", 30)
    Run.objects.filter(pk=run.pk).update(config=config)
    resumed = services.resume_run(Run.objects.get(pk=run.pk))
    assert (resumed.trainer_step, resumed.explorer_step, resumed.model_version) == after
