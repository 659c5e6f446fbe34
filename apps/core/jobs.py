"""Running jobs: one registry of job types, one runner, one progress writer, one live channel.

A job type is a function `run(job, progress) -> result` registered under a name (`register`); each
app registers its types in its services module, which CoreConfig.ready imports in every process,
so a worker knows them all. A job (a row of a `Job` subclass) names its type. `enqueue_job` sends
it to the `default` queue once the transaction that created it commits; the one Celery task
(apps.core.tasks.run_job) calls `run_job`, which marks it running, calls its type, and finishes it:
succeeded with what the type returned, or failed with the error to show its user. A type raises
`JobError` for a job that cannot do what was asked; anything else is a bug, logged and re-raised.

Cancel (`cancel_job`; #41: deleting a running job was the only way to stop one, and lost data): a
pending job is cancelled at once; a running one is flagged, and stops where its type calls
`stop_if_cancelled` (a type registered `cancellable` does, at points where stopping leaves nothing
half done). A type whose job can leave something behind when it fails or is cancelled registers an
`on_stop` hook, which puts back what it can and says what it cannot.

A job whose process died (a killed worker, a killed embedded server) is run again from the start,
as every type is written to be: on the full stack when Celery redelivers its task (acks_late), and
embedded when the server's watchdog finds it (`rerun_orphaned`). Who runs a job is recorded when it
is claimed (apps.core.job_owners), so a job a live process runs is never taken from it, and a
cancel of one nobody runs ends it at once.

Progress reaches the job's page over the websocket group `job_group(job)` (apps.core.consumers),
and from the row, which its page polls (apps.core.views.job_progress) when it has no socket.
"""

import logging
import math
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import timedelta
from time import monotonic, sleep

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.apps import apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from apps.runs import hosts
from rftweb.celery import enqueue

from . import job_owners
from .models import Job

logger = logging.getLogger(__name__)
JOBS_QUEUE = "default"  # the Celery queue every job's task goes to

# The most often a running job writes its progress row and broadcasts it: the polling page asks
# every 500 ms, and a job writing every batch would spend a query on each 2,000 rows.
PROGRESS_INTERVAL_SECONDS = 0.25
# How long a job that has done its work waits before trying again to save its end (_finish_persistently).
FINISH_RETRY_S = (1.0, 5.0, 15.0, 60.0)

Progress = Callable[..., None]  # progress(rows_done, bytes_done=None)
JOB_TYPES: dict[str, Callable[[Job, Progress], object]] = {}
CANCELLABLE: set[str] = set()  # types whose running jobs stop when cancelled (stop_if_cancelled)
STOP_HOOKS: dict[str, Callable[[Job], None]] = {}


class JobError(Exception):
    """A job that cannot do what it was asked; the message is shown to its user."""


class JobCancelled(Exception):
    """Raised by stop_if_cancelled in a job whose cancel was requested: the runner ends it cancelled."""


def register(name: str, *, cancellable: bool = False):
    """Register the decorated function `run(job, progress) -> result` as job type `name`.

    cancellable: `run` calls stop_if_cancelled(job) at its safe points (between chunks of a
    transaction it rolls back, or after a chunk it has committed and recorded), so a running job
    may be cancelled; a pending job of any type may be."""

    def decorate(run):
        if name in JOB_TYPES:
            raise ValueError(f"job type {name!r} is registered twice")
        JOB_TYPES[name] = run
        if cancellable:
            CANCELLABLE.add(name)
        return run

    return decorate


def on_stop(name: str):
    """Register the decorated function `stopped(job)` of job type `name`: called when one of its
    jobs ends without succeeding (failed, or cancelled, running or pending), before the job is
    saved. It puts back what the job changed that can be put back, and adds to job.error what it
    could not (its status and error are already set)."""

    def decorate(stopped):
        STOP_HOOKS[name] = stopped
        return stopped

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
    transaction.on_commit(lambda: enqueue("apps.core.tasks.run_job", job_label, job_id, queue=JOBS_QUEUE))


def cancellable(job: Job) -> bool:
    """Whether a cancel of the job would be honoured: it is pending, or running a cancellable type."""
    return job.status == Job.Status.PENDING or (job.status == Job.Status.RUNNING and job.job_type in CANCELLABLE)


