"""Buffer retention (#29): the experiences of runs that ended long ago leave the buffer, archived
into a Parquet file first ("archive") or not ("drop"), as a BufferJob of kind `retention` (job type
`buffer.retention`). A curator starts one from the Runs admin; with RFTWEB_BUFFER_RETENTION_DAYS
set, Celery beat's daily `sweep` starts one for the runs that ended more than that many days ago.

What goes: a run's rollout, synthetic and expert rows (`droppable`). What stays:
- human edits: other runs train on them (a run's feedback.source_runs, apps/buffer/store.py);
- rows with feedback (ratings, preferences on either side, flags): deleting them would delete the
  annotators' work with them (CASCADE);
- everything of a run that has not ended, and imported expert data (no run).

A run whose buffer is retired is marked so (Run.buffer_retired_at, .buffer_retirement) when the
job is created, under the run's row lock: from then on resume refuses it (its trainer would rewind
and replay a buffer that is gone), and a run resumed before that is refused here instead.

Unlike the other BufferJobs, which change the buffer all or nothing, this one commits chunk by
chunk (CHUNK_ROWS rows, one short transaction each): a run of 10^6 rows in one transaction would
hold its locks and keep dead rows from vacuum for minutes, while trainers of other runs write and
claim in the same table. The job is resumable instead: what it has done is saved on the job row
after every commit, so a rerun (a killed worker's task, redelivered: apps.core.jobs.run_job starts a
job left running again) carries on from the next chunk. The archive is written whole and closed
before the first row is deleted, so no row is ever deleted that a readable archive does not hold;
a rerun before that point writes the archive again.
"""

import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.core import jobs
from apps.core.jobs import JobError
from apps.feedback.models import Feedback
from apps.runs.models import Run

from . import services
from .models import BufferJob, Experience

ACTIONS = ("archive", "drop")
ARCHIVE_FORMAT = "parquet"  # the export's format and columns (docs/data-formats.md), one row group a chunk
CHUNK_ROWS = services.DELETE_CHUNK_ROWS  # rows deleted in one transaction


class RetentionRefused(Exception):
    """Retention cannot start as asked; the message names the runs and why."""


def droppable(rows):
    """The rows of a queryset of experiences that retention deletes: a run's, not human edits, and
    no feedback on either side of them."""
    return (
        rows.filter(run__isnull=False)
        .exclude(source=Experience.Source.HUMAN_EDIT)
        .exclude(Exists(Feedback.objects.filter(experience=OuterRef("pk"))))
        .exclude(Exists(Feedback.objects.filter(other=OuterRef("pk"))))
    )


def runs_in_retention() -> dict[int, int]:
    """{run id: job id} for the runs of the retention jobs still pending or running."""
    active = BufferJob.objects.filter(
        kind=BufferJob.Kind.RETENTION, status__in=(BufferJob.Status.PENDING, BufferJob.Status.RUNNING)
    ).values_list("pk", "params")
    return {run: job for job, params in active for run in params.get("runs", [])}


def _named(runs) -> str:
    return ", ".join(f"{run.name} (#{run.pk}, {run.status})" for run in runs)


def start_retention(runs, *, action: str, user=None) -> BufferJob:
    """Queue archiving or dropping the buffer of a queryset of ended runs. Their droppable rows are
    fixed now (the job's selection) and the runs are marked retired. Raises RetentionRefused naming
    the runs that have not ended or are in another retention job, or when none has a row to go."""
    if action not in ACTIONS:
        raise ValueError(f"unknown retention action {action!r} (known: {', '.join(ACTIONS)})")
    with transaction.atomic():
        # Locked as resume_run locks them: a run is either resumed first (and refused here) or
        # marked first (and refused there).
        locked = list(Run.objects.select_for_update().filter(pk__in=runs.values("pk")).order_by("pk"))
        not_ended = [run for run in locked if not run.is_finished]
        if not_ended:
            raise RetentionRefused(
                f"only ended runs (stopped, completed, failed) give up their buffer: {_named(not_ended)}"
            )
        active = runs_in_retention()
        busy = [run for run in locked if run.pk in active]
        if busy:
            jobs_named = ", ".join(sorted({f"#{active[run.pk]}" for run in busy}))
            raise RetentionRefused(f"a retention job ({jobs_named}) is already queued or running for {_named(busy)}")
        retired = [run for run in locked if droppable(Experience.objects.filter(run=run)).exists()]
        if not retired:
            raise RetentionRefused(
                f"nothing to {action} in {_named(locked)}: their rows are human edits or have feedback, which stay"
            )
        ids = services._ids(droppable(Experience.objects.filter(run__in=retired)).order_by("pk"))
        job = BufferJob.objects.create(
            kind=BufferJob.Kind.RETENTION,
            # what and format: the archive is an experience export (services.export_filename names it)
            params={"action": action, "runs": [run.pk for run in retired], "what": "experiences",
                    "format": ARCHIVE_FORMAT},
            selection=ids,
            rows_total=len(ids) * (2 if action == "archive" else 1),  # an archived row: written, then deleted
            created_by=user,
        )
        Run.objects.filter(pk__in=[run.pk for run in retired]).update(
            buffer_retired_at=timezone.now(), buffer_retirement={"action": action, "job": job.pk}
        )
        jobs.enqueue_job(job)
    return job


