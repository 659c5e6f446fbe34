"""State changes of the buffer: rollouts from the explorer, and the curators' work from the admin.

Curation acts on a selection (a queryset of experiences, typically the admin changelist's). Quick
set-based changes (status, priority, delete) run in the request. Anything that reads every row
in Python (export here; re-score, promote, a pipeline operator in `curation.py`; an import of
expert data in `expert_import.py`) is a `BufferJob`, each kind a job type that apps.core.jobs runs
on a Celery worker of the `default` queue: the job fixes the selected ids when the curator
confirms and reports its progress as it goes. Each kind stops when cancelled between two chunks
of rows (jobs.stop_if_cancelled in `selected_rows`): a re-score and a promotion commit a chunk at
a time (annotators' saves wait for a chunk, not the job) and keep the chunks done, which a re-run
skips; the others change the buffer all or nothing, rolling back what they had done.
"""

import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.db.models import BinaryField, Count, Exists, ExpressionWrapper, F, OuterRef, Q, Window
from django.db.models.fields.json import KT
from django.db.models.functions import RowNumber

from apps.core import jobs
from apps.feedback import history as feedback_history
from apps.feedback.models import Feedback
from apps.runs.models import Run

from . import exporters
from .models import BufferJob, Experience, ExpertDataset, expert_copies

CHUNK_ROWS = 2_000  # rows a job holds in memory at once
DELETE_CHUNK_ROWS = 10_000


# ---- quick changes of a selection ----


def selected(queryset):
    """The rows of a queryset (an admin changelist's, with its annotations, joins and ordering) as
    a plain queryset of experiences, fit for update()."""
    return Experience.objects.filter(pk__in=queryset.values("pk"))


def set_status(queryset, status: str) -> int:
    if status not in Experience.Status.values:
        raise ValueError(f"unknown status {status!r}")
    rows = selected(queryset)
    with transaction.atomic():
        feedback_history.status_decided(rows)  # a curator's decision is what undoing a flag keeps
        return rows.update(status=status)


def set_priority(queryset, priority: float) -> int:
    return selected(queryset).update(priority=priority)


def delete_experiences(queryset) -> int:
    """Delete the rows and what depends on them, as Django's delete() would: rows that point at
    them with CASCADE (feedback on either side of a preference, annotation locks, …) are deleted,
    links with SET_NULL (human edits made from them) are cleared. Returns the number of
    experiences deleted.

    Done set by set: Django's delete() would first load every selected row into memory (the
    parent link is SET_NULL). The ids are fixed first, since deleting the feedback can change what
    a filter such as "has feedback" matches. All or nothing (retention commits chunk by chunk)."""
    with transaction.atomic():
        return sum(delete_rows(chunk.tolist()) for chunk in _chunks(_ids(queryset), DELETE_CHUNK_ROWS))


def delete_rows(ids: list[int]) -> int:
    """Delete the experiences `ids` and what depends on them, in the caller's transaction."""
    for relation in Experience._meta.related_objects:
        pointing = relation.related_model._base_manager.filter(**{f"{relation.field.name}__in": ids})
        if relation.on_delete is models.CASCADE:
            pointing.delete()
        elif relation.on_delete is models.SET_NULL:
            pointing.update(**{relation.field.name: None})
        else:
            raise NotImplementedError(f"deleting experiences that {relation} points at ({relation.on_delete})")
    return Experience.objects.filter(pk__in=ids)._raw_delete(DEFAULT_DB_ALIAS)


# ---- expert datasets (their import: expert_import.py) ----


class DatasetInUse(Exception):
    """A dataset a run still has to copy (runs_waiting_for) is not deleted."""


