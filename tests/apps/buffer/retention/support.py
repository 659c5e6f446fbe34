"""Helpers of the buffer retention tests."""

from apps.buffer import retention
from apps.buffer.models import BufferJob, Experience
from apps.core.jobs import run_job
from apps.runs.models import Run


def ids(rows) -> set[int]:
    return {row.pk for row in rows}


def remaining() -> set[int]:
    return set(Experience.objects.values_list("pk", flat=True))


def retire(run, action="drop", user=None) -> BufferJob:
    job = retention.start_retention(Run.objects.filter(pk=run.pk), action=action, user=user)
    job = run_job("buffer.bufferjob", job.pk)
    assert job.status == "succeeded", job.error
    return job
