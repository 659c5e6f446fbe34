"""Deleting runs in the admin (apps/runs/deletion.py): an ended run goes with its rows and its
directory, counted on the confirmation page; a run that has not ended, or whose human edits another
run trains on, is refused and keeps everything. Django's own delete let a curator delete a running
run (its worker failed at its next write) and listed every experience on the page."""
import shutil

import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import MetricPoint, Run
from apps.runs.supervision import run_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator_client(client, curator):
    client.force_login(curator)
    return client


def make_run(owner, status, rows=3, **config):
    run = Run.objects.create(name=f"r-{status}", owner=owner, status=status, config=config)
    Experience.objects.bulk_create(Experience(run=run, explorer_step=0, rollout_index=i, response_text=f"a{i}")
                                   for i in range(rows))
    MetricPoint.objects.create(run=run, role="trainer", step=1, values={"loss": 1.0})
    run_dir(run).mkdir(parents=True)
    (run_dir(run) / "checkpoint.bin").write_bytes(b"weights")
    return run


def delete_selected(client, runs, confirm: bool):
    data = {"action": "delete_selected", "_selected_action": [run.pk for run in runs]}
    return client.post(reverse("admin:runs_run_changelist"), {**data, **({"post": "yes"} if confirm else {})})


def kept(run) -> bool:
    return (Run.objects.filter(pk=run.pk).exists() and Experience.objects.filter(run=run).count() == 3
            and run_dir(run).exists())


@pytest.mark.parametrize("status", [Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.STOPPING, Run.Status.QUEUED])
def test_a_run_that_has_not_ended_is_not_deleted(curator_client, curator, status):
    run, ended = make_run(curator, status), make_run(curator, Run.Status.COMPLETED)
    page = delete_selected(curator_client, [run, ended], confirm=False).content.decode()
    assert f"run {run.pk} &#x27;r-{status}&#x27; is {status}: stop it first" in page
    delete_selected(curator_client, [run, ended], confirm=True)
    assert kept(run) and kept(ended)  # all or none
    page = curator_client.get(reverse("admin:runs_run_delete", args=[run.pk]), follow=True)  # not the site's 403
    assert page.redirect_chain == [(reverse("admin:runs_run_change", args=[run.pk]), 302)]
    assert f"Not deleted: run {run.pk} &#x27;r-{status}&#x27; is {status}: stop it first." in page.content.decode()


def test_a_run_whose_human_edits_another_run_trains_on_is_not_deleted(curator_client, curator):
    source = make_run(curator, Run.Status.STOPPED)
    make_run(curator, Run.Status.RUNNING, feedback={"source_runs": [source.pk]})
    page = delete_selected(curator_client, [source], confirm=False).content.decode()
    assert f"trains on the human edits of run {source.pk} (feedback.source_runs)" in page
    delete_selected(curator_client, [source], confirm=True)
    assert kept(source)


def test_an_ended_run_goes_with_its_rows_and_directory_and_the_page_counts_them(
        curator_client, curator, annotator, django_capture_on_commit_callbacks):
    run, other = make_run(curator, Run.Status.FAILED), make_run(curator, Run.Status.COMPLETED)
    first, second = Experience.objects.filter(run=run)[:2]
    Feedback.objects.create(experience=first, other=second, user=annotator, kind="comparison", value=1.0)
    page = delete_selected(curator_client, [run], confirm=False).content.decode()
    assert f"Run {run.pk} &#x27;r-failed&#x27; (failed): 3 experiences" in page and "experience " not in page
    with django_capture_on_commit_callbacks(execute=True):  # the directory goes once the rows have
        assert delete_selected(curator_client, [run], confirm=True).status_code == 302
    assert not Run.objects.filter(pk=run.pk).exists() and not Experience.objects.filter(run_id=run.pk).exists()
    assert not MetricPoint.objects.filter(run_id=run.pk).exists() and not Feedback.objects.exists()
    assert not run_dir(run).exists() and kept(other)
    with django_capture_on_commit_callbacks(execute=True):
        single = curator_client.post(reverse("admin:runs_run_delete", args=[other.pk]), {"post": "yes"})
    assert single.status_code == 302 and not Run.objects.exists() and not run_dir(other).exists()


# ---- runs that load a model from the run's directory ----------------------------------------------------