def cancel_job(job: Job) -> Job:
    """Cancel a job: a pending one is cancelled now (its worker, when the task arrives, leaves it),
    a running one is asked to stop at its next safe point (job.cancel_requested_at), and a running
    one whose process is gone (`orphaned`) is ended now, its on_stop hook run here: nobody would
    reach a safe point. Returns the job as it now is. Raises JobError, changing nothing, for a
    finished job or a running job whose type cannot stop safely. Under the job's row lock: the
    worker's claim (run_job) waits for it."""
    model = type(job)
    name = f"{model._meta.verbose_name} {job.pk}"
    owner_gone = None
    try:
        with transaction.atomic():
            locked = model.objects.select_for_update().defer(*model.heavy_fields).get(pk=job.pk)
            if locked.is_finished:
                raise JobError(f"{name} has already finished ({locked.status}): there is nothing to cancel")
            if locked.status == Job.Status.RUNNING and (owner_gone := orphaned(locked)):
                # This process ends it: a second cancel or the embedded watchdog now finds its owner alive.
                job_owners.record(label(locked), locked.pk)
            elif not cancellable(locked):
                raise JobError(f"{name} is running and cannot be stopped safely before it ends; it finishes on its own")
            if locked.cancel_requested_at is None or owner_gone:
                locked.cancel_requested_at = timezone.now()
                locked.save(update_fields=["cancel_requested_at"])
                if locked.status == Job.Status.PENDING:
                    _finish(locked, Job.Status.CANCELLED, error="cancelled before it started")
                elif not owner_gone:
                    broadcast(locked)
        if owner_gone:
            # Outside the lock's transaction: a taskset import's hook deletes its hidden taskset in
            # committed batches, which would otherwise hold SQLite's write lock for the whole delete.
            try:
                _finish(locked, Job.Status.CANCELLED, error=f"cancelled after {locked.rows_text} rows: {owner_gone}")
            except Exception:
                # Still running, and owned by this live process: the watchdog would leave it for good
                # and a second Cancel only ask it to stop. Released, both find it orphaned again.
                job_owners.release(label(locked), locked.pk)
                raise
    except OperationalError as exc:
        # Embedded SQLite has one writer at a time: a job writing in one transaction (a re-score)
        # holds it until it ends, and the request gave up waiting.
        raise JobError(f"{name} could not be cancelled now, the database is busy with its writes ({exc}); "
                       "try again in a moment") from exc
    return locked


def orphaned(job: Job) -> str:
    """Why nobody runs the job any more ("" while somebody may): it is running, and the process that
    claimed it has exited (apps.core.job_owners)."""
    if job.status != Job.Status.RUNNING:
        return ""
    owner = job_owners.owner_of(label(job), job.pk)
    if not job_owners.is_gone(owner):
        return ""
    return f"the process that ran it ({owner}) had stopped" if owner else "no process ran it any more"


def refuse_unfinished(doomed: Iterable[Job]) -> None:
    """Raise JobError naming the jobs about to be deleted that are pending or running: a job is
    deleted only once it has finished (and a finished job never runs again). A running job's worker
    would go on without its row and its files (#41: a retention job deleted mid-run lost its
    archive, then went on deleting rows)."""
    unfinished = sorted((job for job in doomed if not job.is_finished), key=lambda job: job.pk)
    if not unfinished:
        return
    opts = unfinished[0]._meta
    listed = ", ".join(f"{job.pk} ({job.status})" for job in unfinished[:10]) + ", ..." * (len(unfinished) > 10)
    which = f"{opts.verbose_name} {listed} has" if len(unfinished) == 1 else f"{opts.verbose_name_plural} {listed} have"
    raise JobError(f"{which} not finished: a job is deleted once it has finished. Cancel it first (it stops "
                   "at its next safe point), then delete it. Nothing was deleted.")


