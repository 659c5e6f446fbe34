import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from apps.buffer import curation
from apps.buffer.models import Experience
from apps.core import job_owners, jobs
from apps.runs.models import Run
from apps.tasksets import services as taskset_services
from apps.tasksets.importers import FieldMapping

ROWS = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(30)]


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def jsonl_upload(rows, name="questions.jsonl"):
    return SimpleUploadedFile(name, "".join(json.dumps(r) + "\n" for r in rows).encode())


@pytest.fixture
def start_taskset_import():
    """start_taskset_import(user, rows=ROWS, name="uploaded"): a queued import job of those rows."""

    def start(user, rows=ROWS, name="uploaded"):
        return taskset_services.start_taskset_import(
            upload=jsonl_upload(rows), name=name, fmt="jsonl", mapping=FieldMapping("q", "a"), user=user
        )

    return start


@pytest.fixture
def start_promotion(researcher, curator):
    """start_promotion(n=3): a queued buffer job promoting n new rollouts."""

    def start(n=3):
        run = Run.objects.create(name="r", owner=researcher, config={})
        rows = [Experience.objects.create(run=run, rollout_index=i, response_text=f"r{i}") for i in range(n)]
        return curation.start_promotion(Experience.objects.filter(pk__in=[r.pk for r in rows]), user=curator)

    return start


@pytest.fixture
def run_here(db):
    """run_here(job): the job as a live process runs it, claimed by this one (what jobs.run_job's
    claim records); a job marked running without an owner is one nobody runs (jobs.orphaned)."""

    def claim(job):
        type(job).objects.filter(pk=job.pk).update(status="running", started_at=timezone.now())
        job_owners.record(jobs.label(job), job.pk)
        return type(job).objects.get(pk=job.pk)

    return claim
