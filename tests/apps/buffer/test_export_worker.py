"""Jobs outside a test transaction: progress is visible while the job's own transaction is still
open, and a real Celery worker on the `default` queue runs an export to the end."""

import time
from pathlib import Path

import pytest

from apps.buffer import curation, services
from apps.buffer.models import BufferJob, Experience
from apps.core import jobs
from tests.support import read_elsewhere, watch_progress


@pytest.mark.postgres("progress written on a second connection: on SQLite the job holds the write lock")
@pytest.mark.django_db(transaction=True)
def test_progress_is_visible_while_the_job_is_still_running(make_experience, monkeypatch):
    rows = [make_experience() for _ in range(5)]
    monkeypatch.setattr(services, "CHUNK_ROWS", 2)
    seen = watch_progress(monkeypatch, lambda job: read_elsewhere(  # every chunk's progress
        "SELECT j.rows_done, (SELECT count(*) FROM buffer_experience WHERE source = 'expert') "
        "FROM buffer_bufferjob j WHERE j.id = %s", [job.pk]))
    job = curation.start_promotion(Experience.objects.filter(pk__in=[row.pk for row in rows]))

    job = jobs.run_job("buffer.bufferjob", job.pk)

    # Each chunk's progress was committed at once, with its copies (a promotion commits a chunk at
    # a time: an annotator's save waited for the whole job); a re-run skips the rows promoted.
    assert seen == [(2, 2), (4, 4), (5, 5)]
    assert (job.status, job.rows_done, Experience.objects.filter(source="expert").count()) == ("succeeded", 5, 5)


@pytest.mark.slow
def test_a_celery_worker_on_the_default_queue_runs_the_export(
    celery_worker_factory, make_experience, curator, client, settings
):
    settings.MEDIA_ROOT = settings.DATA_DIR / "uploads"  # where the worker writes (the test settings')
    rows = [make_experience() for _ in range(3)]
    celery_worker_factory(queues="default")  # no other queue: the job must be sent to `default`
    client.force_login(curator)

    response = client.post(
        "/admin/buffer/experience/",
        {
            "action": "export_selection",
            "_selected_action": [row.pk for row in rows],
            "select_across": 0,
            "export_format": "parquet",
        },
    )
    job_id = int(response["Location"].partition("?")[0].rstrip("/").split("/")[-2])

    deadline = time.time() + 60
    job = BufferJob.objects.get(pk=job_id)
    while not job.is_finished and time.time() < deadline:
        time.sleep(0.5)
        job.refresh_from_db()
    try:
        assert (job.status, job.error, job.result["exported"], job.rows_done) == ("succeeded", "", 3, 3)
        assert Path(job.output.path).stat().st_size > 0
    finally:
        services.delete_jobs(BufferJob.objects.filter(pk=job_id))  # the worker wrote into the shared data dir
