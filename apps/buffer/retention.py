"""Buffer retention (#29): the experiences of runs that ended long ago leave the buffer, archived
into a Parquet file first ("archive") or not ("drop"), as a BufferJob of kind `retention` (job type
`buffer.retention`). A curator starts one from the Runs admin; with RFTWEB_BUFFER_RETENTION_DAYS
set, Celery beat's daily `sweep` starts one for the runs that ended more than that many days ago.

What goes: a run's rollout, synthetic and expert rows (`droppable`). What stays:
- human edits: other runs train on them (a run's feedback.source_runs, apps/buffer/store.py);
- rows with feedback (ratings, preferences on either side, flags): deleting them would delete the
  annotators' work with them (CASCADE);
- everything of a run that has not ended, and imported expert data (no run).

A run is marked as being retired (Run.buffer_retired_at, .buffer_retirement with state "in
progress") when the job is created, under the run's row lock: from then on resume refuses it (its
trainer would rewind and replay a buffer that is going), and a run resumed before that is refused
here instead. The job that succeeds marks it retired for good. One that fails or is cancelled
(#41) puts back each run of which it deleted nothing as it was before; a run that lost rows stays
retired, its record saying how many went and which archive holds them (state "partial").

Unlike the other BufferJobs, which change the buffer all or nothing, this one commits chunk by
chunk (CHUNK_ROWS rows, one short transaction each): a run of 10^6 rows in one transaction would
hold its locks and keep dead rows from vacuum for minutes, while trainers of other runs write and
claim in the same table. The job is resumable instead: what it has done is saved on the job row in
the chunk's transaction, so a rerun (a killed worker's task, redelivered: apps.core.jobs.run_job
starts a job left running again) carries on from the next chunk, and a stop knows exactly what went.
A cancel is honoured before any chunk (jobs.stop_if_cancelled), never inside one.

The archive is written whole, closed, flushed to the disk and read back (its row count, and its
SHA-256 kept on the job) before the first row is deleted, and checked again by a rerun; only rows it
holds are deleted. A rerun before that point writes the archive again.
"""

import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.core import hidden_imports, jobs
from apps.core.jobs import JobError
from apps.feedback.models import Feedback
from apps.runs.models import Run

from . import exporters, services
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
        # What a run retired by an earlier job was: put back if this one stops having deleted nothing.
        before = {str(run.pk): {"at": run.buffer_retired_at.isoformat(), **run.buffer_retirement}
                  for run in retired if run.buffer_retired_at}
        job = BufferJob.objects.create(
            kind=BufferJob.Kind.RETENTION,
            # what and format: the archive is an experience export (services.export_filename names it)
            params={"action": action, "runs": [run.pk for run in retired], "what": "experiences",
                    "format": ARCHIVE_FORMAT, **({"retired_before": before} if before else {})},
            selection=ids,
            rows_total=len(ids) * (2 if action == "archive" else 1),  # an archived row: written, then deleted
            created_by=user,
        )
        Run.objects.filter(pk__in=[run.pk for run in retired]).update(
            buffer_retired_at=timezone.now(),
            buffer_retirement={"action": action, "job": job.pk, "state": "in progress"},
        )
        jobs.enqueue_job(job)
    return job


def sweep(now=None) -> BufferJob | None:
    """Celery beat's daily retention (workers.tasks.buffer_retention; embedded, the demo command's
    thread): one job for every run that ended more than RFTWEB_BUFFER_RETENTION_DAYS ago and still
    has rows to go, in no other retention job. None when retention is off or nothing is due. First,
    retention on or off, it deletes the hidden datasets and tasksets of imports that died with their
    process (hidden_imports.delete_leftovers), whose names nobody imports again."""
    hidden_imports.delete_leftovers()
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


