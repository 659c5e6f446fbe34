"""Issue 30, medium 7: a checkpoint's path is a row a worker and a download trust. A checkpoint is
loaded only from its own run's directory and downloaded only from a run's checkpoints directory:
never the data dir itself (it held every run's files: a 4 GB tar for any researcher), nor
another run's files planted to be loaded. (That the admin cannot set the path, nor add a
checkpoint, is in test_round3_workers_rendezvous.py.)"""
import pytest
import torch
from django.urls import reverse

from apps.runs import supervision
from apps.runs.models import Checkpoint, Run
from tests.workers.test_tasks import grpo_config, make_taskset
from workers.rft.config import RunConfig


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    (settings.DATA_DIR / "uploads").mkdir(parents=True)
    (settings.DATA_DIR / "uploads" / "someone-elses.jsonl").write_text("private")
    return settings.DATA_DIR


@pytest.mark.django_db
@pytest.mark.parametrize("path", [".", "{data}", "runs", "uploads", "runs/x/checkpoints", "runs/x/other/step_1"])
def test_a_checkpoint_path_that_is_not_a_runs_checkpoint_is_not_downloaded(researcher_client, researcher, data_dir,
                                                                           path):
    path = path.format(data=data_dir)
    (data_dir / "runs" / "x" / "other" / "step_1").mkdir(parents=True)
    (data_dir / "runs" / "x" / "checkpoints").mkdir(parents=True)
    run = Run.objects.create(name="r", owner=researcher, config={})
    Checkpoint.objects.create(run=run, version=1, step=1, path=path)
    response = researcher_client.get(reverse("checkpoint-download", args=[run.pk, 1]))
    assert response.status_code == 403, path


@pytest.mark.django_db
def test_a_runs_own_checkpoint_still_downloads(researcher_client, researcher, data_dir):
    run = Run.objects.create(name="r", owner=researcher, config={})
    directory = supervision.run_dir(run) / "checkpoints" / "step_1"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"weights")
    Checkpoint.objects.create(run=run, version=1, step=1, path=str(directory))
    response = researcher_client.get(reverse("checkpoint-download", args=[run.pk, 1]))
    assert response.status_code == 200 and b"weights" in b"".join(response)


class Payload:
    """Unpickling it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_resumes_only_from_its_own_runs_directory(researcher, tmp_path):
    """The issue's curator pointed a run's checkpoint at a directory holding a crafted rng.pt and
    resumed it. A checkpoint row outside the run's own directory (here another run's, which a
    download would allow) fails the run, naming why, and nothing in it is loaded."""
    make_taskset()
    run = Run.objects.create(name="resumed", owner=researcher, status=Run.Status.STARTING,
                             config=RunConfig.from_dict(grpo_config(4)).to_dict())
    other = Run.objects.create(name="other", owner=researcher, config={})
    planted = supervision.run_dir(other) / "checkpoints" / "step_9"
    planted.mkdir(parents=True)
    marker = tmp_path / "pwned"
    torch.save({"torch": Payload(marker)}, planted / "rng.pt")
    Checkpoint.objects.create(run=run, version=9, step=9, path=str(planted))
    assert supervision.serve(run.pk, "loop") == "failed"
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert f"checkpoint v9 of run {run.pk} lies outside that run's own directory" in run.error, run.error
    assert not marker.exists()
