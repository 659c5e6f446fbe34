"""State changes of the buffer: rollouts from the explorer, and the curators' work from the admin.

Curation acts on a selection (a queryset of experiences, typically the admin changelist's). Quick
set-based changes (status, priority, delete) run in the request. Anything that reads every row
in Python (import and export here; re-score, promote, a pipeline operator in `curation.py`) is a
`BufferJob`, each kind a job type that apps.core.jobs runs on a Celery worker of the `default`
queue: the job fixes the selected ids when the curator confirms, reports its progress as it goes,
and changes the buffer all or nothing. Each kind stops when cancelled between two chunks of rows (jobs.stop_if_cancelled
in `selected_rows` and between the import's batches), rolling back what it had done.
"""

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.db.models import BinaryField, Count, ExpressionWrapper, F, Window
from django.db.models.fields.json import KT
from django.db.models.functions import RowNumber

from apps.core import jobs
from apps.core.files import FileImportError
from apps.feedback import history as feedback_history
from apps.feedback.models import Feedback
from apps.runs.models import Run

from . import exporters, importers
from .models import BufferJob, Experience, ExpertDataset

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


# ---- import and export ----

IMPORT_BATCH_ROWS = 2_000
IMPORTED_UNIT = {"sft": "rows", "dpo": "pairs"}  # what a row of an import file is, by layout


def counted(count: int, layout: str) -> str:
    """An import's rows as their author counts them: "3 rows", "1 pair" (5 pairs are 10 experiences)."""
    unit = IMPORTED_UNIT[layout]
    return f"{count:,} {unit if count != 1 else unit.removesuffix('s')}"


def dataset_size(dataset: ExpertDataset) -> int:
    """What a dataset holds as its files counted it: SFT rows, or DPO pairs (the preferences between
    its rows, as the datasets page counts them)."""
    if dataset.layout == ExpertDataset.Layout.DPO:
        return Feedback.objects.filter(kind=Feedback.Kind.PREFERENCE, value=1.0, experience__dataset=dataset).count()
    return dataset.experiences.count()


@dataclass(frozen=True)
class Imported:
    """What an import did, counted in its file's unit (`rows`: SFT rows or DPO pairs)."""

    rows: int
    dataset: str
    layout: str
    appended: bool  # to a dataset that was there before: a file imported twice is there twice
    holds: int  # the dataset's size now

    def result(self) -> dict:
        """As an import job keeps it: its count under its unit, as the job page reads it ("pairs": 5)."""
        return {IMPORTED_UNIT[self.layout]: self.rows, "dataset": self.dataset, "appended": self.appended,
                "holds": self.holds}

    @classmethod
    def of_result(cls, result: dict, layout: str) -> "Imported":
        return cls(result[IMPORTED_UNIT[layout]], result["dataset"], layout, result["appended"], result["holds"])

    def __str__(self):
        if self.appended:
            return (f"added {counted(self.rows, self.layout)} to the existing dataset {self.dataset!r}, which now "
                    f"holds {counted(self.holds, self.layout)}")
        return f"imported {counted(self.rows, self.layout)} into the new dataset {self.dataset!r}"