def sweep(now=None) -> BufferJob | None:
    """Celery beat's daily retention (workers.tasks.buffer_retention; embedded, the demo command's
    thread): one job for every run that ended more than RFTWEB_BUFFER_RETENTION_DAYS ago and still
    has rows to go, in no other retention job. None when retention is off or nothing is due."""
    days = settings.RFTWEB_BUFFER_RETENTION_DAYS
    if not days:
        return None
    cutoff = (now or timezone.now()) - timedelta(days=days)
    due = (
        Run.objects.filter(status__in=Run.FINISHED, finished_at__lt=cutoff)
        .exclude(pk__in=list(runs_in_retention()))
        .filter(Exists(droppable(Experience.objects.filter(run=OuterRef("pk")))))
    )
    if not due.exists():
        return None
    try:
        return start_retention(due, action=settings.RFTWEB_BUFFER_RETENTION_ACTION)
    except RetentionRefused:  # a run resumed or taken by another sweep meanwhile: tomorrow's sweep
        return None


# ---- the job ----


@jobs.register(f"buffer.{BufferJob.Kind.RETENTION}")
def _run_retention(job: BufferJob, progress) -> dict:
    """Archive (write the selection's rows that may still go, then delete them) or drop (delete),
    from where an interrupted attempt stopped (job.result). Only runs this job retired are touched."""
    runs = list(
        Run.objects.filter(pk__in=job.params["runs"], status__in=Run.FINISHED, buffer_retirement__job=job.pk)
        .values_list("pk", flat=True)
    )
    written = 0
    if job.params["action"] == "archive":
        written = _archive(job, runs, progress)
    deleted = _delete(job, runs, lambda checked: progress(written + checked))
    left = Experience.objects.filter(run__in=runs)
    result = {"archived": job.result["archived"]} if "archived" in job.result else {}
    result |= {
        "deleted": deleted,
        "kept_human_edits": left.filter(source=Experience.Source.HUMAN_EDIT).count(),
        "kept_with_feedback": left.exclude(source=Experience.Source.HUMAN_EDIT).count(),
    }
    if len(runs) < len(job.params["runs"]):  # retired since by a newer retention job, which does them
        result["runs_skipped"] = len(job.params["runs"]) - len(runs)
    return result


def _save_state(job: BufferJob, **fields) -> None:
    """What the job has done so far, on its row, committed: what a rerun starts from. Never inside
    a chunk's transaction (the progress writer's connection updates the same row)."""
    for name, value in fields.items():
        setattr(job, name, value)
    BufferJob.objects.filter(pk=job.pk).update(**fields)


def _archive(job: BufferJob, runs: list[int], progress) -> int:
    """Write the selected rows that may still go to the job's `output`, as an experience export;
    returns the rows of the selection it went through. Done once: a rerun after it finds
    result["archived"] and goes on deleting."""
    selected = len(services._selection(job))
    if "archived" in job.result:
        if not job.output or not Path(job.output.path).is_file():
            raise JobError(f"the archive of this job ({job.output.name or 'no file'}) is gone: "
                           "nothing more is deleted (start a new retention job to archive what is left)")
        return selected
    if job.output:  # an attempt interrupted while writing left a partial file
        Path(job.output.path).unlink(missing_ok=True)
    else:
        _save_state(job, output=f"buffer-jobs/{uuid.uuid4().hex}.{ARCHIVE_FORMAT}")
    path = Path(job.output.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = droppable(Experience.objects.filter(run__in=runs))
    try:
        archived = services.export_rows(services._selected_rows(job, rows), path, what="experiences",
                                        fmt=ARCHIVE_FORMAT, progress=progress)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    _save_state(job, result={**job.result, "archived": archived})
    return selected


def _delete(job: BufferJob, runs: list[int], progress) -> int:
    """Delete the selected rows that may still go, a chunk a transaction, from the first chunk not
    yet done; returns the rows deleted by this job, earlier attempts included."""
    ids = services._selection(job)
    checked, deleted = job.result.get("checked", 0), job.result.get("deleted", 0)
    progress(checked)
    while checked < len(ids):
        chunk = ids[checked : checked + CHUNK_ROWS].tolist()
        with transaction.atomic():
            # Lock first, then ask what may go: feedback given meanwhile is seen, and feedback
            # given from now on waits for the lock (and finds the row gone).
            locked = list(
                Experience.objects.select_for_update().filter(pk__in=chunk, run__in=runs)
                .order_by("pk").values_list("pk", flat=True)
            )
            doomed = list(droppable(Experience.objects.filter(pk__in=locked)).values_list("pk", flat=True))
            deleted += services.delete_rows(doomed) if doomed else 0
        checked += len(chunk)
        _save_state(job, result={**job.result, "checked": checked, "deleted": deleted})
        progress(checked)
        connection.queries_log.clear()
    return deleted