def stop_if_cancelled(job: Job) -> None:
    """Raise JobCancelled if the job's cancel was requested: what a cancellable type calls at each
    point where it may stop. One primary-key read (a type calls it once a chunk of rows)."""
    requested = type(job)._base_manager.filter(pk=job.pk).values_list("cancel_requested_at", flat=True).first()
    if requested is not None:
        job.cancel_requested_at = requested
        raise JobCancelled


def run_job(job_label: str, job_id: int) -> Job:
    """Run a queued job to the end: it succeeded and holds its result, failed and holds the error,
    or was cancelled.

    A finished job is left alone (a redelivered Celery task, a job cancelled while queued); one left
    `running` by a killed worker starts again, its transaction having been rolled back with the
    worker's connection (on the full stack that is the redelivered task: acks_late), and one a
    live process runs is left to it (a task redelivered after the broker's visibility timeout while
    its job still runs). Embedded only a pending job is claimed, so two threads sent for one job
    (rerun_orphaned's beside its creator's) never both run it."""
    model = apps.get_model(job_label)
    claimable = Job.ACTIVE if not settings.RFTWEB_EMBEDDED else (Job.Status.PENDING,)
    # One conditional UPDATE claims it: a cancel of the pending job (under its row lock) is either
    # before it (nothing claimed) or after it (a running job, asked to stop). A running job is
    # claimed only from an owner that is gone: Redis redelivers a task unacknowledged after the
    # visibility timeout (6 h) to a second worker while the first still runs a longer job, which
    # then ran twice at once. The row lock makes two deliveries at once read one owner.
    with transaction.atomic():
        status = model.objects.select_for_update().filter(pk=job_id).values_list("status", flat=True).first()
        owner = job_owners.owner_of(job_label, job_id) if status == Job.Status.RUNNING else None
        if owner is not None and not job_owners.is_gone(owner, redelivered=True):
            logger.warning("job %s %s was delivered again while %s runs it; left to it", job_label, job_id, owner)
            claimed = 0
        else:
            claimed = model.objects.filter(pk=job_id, status__in=claimable).update(
                status=Job.Status.RUNNING, started_at=timezone.now(), rows_done=0, bytes_done=0
            )
        if claimed:
            job_owners.record(job_label, job_id)
    if not claimed:
        return model.objects.select_related("created_by").defer(*model.heavy_fields).get(pk=job_id)
    try:
        job = model.objects.select_related("created_by").defer(*model.heavy_fields).get(pk=job_id)
        broadcast(job)
        status, error, result, unexpected = _run(job)
        _finish_persistently(job, status, error=error, result=result)
    except Exception:
        # Claimed but not ended, its owner this live process: nobody would ever end it (the
        # watchdog and a Cancel leave a job a live process runs to it). Let go, it is orphaned:
        # the embedded watchdog runs it again, a Cancel ends it. (A BaseException is the process
        # going: its owner record goes with it.)
        _let_go(job_label, job_id)
        raise
    if unexpected is not None:
        raise unexpected
    return job


def _run(job: Job) -> tuple[str, str, object, Exception | None]:
    """Run the claimed job's type: (status, error, result, the unexpected exception to re-raise)."""
    try:
        with progress_writer(job) as progress:
            stop_if_cancelled(job)  # cancelled while a killed worker's task waited to be redelivered
            return Job.Status.SUCCEEDED, "", JOB_TYPES[job.job_type](job, progress), None
    except JobCancelled:
        return Job.Status.CANCELLED, f"cancelled on request, after {job.rows_text} rows", None, None
    except JobError as exc:
        return Job.Status.FAILED, str(exc), None, None
    except Exception as exc:
        logger.exception("job %s %s failed", label(job), job.pk)
        return Job.Status.FAILED, f"the job failed unexpectedly ({exc!r})", None, exc


def _finish_persistently(job: Job, status: str, *, error: str, result) -> None:
    """_finish, tried again while the database is busy or gone for a moment: a job whose work is
    done must not fail to say so (embedded, a write waits up to 30 s for SQLite's lock, and then
    the job stayed `running` for good under its live owner)."""
    for wait in (*FINISH_RETRY_S, None):
        try:
            _finish(job, status, error=error, result=result)
            return
        except OperationalError as exc:
            if wait is None:
                raise
            logger.warning("job %s %s could not be ended %s (%s); trying again in %g s", label(job), job.pk,
                           status, exc, wait)
            connection.close_if_unusable_or_obsolete()
            sleep(wait)