@jobs.register(f"buffer.{BufferJob.Kind.RETENTION}", cancellable=True)
def _run_retention(job: BufferJob, progress) -> dict:
    """Archive (write the selection's rows that may still go, then delete those the archive holds)
    or drop (delete), from where an interrupted attempt stopped (job.result). Only runs this job
    retired are touched; they are marked retired for good at the end."""
    runs = list(
        Run.objects.filter(pk__in=job.params["runs"], status__in=Run.FINISHED, buffer_retirement__job=job.pk)
        .values_list("pk", flat=True)
    )
    written, in_archive = 0, None
    if job.params["action"] == "archive":
        in_archive = _archive(job, runs, progress)
        written = len(services._selection(job))
    deleted = _delete(job, runs, in_archive, lambda checked: progress(written + checked))
    Run.objects.filter(pk__in=runs, buffer_retirement__job=job.pk).update(
        buffer_retired_at=timezone.now(), buffer_retirement={"action": job.params["action"], "job": job.pk}
    )
    left = Experience.objects.filter(run__in=runs)
    kept = {key: job.result[key] for key in ("archived", "archive_sha256") if key in job.result}
    if job.result.get("kept_not_archived"):  # droppable only since the archive was written
        kept["kept_not_archived"] = job.result["kept_not_archived"]
    result = kept | {
        "deleted": deleted,
        "kept_human_edits": left.filter(source=Experience.Source.HUMAN_EDIT).count(),
        "kept_with_feedback": left.exclude(source=Experience.Source.HUMAN_EDIT).count()
        - job.result.get("kept_not_archived", 0),
    }
    if len(runs) < len(job.params["runs"]):  # retired since by a newer retention job, which does them
        result["runs_skipped"] = len(job.params["runs"]) - len(runs)
    return result


def _save_state(job: BufferJob, **fields) -> None:
    """What the job has done so far, on its row, committed: what a rerun starts from."""
    for name, value in fields.items():
        setattr(job, name, value)
    BufferJob.objects.filter(pk=job.pk).update(**fields)


