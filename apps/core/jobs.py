"""Running jobs: one registry of job types, one runner, one progress writer, one live channel.

A job type is a function `run(job, progress) -> result` registered under a name (`register`); each
app registers its types in its services module, which CoreConfig.ready imports in every process,
so a worker knows them all. A job (a row of a `Job` subclass) names its type. `enqueue_job` sends
it to the `default` queue once the transaction that created it commits; the one Celery task
(apps.core.tasks.run_job) calls `run_job`, which marks it running, calls its type, and finishes it:
succeeded with what the type returned, or failed with the error to show its user. A type raises
`JobError` for a job that cannot do what was asked; anything else is a bug, logged and re-raised.

Progress reaches the job's page over the websocket group `job_group(job)` (apps.core.consumers),
and from the row, which its page polls (apps.core.views.job_progress) when it has no socket.
"""

import logging
import math
from collections.abc import Callable
from contextlib import contextmanager
from time import monotonic

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from rftweb.celery import enqueue

from .models import Job

logger = logging.getLogger(__name__)

# The most often a running job writes its progress row and broadcasts it: the polling page asks
# every 500 ms, and a job writing every batch would spend a query on each 2,000 rows.
PROGRESS_INTERVAL_SECONDS = 0.25

Progress = Callable[..., None]  # progress(rows_done, bytes_done=None)
JOB_TYPES: dict[str, Callable[[Job, Progress], object]] = {}


class JobError(Exception):
    """A job that cannot do what it was asked; the message is shown to its user."""


def register(name: str):
    """Register the decorated function `run(job, progress) -> result` as job type `name`."""

    def decorate(run):
        if name in JOB_TYPES:
            raise ValueError(f"job type {name!r} is registered twice")
        JOB_TYPES[name] = run
        return run

    return decorate


def label(job: Job) -> str:
    """The job's model as "app_label.model_name", which names it in URLs, groups and the task."""
    return job._meta.label_lower


def job_group(job_label: str, job_id: int) -> str:
    return f"job-{job_label}-{job_id}"


def find_job(job_label: str, job_id: int) -> Job | None:
    """The job `job_id` of the job model `job_label` ("app_label.model_name"), or None."""
    try:
        model = apps.get_model(job_label)
    except (LookupError, ValueError):
        return None
    if not issubclass(model, Job):
        return None
    return model.objects.defer(*model.heavy_fields).filter(pk=job_id).first()


def visible_job(job_label: str, job_id: int, user) -> Job | None:
    """The job if `user` may see it (its model's may_view), else None: a job of someone else's
    answers as one that does not exist, so job ids cannot be probed."""
    job = find_job(job_label, job_id)
    return job if job is not None and job.may_view(user) else None


def enqueue_job(job: Job) -> None:
    """Queue the job on `default` once this transaction commits (embedded: a thread of this process)."""
    job_label, job_id = label(job), job.pk
    transaction.on_commit(lambda: enqueue("apps.core.tasks.run_job", job_label, job_id, queue="default"))


def run_job(job_label: str, job_id: int) -> Job:
    """Run a queued job to the end: it succeeded and holds its result, or failed and holds the error.

    A finished job is left alone (a redelivered Celery task); one left `running` by a killed worker
    starts again, its transaction having been rolled back with the worker's connection."""
    model = apps.get_model(job_label)
    job = model.objects.select_related("created_by").defer(*model.heavy_fields).get(pk=job_id)
    if job.is_finished:
        return job
    job.status, job.started_at, job.rows_done, job.bytes_done = Job.Status.RUNNING, timezone.now(), 0, 0
    job.save(update_fields=["status", "started_at", "rows_done", "bytes_done"])
    broadcast(job)
    run = JOB_TYPES[job.job_type]
    try:
        with progress_writer(job) as progress:
            result = run(job, progress)
    except JobError as exc:
        _finish(job, Job.Status.FAILED, error=str(exc))
    except Exception as exc:
        logger.exception("job %s %s failed", job_label, job.pk)
        _finish(job, Job.Status.FAILED, error=f"the job failed unexpectedly ({exc!r})")
        raise
    else:
        _finish(job, Job.Status.SUCCEEDED, result=result)
    return job


def _finish(job: Job, status: str, *, error: str = "", result=None) -> None:
    job.clean_up(failed=status == Job.Status.FAILED)
    if status == Job.Status.SUCCEEDED:
        job.keep_result(result)
        job.rows_done = job.rows_total or job.rows_done
        job.bytes_done = job.bytes_total
    job.status, job.error, job.finished_at = status, error, timezone.now()
    job.save()
    broadcast(job)


@contextmanager
def progress_writer(job: Job):
    """Yield progress(rows_done, bytes_done=None): the job's progress, shown at once, at most every
    PROGRESS_INTERVAL_SECONDS.

    A job changes the database in one transaction on the default connection, so progress saved
    there would stay invisible until the end (and be rolled back on failure). Each update goes
    through a second connection, in autocommit mode, instead: safe because the job's transaction
    never touches the job row (the job is finished after it ends), so the two connections never
    wait on each other's locks. Inside an outer transaction (the tests) or on SQLite (one writer at
    a time) the row cannot show progress before the end: it is only broadcast."""
    writes = connection.vendor == "postgresql" and not connection.in_atomic_block
    progress_connection = connections.create_connection(DEFAULT_DB_ALIAS) if writes else None
    sql = f"UPDATE {job._meta.db_table} SET rows_done = %s, bytes_done = %s WHERE id = %s"
    last_write = -math.inf

    def progress(rows_done: int, bytes_done: int | None = None) -> None:
        nonlocal last_write
        job.rows_done = rows_done
        if bytes_done is not None:
            job.bytes_done = bytes_done
        now = monotonic()
        if now - last_write < PROGRESS_INTERVAL_SECONDS:
            return
        last_write = now
        if progress_connection is not None:
            with progress_connection.cursor() as cursor:
                cursor.execute(sql, [job.rows_done, job.bytes_done, job.pk])
        _send(job_group(label(job), job.pk), snapshot(job))

    try:
        yield progress
    finally:
        if progress_connection is not None:
            progress_connection.close()


def snapshot(job: Job) -> dict:
    """What a job's page shows of it: the progress endpoint's answer and every live message's."""
    return {
        "id": job.pk,
        "status": job.status,
        "finished": job.is_finished,
        "rows_done": job.rows_done,
        "rows_total": job.rows_total,
        "rows_text": job.rows_text,
        "bytes_done": job.bytes_done,
        "bytes_total": job.bytes_total,
        "percent": job.percent,
        "error": job.error,
        "result_url": job.result_url() if job.status == Job.Status.SUCCEEDED else None,
    }


def broadcast(job: Job) -> None:
    """Send the job's state to its page once the current transaction commits (at once outside one)."""
    group, payload = job_group(label(job), job.pk), snapshot(job)
    transaction.on_commit(lambda: _send(group, payload))


def _send(group: str, payload: dict) -> None:
    try:
        async_to_sync(get_channel_layer().group_send)(group, {"type": "job.update", "payload": payload})
    except Exception as err:  # noqa: BLE001 - Redis down: the page polls the progress endpoint instead
        logger.warning("live update of %s not sent: %r", group, err)