def _let_go(job_label: str, job_id: int) -> None:
    try:
        job_owners.release(job_label, job_id)
    except Exception:  # noqa: BLE001 - the database gone: its owner stays until it is back
        logger.exception("job %s %s: ended by an error and could not be let go", job_label, job_id)


def rerun_orphaned() -> list[str]:
    """Embedded, the demo server's watchdog (at its start and every RFTWEB_WATCHDOG_INTERVAL s): run
    again from the start each job nobody runs, on a thread of this server, as Celery's redelivery
    does on the full stack. Returns them ("tasksets.tasksetimport 3").

    Nobody runs a running job whose process has exited (a server killed mid-import: its thread went
    with it) nor a pending one no live process has claimed a whole watchdog interval after it was
    made (its thread died before it could, or a command that sends nothing sent it:
    rftweb.celery.serve_here); a younger one is its own thread's to claim within milliseconds (each
    round had sent every pending job a second thread, and logged it as left behind). Re-running is
    safe for every type, each written for Celery's redelivery: a taskset import deletes the hidden
    taskset it had begun, an expert-data import its hidden staging dataset; a re-score skips the rows
    its id marks as rescored and a promotion those it copied (each commits a chunk at a time); a
    pipeline applies its changes in one transaction, which the killed process's connection rolled
    back; an export writes its file again; a retention goes on from its last committed
    chunk. A job whose cancel was asked for is not run again but ended, as its Cancel ends it
    (cancel_job: cancelled, its on_stop hook run)."""
    rerun = []
    made_before = timezone.now() - timedelta(seconds=settings.RFTWEB_WATCHDOG_INTERVAL)
    for model in apps.get_models():
        if not issubclass(model, Job):
            continue
        job_label = model._meta.label_lower
        left = model.objects.filter(Q(status=Job.Status.RUNNING) | Q(status=Job.Status.PENDING,
                                                                      created_at__lt=made_before))
        for job in left.only("pk", "status", "started_at", "cancel_requested_at"):
            if not job_owners.is_gone(job_owners.owner_of(job_label, job.pk)):
                continue
            if job.cancel_requested_at is not None:
                _end_cancelled(job)
                continue
            # Back to pending only as it was read: of two servers starting at once, one does it; a
            # Cancel that took the job since (its end runs outside the row lock) keeps it. A pending
            # job's own thread and this one then race for its claim, which one wins.
            requeued = model.objects.filter(pk=job.pk, status=job.status, started_at=job.started_at,
                                            cancel_requested_at__isnull=True).update(
                status=Job.Status.PENDING, started_at=None, rows_done=0, bytes_done=0)
            if requeued:
                logger.warning("job %s %s: nobody ran it any more (%s); running it again", job_label, job.pk,
                               job.status)
                enqueue("apps.core.tasks.run_job", job_label, job.pk, queue=JOBS_QUEUE)
                rerun.append(f"{job_label} {job.pk}")
    return rerun


def _end_cancelled(job: Job) -> None:
    """rerun_orphaned: end a job nobody runs whose cancel was asked for, as its Cancel would."""
    try:
        ended = cancel_job(job)
    except JobError as err:  # finished meanwhile, or the database busy: the next round looks again
        logger.warning("job %s %s: nobody ran it any more and its cancel was asked for; not ended: %s",
                       label(job), job.pk, err)
        return
    logger.warning("job %s %s: nobody ran it any more and its cancel was asked for; ended %s", label(job),
                   job.pk, ended.status)