def import_expert_data(
    path,
    *,
    dataset: str | None = None,
    append: bool = False,
    layout: str = "sft",
    fmt: str | None = None,
    user=None,
    source: str | None = None,
    progress: Callable | None = None,
    batch_size: int = IMPORT_BATCH_ROWS,
    stop_if_cancelled: Callable[[], None] | None = None,
) -> Imported:
    """Import a JSONL or Parquet file of expert data into the expert dataset named `dataset` (the
    file's name without its extension by default): a new one, or with `append` one of the same
    layout to add to (without it, a dataset of that name is refused: the same export imported as
    .jsonl, then as .parquet, went twice into the dataset named after it, each row there twice
    without a word), as experiences of source `expert` with no run, all or nothing: rows are streamed and inserted
    `batch_size` at a time inside one transaction, so a bad row anywhere leaves nothing behind.
    A DPO row becomes two experiences (chosen: ready; rejected: status rejected, so it is never
    imitated) and `user`'s preference between them.
    `progress(rows, bytes_done, bytes_total)` is called after every batch, and
    `stop_if_cancelled()` too, inside the transaction: what it raises rolls the import back.
    Returns what it did: the number of the file's rows imported, what its author counts (SFT
    rows, DPO pairs of two experiences each), and whether it added them to rows already there.
    Raises FileImportError."""
    path = Path(path)
    source = source or path.name
    fmt = fmt or importers.detect_expert_format(path.name)
    if layout == "dpo" and user is None:
        raise FileImportError(source, None, "a DPO import needs a user: each pair becomes their preference")
    rows = importers.read_expert_data(path, fmt, layout, display_name=source)
    pair_prefix = f"pair-{uuid.uuid4().hex[:12]}"  # each pair is a group of two, so the admin shows them side by side
    batch, imported, read = [], 0, None
    with transaction.atomic():
        into, before = _dataset_to_fill(dataset or default_dataset_name(source), layout, user, source, append)
        for number, (experiences, read) in enumerate(rows):
            if layout == "dpo":
                chosen, rejected = experiences
                group = f"{pair_prefix}-{number}"
                batch.append([
                    _expert_row(chosen, into, group), _expert_row(rejected, into, group, Experience.Status.REJECTED)
                ])
            else:
                batch.append([_expert_row(experiences[0], into)])
            if len(batch) == batch_size:
                imported += _insert_imported(batch, layout, user, source)
                if progress:
                    progress(imported, read.bytes_read, read.bytes_total)
                if stop_if_cancelled:
                    stop_if_cancelled()
        imported += _insert_imported(batch, layout, user, source)
    if progress:
        progress(imported, read.bytes_total, read.bytes_total)
    return Imported(imported, into.name, layout, appended=before is not None, holds=(before or 0) + imported)


def default_dataset_name(filename) -> str:
    """The dataset an import goes into when none is named: the file's name without its extension."""
    return Path(filename).stem[:100]


def _dataset_to_fill(name: str, layout: str, user, source: str, append: bool) -> tuple[ExpertDataset, int | None]:
    """The dataset an import adds to: a new one, or with `append` the one of that name if its layout
    is the file's (a run trains on all of one dataset one way), with its size before (None for a new
    one). Locked until the import commits, so a deletion waits for it."""
    name = name.strip()
    if not name or len(name) > 100 or "\x00" in name:
        raise FileImportError(source, None, f"the dataset name {name[:100]!r} must be 1 to 100 characters")
    dataset, created = ExpertDataset.objects.select_for_update().get_or_create(
        name=name, defaults={"layout": layout, "created_by": user}
    )
    if created:
        return dataset, None
    if dataset.layout != layout:
        raise FileImportError(
            source, None, f"the dataset {name!r} holds {dataset.layout.upper()} data, and this file is a "
            f"{layout.upper()} import: name another dataset (a run trains on all of one dataset one way)",
        )
    size = dataset_size(dataset)
    if not append:
        raise FileImportError(source, None, taken(dataset, size))
    return dataset, size


APPEND_LABEL = "Add to an existing dataset"  # the upload page's choice; the command's is --append


def taken(dataset: ExpertDataset, size: int,
          how: str = f"ask to add this file's rows to it ('{APPEND_LABEL}'; import_expert_data --append)") -> str:
    """Why an import that did not ask to add to a dataset is refused its name."""
    return f"the dataset {dataset.name!r} exists and holds {counted(size, dataset.layout)}: name a new one, or {how}"


def _expert_row(
    fields: importers.ExperienceFields, dataset: ExpertDataset, group_id: str | None = None,
    status=Experience.Status.READY,
) -> Experience:
    return Experience(
        run=None,
        dataset=dataset,
        source=Experience.Source.EXPERT,
        status=status,
        prompt_text=fields.prompt_text,
        response_text=fields.response_text,
        messages=fields.messages,
        prompt_ids=fields.prompt_ids,
        response_ids=fields.response_ids,
        action_mask=fields.action_mask,
        logprobs=fields.logprobs,
        reward=fields.reward,
        reward_components=fields.reward_components,
        group_id=group_id or fields.group_id,
        rollout_index=fields.rollout_index,
        model_version=fields.model_version,
        priority=fields.priority,
        metadata=fields.metadata,
    )


