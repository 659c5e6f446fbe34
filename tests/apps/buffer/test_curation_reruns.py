"""A curation job run again after its work committed (its process killed before it said so, or
its end not saved and the job let go: apps.core.jobs.run_job) changes nothing twice."""
import pytest
from django.db import OperationalError

from apps.buffer import curation
from apps.buffer.models import Experience
from apps.core import job_owners, jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_pipeline_run_again_after_it_committed_returns_its_counts_and_shapes_no_reward_twice(
    make_experience, monkeypatch, settings
):
    rows = [make_experience(reward=1.0) for _ in range(3)]
    real, tried = jobs._finish, []

    def busy(job, status, **kwargs):  # the database busy at every try of the first run's end
        tried.append(status)
        if len(tried) <= len(jobs.FINISH_RETRY_S) + 1:
            raise OperationalError("database is locked")
        real(job, status, **kwargs)

    monkeypatch.setattr(jobs, "_finish", busy)
    monkeypatch.setattr(jobs, "FINISH_RETRY_S", (0.0,) * len(jobs.FINISH_RETRY_S))
    monkeypatch.setattr(jobs, "enqueue", lambda *args, **kwargs: None)
    job = curation.start_pipeline(Experience.objects.filter(pk__in=[r.pk for r in rows]), operator="reward_shaping",
                                  params={"offset": 0.5})
    with pytest.raises(OperationalError):
        jobs.run_job("buffer.bufferjob", job.pk)
    assert job_owners.owner_of("buffer.bufferjob", job.pk) is None, "let go: the watchdog runs it again"
    settings.RFTWEB_EMBEDDED = True
    assert jobs.rerun_orphaned() == [f"buffer.bufferjob {job.pk}"]

    job = jobs.run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and job.result["changed"] == 3
    assert [r.reward for r in Experience.objects.order_by("pk")] == [1.5, 1.5, 1.5], "shaped once"