def _finish(job: Job, status: str, *, error: str = "", result=None) -> None:
    job.status, job.error, job.finished_at = status, error, timezone.now()
    if status == Job.Status.SUCCEEDED:
        job.keep_result(result)
        job.rows_done = job.rows_total or job.rows_done
        job.bytes_done = job.bytes_total
    elif job.job_type in STOP_HOOKS:
        try:
            STOP_HOOKS[job.job_type](job)
        except Exception as exc:  # the job still ends, saying what was not put back
            logger.exception("stop hook of job %s %s failed", label(job), job.pk)
            job.error += f"; what it changed could not be put back ({exc!r})"
    job.clean_up(failed=status != Job.Status.SUCCEEDED)
    if not type(job)._base_manager.filter(pk=job.pk).exists():  # deleted by other means than its admin
        logger.warning("job %s %s was deleted while it ran; it ended %s: %s", label(job), job.pk, status, job.error)
        job_owners.release(label(job), job.pk)
        return
    # Every loaded field but the cancel request, which a curator may set meanwhile (a job loaded
    # without its heavy fields leaves them out).
    deferred = job.get_deferred_fields()
    job.save(update_fields=[field.name for field in job._meta.concrete_fields if not field.primary_key
                            and field.attname not in deferred and field.name != "cancel_requested_at"])
    job_owners.release(label(job), job.pk)  # after the save: until then a cancel finds it run
    broadcast(job)


@contextmanager
def progress_writer(job: Job):
    """Yield progress(rows_done, bytes_done=None): the job's progress, shown at once, at most every
    PROGRESS_INTERVAL_SECONDS.

    A job may change the database in one transaction on the default connection, where progress
    saved would stay invisible until the end (and be rolled back on failure). Each update goes
    through a second connection, in autocommit mode, instead: safe because the job's transaction
    never touches the job row (the job is finished after it ends), so the two connections never
    wait on each other's locks. SQLite has one writer at a time, the job's own connection: there
    progress is written by it between the job's transactions (retention's chunks and a taskset
    import's batches, each committed), and only broadcast within one; so a job that runs long on
    SQLite commits in chunks. Inside an outer transaction (the tests) it is only broadcast."""
    writes = connection.vendor == "postgresql" and not connection.in_atomic_block
    progress_connection = connections.create_connection(DEFAULT_DB_ALIAS) if writes else None
    # Returning the cancel request: each live message shows whether one is waiting.
    sql = (f"UPDATE {job._meta.db_table} SET rows_done = %s, bytes_done = %s WHERE id = %s "
           "RETURNING cancel_requested_at")
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
        writer = progress_connection
        if writer is None and connection.vendor == "sqlite" and not connection.in_atomic_block:
            writer = connection  # autocommit, between the job's own commits
        if writer is not None:
            with writer.cursor() as cursor:
                cursor.execute(sql, [job.rows_done, job.bytes_done, job.pk])
                row = cursor.fetchone()
            job.cancel_requested_at = row and row[0]
        _send(job_group(label(job), job.pk), snapshot(job))

    try:
        yield progress
    finally:
        if progress_connection is not None:
            progress_connection.close()


def snapshot(job: Job, why_orphaned: str = "") -> dict:
    """What a job's page shows of it: the progress endpoint's answer and every live message's.
    `why_orphaned` (orphaned(job), read by the endpoint the page polls; the runner's own messages
    need not: it runs) makes a job nobody runs say so, and offers its Cancel again, which ends it."""
    status_text = job.status_text
    if why_orphaned:
        if settings.RFTWEB_EMBEDDED:  # the demo server's watchdog (rerun_orphaned); a bare runserver has none
            every = settings.RFTWEB_WATCHDOG_INTERVAL
            does = "ends it, cancelled" if job.cancel_requested_at else "runs it again from the start"
            then = f"the demo server {does} (at its start, then every {every:g} s)"
        else:
            then = "it starts again if Celery redelivers its task"
        status_text = f"running, but {why_orphaned}: {then}, or Cancel ends it now"
    elif job.status == Job.Status.PENDING and not hosts.serving(JOBS_QUEUE):
        # It said "pending" alone for as long as no worker was there to take it.
        status_text = (f"pending: no live worker takes jobs (the {JOBS_QUEUE} queue) now; it starts once one does "
                       f"(celery -A rftweb worker -Q {JOBS_QUEUE}), or Cancel ends it")
    return {
        "id": job.pk,
        "status": job.status,
        "status_text": status_text,
        "finished": job.is_finished,
        "cancel_requested": job.cancel_requested_at is not None and not why_orphaned,
        "cancellable": cancellable(job),
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