@pytest.fixture
def checkpoint_reader(curator, tasksets, worker_queue):
    """(source, reader): a stopped run with a checkpoint (the tiny model's files), and a run
    launched as any is, its model.path and ref_path that checkpoint named as a user types it."""
    from apps.runs import services
    from apps.runs.models import Checkpoint
    from apps.runs.presets import preset_config
    from workers.rft.models import resolve_model_path

    source = make_run(curator, Run.Status.STOPPED)
    step = run_dir(source) / "checkpoints" / "step_6"
    shutil.copytree(resolve_model_path("tiny"), step)
    Checkpoint.objects.create(run=source, version=6, step=6, path=str(step))
    config = preset_config("quick-demo")
    typed = f"runs/{run_dir(source).name}/checkpoints/step_6"
    config["model"] |= {"path": typed, "ref_path": typed}
    reader = services.launch_run(curator, "reader", config)
    Run.objects.filter(pk=reader.pk).update(status=Run.Status.STOPPED)  # stopped: Resume loads them again
    return source, reader


def test_a_run_another_run_loads_its_model_from_is_not_deleted(curator_client, checkpoint_reader):
    """Deleted, it took the checkpoint a stopped run named as model.path: that run's Resume failed
    with "no model directory at runs/2-.../checkpoints/step_6"."""
    source, reader = checkpoint_reader
    said = (f"run {reader.pk} &#x27;reader&#x27; (stopped) loads its model.path, model.ref_path from run "
            f"{source.pk}&#x27;s directory, and would again when resumed")
    assert said in delete_selected(curator_client, [source], confirm=False).content.decode()
    delete_selected(curator_client, [source], confirm=True)
    page = curator_client.get(reverse("admin:runs_run_delete", args=[source.pk]), follow=True).content.decode()
    assert f"Not deleted: {said}" in page
    curator_client.post(reverse("admin:runs_run_delete", args=[source.pk]), {"post": "yes"})
    assert kept(source)
    checkpoint = source.checkpoints.get()  # nor the checkpoint itself
    page = curator_client.get(reverse("admin:runs_checkpoint_delete", args=[checkpoint.pk]), follow=True)
    assert (f"loads its model.path, model.ref_path from checkpoint v6 (step 6) of run {source.pk}"
            in page.content.decode())
    curator_client.post(reverse("admin:runs_checkpoint_delete", args=[checkpoint.pk]), {"post": "yes"})
    assert source.checkpoints.exists() and (run_dir(source) / "checkpoints" / "step_6").is_dir()


def test_a_run_deleted_with_its_source_does_not_hold_it(
        curator_client, checkpoint_reader, django_capture_on_commit_callbacks):
    source, reader = checkpoint_reader
    with django_capture_on_commit_callbacks(execute=True):
        delete_selected(curator_client, [source, reader], confirm=True)
    assert not Run.objects.filter(pk__in=[source.pk, reader.pk]).exists() and not run_dir(source).exists()


def test_a_completed_run_loading_from_it_does_not_hold_it(
        curator_client, checkpoint_reader, django_capture_on_commit_callbacks):
    """A completed run is never resumed (as for a saved model it names: STILL_LOADS)."""
    source, reader = checkpoint_reader
    Run.objects.filter(pk=reader.pk).update(status=Run.Status.COMPLETED)
    with django_capture_on_commit_callbacks(execute=True):
        delete_selected(curator_client, [source], confirm=True)
    assert not Run.objects.filter(pk=source.pk).exists() and Run.objects.filter(pk=reader.pk).exists()


def test_the_runs_that_load_from_many_deleted_runs_are_found_in_one_query(
        curator, checkpoint_reader, django_assert_num_queries):
    """A query per run selected read every unfinished run's config each time (a bulk delete of
    hundreds of runs: hundreds of such scans); the one reader is still named for its source."""
    from apps.runs import deletion

    source, reader = checkpoint_reader
    others = [make_run(curator, Run.Status.STOPPED) for _ in range(5)]
    with django_assert_num_queries(2):  # the source_runs readers, then the model loaders
        reasons = deletion.refusals([*others, source])
    assert reasons == [f"run {reader.pk} 'reader' (stopped) loads its model.path, model.ref_path from run "
                       f"{source.pk}'s directory, and would again when resumed"]


def test_keep_checkpoints_keeps_a_checkpoint_another_run_loads_until_that_run_completes(checkpoint_reader):
    """The trainer's rotation (trainer.keep_checkpoints) deleted it, as the admin's delete no longer
    could: the reader's Resume failed with "no model directory at runs/3-.../checkpoints/step_6"."""
    from apps.runs.store import DjangoCheckpointStore

    source, reader = checkpoint_reader
    store, checkpoints = DjangoCheckpointStore(source), run_dir(source) / "checkpoints"
    assert store.forget({6: checkpoints / "step_6", 7: checkpoints / "step_7"}) == [7]
    assert source.checkpoints.filter(step=6).exists()
    Run.objects.filter(pk=reader.pk).update(status=Run.Status.COMPLETED)  # never resumed again
    assert store.forget({6: checkpoints / "step_6"}) == [6]
    assert not source.checkpoints.exists()