def _insert_imported(batch: list[list[Experience]], layout: str, user, source: str) -> int:
    """Insert a batch of the file's rows (each one experience, or a DPO pair's two); returns how many rows."""
    Experience.objects.bulk_create([row for experiences in batch for row in experiences])
    if layout == "dpo":
        # New pairs of new rows: created in bulk here rather than one give_feedback call each.
        Feedback.objects.bulk_create(
            Feedback(
                experience=chosen,
                other=rejected,
                user=user,
                kind=Feedback.Kind.PREFERENCE,
                value=1.0,  # chosen is better: a DPO pair
                comment=f"imported from {source}",
            )
            for chosen, rejected in batch
        )
    rows = len(batch)
    batch.clear()
    # With DEBUG on, Django keeps the SQL of every query; a million-row import would keep it all.
    connection.queries_log.clear()
    return rows


class DatasetInUse(Exception):
    """A dataset a run still has to copy (a queued or unfinished run names it) is not deleted."""


def runs_waiting_for(names) -> list[Run]:
    """The queued and unfinished runs that name one of these datasets as buffer.expert_dataset:
    their trainers copy it when they start (expert_data.py)."""
    unfinished = (Run.Status.QUEUED, *Run.ACTIVE)
    return list(Run.objects.filter(status__in=unfinished, config__buffer__expert_dataset__in=list(names)).only(
        "pk", "name", "config"
    ))


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
    a queued or unfinished run names one. Returns the number of experiences deleted."""
    datasets = list(queryset)
    waiting = runs_waiting_for(d.name for d in datasets)
    if waiting:
        raise DatasetInUse(
            "Not deleted: " + ", ".join(f"run {run.name} (#{run.pk}) names {run.config['buffer']['expert_dataset']!r}"
                                         for run in waiting)
            + ". A run copies its dataset when its trainer starts: delete it once they have ended."
        )
    with transaction.atomic():
        deleted = delete_experiences(Experience.objects.filter(dataset__in=datasets))
        ExpertDataset.objects.filter(pk__in=[d.pk for d in datasets]).delete()
    return deleted


def start_import(
    *, upload, layout: str, fmt: str, dataset: str | None = None, append: bool = False, user=None
) -> BufferJob:
    """Save an uploaded file under MEDIA_ROOT and queue its import into `dataset` (the file's name
    without its extension by default; with `append`, one there already may be added to) once this
    transaction commits."""
    job = BufferJob(
        kind=BufferJob.Kind.IMPORT,
        params={"dataset": dataset, "append": append, "layout": layout, "format": fmt},
        original_filename=Path(upload.name).name,
        bytes_total=upload.size,
        created_by=user,
    )
    job.upload.save(upload.name, upload, save=False)  # copied in chunks, never whole in memory
    job.save()
    jobs.enqueue_job(job)
    return job


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
    Before each chunk, a cancelled job stops (jobs.JobCancelled): every caller rolls back or
    deletes what it did with the chunks before."""
    done = 0
    for chunk in _chunks(_selection(job), CHUNK_ROWS):
        jobs.stop_if_cancelled(job)
        ids = chunk.tolist()
        found = rows.in_bulk(ids)  # a row deleted since the job was queued is simply missing
        done += len(ids)
        yield done, [found[pk] for pk in ids if pk in found]
        connection.queries_log.clear()


@jobs.register(f"buffer.{BufferJob.Kind.IMPORT}", cancellable=True)
def _run_import(job: BufferJob, progress) -> dict:
    # A job queued before datasets had names takes its file's (the upload's own name is random).
    dataset = job.params.get("dataset") or default_dataset_name(job.original_filename)
    imported = import_expert_data(
        job.upload.path,
        dataset=dataset,
        append=job.params.get("append", True),  # a job queued before the choice added, as imports did then
        layout=job.params["layout"],
        fmt=job.params["format"],
        user=job.created_by,
        source=job.original_filename,
        progress=lambda rows, bytes_done, bytes_total: progress(rows, bytes_done),
        stop_if_cancelled=lambda: jobs.stop_if_cancelled(job),
    )
    job.rows_total = imported.rows
    # Counted as the file's author counts: 5 pairs, not the 10 experiences they became.
    return imported.result()


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