def runs_waiting_for(names) -> list[Run]:
    """The runs that name one of these datasets as buffer.expert_dataset and may still have to
    copy it (their trainers copy it when they start, expert_data.py), oldest first: every queued
    and unfinished one (a running trainer may be in the middle of its copy), and every stopped or
    failed one that has no copy of it yet, since Resume starts its trainer, which copies it then.
    Deleted, such a run's Resume failed for good ("buffer.expert_dataset: no expert dataset is named
    'hx'"). A stopped run with a copy trains on its copy (DjangoExpertData.seed), and a completed
    run is never resumed: neither needs the dataset. `still_needs` says why each one does."""
    unfinished = (Run.Status.QUEUED, *Run.ACTIVE)
    copied = expert_copies(OuterRef("pk"))
    return list(
        Run.objects.filter(config__buffer__expert_dataset__in=list(names))
        .filter(Q(status__in=unfinished) | Q(status__in=(Run.Status.STOPPED, Run.Status.FAILED)) & ~Exists(copied))
        .only("pk", "name", "status", "config").order_by("pk")
    )


def still_needs(run: Run) -> str:
    """Why a run of runs_waiting_for keeps its dataset, and what lets it go (the wording of the
    tasksets' and runs' refusals: a run that can be resumed is deleted first)."""
    named = run.config["buffer"]["expert_dataset"]
    if run.status in Run.FINISHED:
        return (f"names {named!r}, which it has not copied, and is {run.status}: it can be resumed; "
                "delete the run first")
    return f"names {named!r} and has not ended: its trainer copies the dataset when it starts"


def runs_naming(names, newest: int) -> dict[str, tuple[list[tuple[int, str]], int]]:
    """{dataset name: ([(pk, name) of the `newest` runs that name it as buffer.expert_dataset,
    newest first], how many runs name it)} for those of `names` that runs name. One query for any
    number of names (window functions over the JSON key, on Postgres and SQLite): the datasets
    page lists a page of datasets, and two queries a row took 60 of 67 at 30 rows."""
    dataset = KT("config__buffer__expert_dataset")
    ranked = Run.objects.filter(config__buffer__expert_dataset__in=list(names)).annotate(
        dataset=dataset,
        rank=Window(RowNumber(), partition_by=dataset, order_by=F("pk").desc()),
        named=Window(Count("pk"), partition_by=dataset),
    ).filter(rank__lte=newest).order_by("dataset", "rank")
    found = {}
    for pk, name, dataset, named in ranked.values_list("pk", "name", "dataset", "named"):
        found.setdefault(dataset, ([], named))[0].append((pk, name))
    return found


def delete_datasets(queryset) -> int:
    """Delete expert datasets with their rows and the preferences between them, all or nothing
    (the runs' copies stay: a copy is its run's). Raises DatasetInUse, deleting nothing, while
    a run may still have to copy one (runs_waiting_for). Returns the number of experiences deleted."""
    datasets = list(queryset)
    waiting = runs_waiting_for(d.name for d in datasets)
    if waiting:
        raise DatasetInUse("Not deleted: " + "; ".join(f"run {run.name} (#{run.pk}) {still_needs(run)}"
                                                       for run in waiting) + ".")
    with transaction.atomic():
        deleted = delete_experiences(Experience.objects.filter(dataset__in=datasets))
        ExpertDataset.objects.filter(pk__in=[d.pk for d in datasets]).delete()
    return deleted


# ---- export ----

EXPORTS = {
    # what: (rows as they are read, the Parquet schema, one row -> one record)
    "experiences": (lambda: Experience.objects.all(), exporters.EXPERIENCE_SCHEMA, exporters.experience_record),
    "feedback": (
        lambda: Feedback.objects.select_related("user", "experience", "other").only(
            *(f.name for f in Feedback._meta.concrete_fields),
            "user__username",
            "experience__prompt_text",
            "experience__response_text",
            "other__response_text",
        ),
        exporters.FEEDBACK_SCHEMA,
        exporters.feedback_record,
    ),
}


def start_export(queryset, *, fmt: str, user=None) -> BufferJob:
    """Queue the export of a queryset of experiences or feedback to a JSONL or Parquet file."""
    what = {Experience: "experiences", Feedback: "feedback"}[queryset.model]
    if fmt not in exporters.FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    return start_selection_job(BufferJob.Kind.EXPORT, queryset, {"what": what, "format": fmt}, user)