def _archive(job: BufferJob, runs: list[int], progress) -> np.ndarray:
    """Write the selected rows that may still go to the job's `output`, as an experience export,
    flush it to the disk and read it back; returns the ids it holds, sorted. Done once: a rerun
    after it finds result["archived"] and checks the file it wrote (_checked_archive)."""
    if "archived" in job.result:
        return _checked_archive(job)
    if job.output:  # an attempt interrupted while writing left a partial file
        Path(job.output.path).unlink(missing_ok=True)
    else:
        _save_state(job, output=f"buffer-jobs/{uuid.uuid4().hex}.{ARCHIVE_FORMAT}")
    path = Path(job.output.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = droppable(Experience.objects.filter(run__in=runs))
    try:
        archived = services.export_rows(services.selected_rows(job, rows), path, what="experiences",
                                        fmt=ARCHIVE_FORMAT, progress=progress)
        checksum = exporters.seal(path)
        ids = _read_back(job, path, archived)
    except BaseException:  # cancelled, failed or killed: nothing was deleted, and no half archive stays
        path.unlink(missing_ok=True)
        raise
    _save_state(job, result={**job.result, "archived": archived, "archive_sha256": checksum})
    return ids


def _checked_archive(job: BufferJob) -> np.ndarray:
    """The ids of the archive an earlier attempt wrote, once the file is found unchanged (its
    SHA-256) and whole (its row count); raises JobError, so that nothing more is deleted, if not."""
    again = "nothing more is deleted (start a new retention job to archive what is left)"
    if not job.output or not Path(job.output.path).is_file():
        raise JobError(f"the archive of this job ({job.output.name or 'no file'}) is gone: {again}")
    path = Path(job.output.path)
    written = job.result.get("archive_sha256")
    if written and exporters.sha256(path) != written:
        raise JobError(f"the archive of this job ({job.output.name}) has changed since it was written "
                       f"(SHA-256 {written} then): {again}")
    return _read_back(job, path, job.result["archived"], again)


def _read_back(job: BufferJob, path: Path, archived: int, then="nothing was deleted") -> np.ndarray:
    """The archive's ids, read back from the disk, sorted; JobError unless they are `archived` distinct rows."""
    try:
        ids = np.sort(exporters.read_ids(path))
    except (OSError, pa.ArrowException) as exc:
        raise JobError(f"the archive of this job ({job.output.name}) cannot be read back ({exc}): {then}") from exc
    if len(ids) != archived or (len(ids) > 1 and (np.diff(ids) == 0).any()):
        raise JobError(f"the archive of this job ({job.output.name}) reads back {len(ids):,} distinct rows, "
                       f"not the {archived:,} written: {then}")
    return ids


def _delete(job: BufferJob, runs: list[int], in_archive: np.ndarray | None, progress) -> int:
    """Delete the selected rows that may still go (and, archiving, that the archive holds), a chunk
    a transaction, from the first chunk not yet done; returns the rows deleted by this job,
    earlier attempts included. Stops before a chunk once the job is cancelled."""
    ids = services._selection(job)
    checked, deleted = job.result.get("checked", 0), job.result.get("deleted", 0)
    by_run = Counter({int(run): count for run, count in job.result.get("deleted_by_run", {}).items()})
    not_archived = job.result.get("kept_not_archived", 0)
    progress(checked)
    while checked < len(ids):
        jobs.stop_if_cancelled(job)
        chunk = ids[checked : checked + CHUNK_ROWS].tolist()
        with transaction.atomic():
            # Lock first, then ask what may go: feedback given meanwhile is seen, and feedback
            # given from now on waits for the lock (and finds the row gone).
            locked = list(
                Experience.objects.select_for_update().filter(pk__in=chunk, run__in=runs)
                .order_by("pk").values_list("pk", flat=True)
            )
            doomed = list(droppable(Experience.objects.filter(pk__in=locked)).values_list("pk", "run_id"))
            if in_archive is not None:  # a row whose feedback went after the archive was written stays
                held = np.isin([pk for pk, _ in doomed], in_archive)
                not_archived += len(doomed) - int(held.sum())
                doomed = [row for row, keep in zip(doomed, held, strict=True) if keep]
            deleted += services.delete_rows([pk for pk, _ in doomed]) if doomed else 0
            by_run.update(run for _, run in doomed)
            state = {**job.result, "checked": checked + len(chunk), "deleted": deleted,
                     "deleted_by_run": {str(run): count for run, count in sorted(by_run.items())},
                     "kept_not_archived": not_archived}
            # In the chunk's transaction: what the job says it deleted is exactly what went.
            BufferJob.objects.filter(pk=job.pk).update(result=state)
        job.result, checked = state, checked + len(chunk)
        progress(checked)
        connection.queries_log.clear()
    return deleted


@jobs.on_stop(f"buffer.{BufferJob.Kind.RETENTION}")
def _stopped(job: BufferJob) -> None:
    """A retention job that failed or was cancelled: each of its runs of which it deleted nothing is
    put back as it was before the job (resumable again, unless an earlier job retired it); a run
    that lost rows stays retired (its trainer would replay rows that are gone), its record saying
    how many went and where their archive is. job.error says the same."""
    lost = {int(run): count for run, count in job.result.get("deleted_by_run", {}).items() if count}
    archive = job.output.name if "archived" in job.result else None
    before = job.params.get("retired_before", {})
    mine = Run.objects.filter(pk__in=job.params["runs"], buffer_retirement__job=job.pk)
    for run in mine.values_list("pk", flat=True):
        if run in lost:
            Run.objects.filter(pk=run).update(buffer_retirement={
                "action": job.params["action"], "job": job.pk, "state": "partial", "stopped": job.status,
                "deleted": lost[run], "archive": archive,
            })
        else:
            earlier = dict(before.get(str(run), {}))
            at = earlier.pop("at", None)
            Run.objects.filter(pk=run).update(buffer_retired_at=at and datetime.fromisoformat(at),
                                              buffer_retirement=earlier)
    job.error += "; " + _what_went(job, lost, archive)


def _what_went(job: BufferJob, lost: dict[int, int], archive: str | None) -> str:
    """What a stopped retention job did, for its page: which rows went and where they are."""
    selected = services._selection(job)
    untouched = [f"#{run}" for run in job.params["runs"] if run not in lost]
    as_before = (f"run {', '.join(untouched)} {'is as it was' if len(untouched) == 1 else 'are as they were'} "
                 "before this job")
    if not lost:
        kept = f"; its archive {archive} ({job.result['archived']:,} rows) is kept as an export" if archive else ""
        return f"nothing was deleted: {as_before}{kept}"
    through = int(selected[job.result["checked"] - 1])
    where = (f"all of them in its archive {archive} ({job.result['archived']:,} rows, SHA-256 "
             f"{job.result['archive_sha256']}, read back before the first delete; download it here)"
             if archive else "dropped without an archive")
    went = ", ".join(f"run #{run} {count:,}" for run, count in sorted(lost.items()))
    return (f"{job.result['deleted']:,} of the {len(selected):,} selected rows were deleted (those that could go "
            f"among the selected ids up to {through}), {where}: {went}. Those runs stay retired; the other "
            f"rows are still in the buffer{'; ' + as_before if untouched else ''}")
