"""Deleting checkpoints in the admin (apps/runs/deletion.py): the confirmation page says, for each run,
which checkpoint Resume would go on from once they are gone, and that their directories go with them;
a checkpoint of a run that has not ended (its trainer may go on from it at any moment) is refused.
Django's own delete said nothing, left the directory on disk, and a researcher's Resume then started
the run over from step 0 while its page still said "explorer 25 · model v5"."""
import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs import services
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