def export_rows(
    rows: Iterable[tuple[int, list]], path: Path, *, what: str, fmt: str, progress: Callable | None = None
) -> int:
    """Write chunks of rows, as `selected_rows` yields them, to `path`; returns rows written."""
    _, schema, record = EXPORTS[what]
    writer = exporters.open_writer(path, fmt, schema)
    written = 0
    try:
        for done, chunk in rows:
            writer.write([record(row) for row in chunk])
            written += len(chunk)
            if progress:
                progress(done)
    finally:
        writer.close()
    return written


@jobs.register(f"buffer.{BufferJob.Kind.EXPORT}", cancellable=True)
def _run_export(job: BufferJob, progress) -> dict:
    what, fmt = job.params["what"], job.params["format"]
    job.output.name = f"buffer-jobs/{uuid.uuid4().hex}.{fmt}"
    path = Path(job.output.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        rows = export_rows(selected_rows(job, EXPORTS[what][0]()), path, what=what, fmt=fmt, progress=progress)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {"exported": rows, "file_bytes": path.stat().st_size}


def export_filename(job: BufferJob) -> str:
    return f"{job.params['what']}-{job.pk}.{job.params['format']}"


# ---- running jobs ----


def start_selection_job(kind: str, queryset, params: dict, user, order=("pk",)) -> BufferJob:
    ids = _ids(queryset.order_by(*order))
    job = BufferJob.objects.create(kind=kind, params=params, selection=ids, rows_total=len(ids), created_by=user)
    jobs.enqueue_job(job)
    return job


def _ids(queryset) -> np.ndarray:
    """The queryset's ids in its order, 8 bytes each (a Python list of a million ids takes 36 MB)."""
    return np.fromiter(queryset.values_list("pk", flat=True).iterator(chunk_size=10_000), dtype=np.int64)


def _chunks(ids: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def _selection(job: BufferJob) -> np.ndarray:
    """The job's selected ids, read as the packed bytes they are stored as (not as a Python list)."""
    packed = (
        BufferJob.objects.filter(pk=job.pk)
        .values_list(ExpressionWrapper(F("selection"), output_field=BinaryField()), flat=True)
        .get()
    )
    return np.frombuffer(packed or b"", dtype="<i8")


def selected_rows(job: BufferJob, rows) -> Iterator[tuple[int, list]]:
    """(rows read so far, the next chunk of the job's selected rows, in selection order): one
    chunk in memory at a time, so a job's memory stays flat however many rows it goes through.
    Before each chunk, a cancelled job stops (jobs.JobCancelled): a caller rolls back or deletes
    what it did with the chunks before, or (re-score, promotion) keeps what it committed."""
    done = 0
    for chunk in _chunks(_selection(job), CHUNK_ROWS):
        jobs.stop_if_cancelled(job)
        ids = chunk.tolist()
        found = rows.in_bulk(ids)  # a row deleted since the job was queued is simply missing
        done += len(ids)
        yield done, [found[pk] for pk in ids if pk in found]
        connection.queries_log.clear()


def delete_jobs(queryset) -> int:
    """Delete finished jobs with their files (uploads not yet imported, export files), but never
    a retention archive that holds rows the job deleted: it is their only copy (the run's
    buffer_retirement names it once the job is gone; kept_archives lists them). Raises JobError, deleting nothing, if
    one is pending or running (jobs.refuse_unfinished)."""
    doomed = list(queryset)
    jobs.refuse_unfinished(doomed)
    for job in doomed:
        for file in (job.upload, None if job.archive_holds_deleted_rows else job.output):
            if file:
                file.delete(save=False)
        if job.archive_holds_deleted_rows:  # the runs' pages linked to the job: they name the file now
            for run in Run.objects.filter(buffer_retirement__job=job.pk):
                run.buffer_retirement = {**run.buffer_retirement, "job": None, "archive": job.output.name}
                run.save(update_fields=["buffer_retirement"])
    return BufferJob.objects.filter(pk__in=[job.pk for job in doomed]).delete()[0]


def kept_archives(queryset) -> list[str]:
    """The archives delete_jobs would keep of these jobs (paths under the data dir)."""
    return [job.output.name for job in queryset if job.archive_holds_deleted_rows]
