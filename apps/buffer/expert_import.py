"""Expert data imported from a file into an expert dataset (the experiences page's *Import expert
data*, manage.py import_expert_data), in short transactions.

Embedded SQLite has one write lock for the whole database: one transaction for a 200k-row file
held it 23.5 s, and beside a training run the run's writes waited past SQLite's 30 s busy timeout
(its loop lost the database and resumed from a checkpoint) and annotators' ratings failed. So the
rows go into a hidden dataset (ready False: not in ExpertDataset.objects, so no page, form, count
or run sees it; the experiences and feedback admin leave its rows out, `staged`) in committed
batches, and one short transaction at the end shows them: the hidden dataset becomes the new one,
or its rows move into the dataset they are added to. A bad row, a cancel or any failure deletes
the hidden dataset and its rows (hidden_datasets.delete_unready), as a taskset import does
(apps/tasksets/services.py; both: apps/core/hidden_imports.py). One import at a time fills a
dataset of a name (being_imported; the constraint expert_dataset_import), adding to it included:
a run copies a dataset's rows in id order (expert_data.py).
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q

from apps.core import hidden_imports, jobs
from apps.core.files import FileImportError
from apps.feedback.models import Feedback

from . import importers, services
from .models import BufferJob, Experience, ExpertDataset

# With its rows go the preferences between them and their search documents (services.delete_rows).
hidden_datasets = hidden_imports.HiddenImports(ExpertDataset, Experience.objects, "dataset", services.delete_rows,
                                               BufferJob.objects.filter(kind=BufferJob.Kind.IMPORT), "dataset")

IMPORTED_UNIT = {"sft": "rows", "dpo": "pairs"}  # what a row of an import file is, by layout
APPEND_LABEL = "Add to an existing dataset"  # the upload page's choice; the command's is --append


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


def staged(via: str = "") -> Q:
    """Experiences an import is still writing (in a dataset not ready yet), which lists leave out,
    or with `via` ("experience__") what points at them. The hidden datasets' ids are read first: with
    none (no import running) the list's SQL is what it was. A subquery instead made SQLite read every
    row to count the list (no planner estimate there): 15 ms -> 280 ms at 4 x 10^5 rows."""
    return Q(**{f"{via}dataset__in": list(ExpertDataset.all_objects.filter(ready=False).values_list("pk", flat=True))})


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
    batch_size: int | None = None,
    stop_if_cancelled: Callable[[], None] | None = None,
    created: Callable[[ExpertDataset], None] | None = None,
    committing: Callable[[ExpertDataset, Imported], None] | None = None,
) -> Imported:
    """Import a JSONL or Parquet file of expert data into the expert dataset named `dataset` (the
    file's name without its extension by default): a new one, or with `append` one of the same
    layout to add to (without it, a dataset of that name is refused: the same export imported as
    .jsonl, then as .parquet, went twice into the dataset named after it, each row there twice
    without a word), as experiences of source `expert` with no run, all or nothing.
    A DPO row becomes two experiences (chosen: ready; rejected: status rejected, so it is never
    imitated) and `user`'s preference between them.

    Rows are streamed and inserted `batch_size` at a time (settings.IMPORT_BATCH_ROWS by
    default), each batch committed into a hidden dataset, and shown at the end in one short
    transaction (_show); a bad row anywhere, a cancel or any other error deletes what was written.
    `created(hidden dataset)` is called in the transaction that creates it, to record the job that
    fills it (without it, this process is recorded: hidden_imports); `progress(rows, bytes_done,
    bytes_total)` and `stop_if_cancelled()` after every batch (what they raise stops the import);
    `committing(dataset, imported)` inside the transaction that shows the rows, so what it writes
    commits with them. Returns what it did: the number of the file's rows imported, what its author
    counts (SFT rows, DPO pairs of two experiences each), and whether it added them to rows already
    there. Raises FileImportError."""
    path = Path(path)
    source = source or path.name
    fmt = fmt or importers.detect_expert_format(path.name)
    batch_size = batch_size or settings.IMPORT_BATCH_ROWS
    if layout == "dpo" and user is None:
        raise FileImportError(source, None, "a DPO import needs a user: each pair becomes their preference")
    name = _checked_name(dataset or default_dataset_name(source), source)
    appends = _target(name, layout, append, source) is not None
    rows = importers.read_expert_data(path, fmt, layout, display_name=source)
    hidden = _create_hidden(name, layout, user, appends, source, created)
    try:
        imported = _insert_rows(rows, hidden, layout, user, source, batch_size, progress, stop_if_cancelled)
        return _show(hidden, imported, source, committing)
    except BaseException:
        hidden_datasets.delete_unready(hidden.pk)
        raise


def default_dataset_name(filename) -> str:
    """The dataset an import goes into when none is named: the file's name without its extension."""
    return Path(filename).stem[:100]


def taken(dataset: ExpertDataset, size: int,
          how: str = f"ask to add this file's rows to it ('{APPEND_LABEL}'; import_expert_data --append)") -> str:
    """Why an import that did not ask to add to a dataset is refused its name."""
    return f"the dataset {dataset.name!r} exists and holds {counted(size, dataset.layout)}: name a new one, or {how}"


def being_imported(name: str) -> str | None:
    """Why `name` is not to be imported into now: another import is filling a hidden dataset of
    that name (a new dataset's rows are still arriving, or rows are being added to it), or None. One
    left by an import that died with its process is set aside first (deleted on a worker), which
    frees the name (hidden_imports)."""
    hidden_datasets.set_aside(ExpertDataset.all_objects.filter(name=name))
    held = ExpertDataset.all_objects.filter(name=name, ready=False).first()
    if held is None:
        return None
    who = hidden_datasets.importer(held.pk) or "an import ending now"
    if held.appends:
        # A run copies a dataset's rows in id order (expert_data.py), and an import's ids are taken
        # when its batches are written, hours before they show: of two imports adding to one dataset
        # at once, the later one shown first would have a run starting between them copy past the
        # earlier one's rows, for good.
        return (f"rows are being added to the dataset {name!r} by another import ({who}): add yours once that "
                "import has finished")
    return (f"the dataset {name!r} is being imported ({who}): name another one, or add to it once that import "
            "has finished")


def _checked_name(name: str, source: str) -> str:
    name = name.strip()
    if not name or len(name) > 100 or "\x00" in name:
        raise FileImportError(source, None, f"the dataset name {name[:100]!r} must be 1 to 100 characters")
    return name


def _target(name: str, layout: str, append: bool, source: str) -> ExpertDataset | None:
    """The dataset of that name an import adds to (None: it makes a new one), if its layout is the
    file's (a run trains on all of one dataset one way) and the import asked to add to it."""
    if problem := being_imported(name):
        raise FileImportError(source, None, problem)
    dataset = ExpertDataset.objects.filter(name=name).first()
    if dataset is None:
        return None
    if dataset.layout != layout:
        raise FileImportError(
            source, None, f"the dataset {name!r} holds {dataset.layout.upper()} data, and this file is a "
            f"{layout.upper()} import: name another dataset (a run trains on all of one dataset one way)",
        )
    if not append:
        raise FileImportError(source, None, taken(dataset, dataset_size(dataset)))
    return dataset


def _create_hidden(name: str, layout: str, user, appends: bool, source: str, created: Callable | None
                   ) -> ExpertDataset:
    try:
        with transaction.atomic():
            hidden = ExpertDataset.all_objects.create(name=name, layout=layout, created_by=user, ready=False,
                                                      appends=appends)
            hidden_datasets.created(hidden, created)
            return hidden
    except IntegrityError:  # another import took the name since _target (expert_dataset_name, expert_dataset_import)
        raise FileImportError(source, None, being_imported(name) or f"a dataset named {name!r} was just made by "
                                                                    "another import: name another one") from None


def _insert_rows(rows, hidden: ExpertDataset, layout: str, user, source: str, batch_size: int,
                 progress: Callable | None, stop_if_cancelled: Callable | None) -> int:
    """Insert the file's rows into the hidden dataset, a committed batch at a time; returns how many."""
    pair_prefix = f"pair-{uuid.uuid4().hex[:12]}"  # each pair is a group of two, so the admin shows them side by side
    batch, imported, read = [], 0, None
    for number, (experiences, read) in enumerate(rows):
        if layout == "dpo":
            chosen, rejected = experiences
            group = f"{pair_prefix}-{number}"
            batch.append([
                _expert_row(chosen, hidden, group), _expert_row(rejected, hidden, group, Experience.Status.REJECTED)
            ])
        else:
            batch.append([_expert_row(experiences[0], hidden)])
        if len(batch) == batch_size:
            imported += _insert_batch(batch, layout, user, source)
            if progress:
                progress(imported, read.bytes_read, read.bytes_total)
            if stop_if_cancelled:
                stop_if_cancelled()
    if batch:
        imported += _insert_batch(batch, layout, user, source)
    if progress and read is not None:
        progress(imported, read.bytes_total, read.bytes_total)
    return imported


def _show(hidden: ExpertDataset, imported: int, source: str, committing: Callable | None) -> Imported:
    """Make the hidden dataset's rows seen, in one transaction: it becomes the new dataset, or its
    rows move into the dataset they are added to (one UPDATE) and it goes. That dataset is looked for
    again: it may have been deleted while the file was read. On SQLite (2 cores at load 5) this
    held the write lock 1.1 s for 200k SFT rows added to a dataset (an UPDATE of their dataset,
    1.0-1.4 s alone), 2 ms for a new one; one transaction for the whole import held it 94-120 s."""
    name, layout = hidden.name, hidden.layout
    target = ExpertDataset.objects.filter(name=name).first() if hidden.appends else None
    before = dataset_size(target) if target else 0  # counted outside the lock: for the message only
    with transaction.atomic():
        if not hidden.appends:
            if not ExpertDataset.all_objects.filter(pk=hidden.pk, ready=False).update(ready=True):
                raise FileImportError(source, None, f"the dataset {name!r} was deleted while this file was "
                                                    "imported: import it again")
            target = hidden
        else:
            target = ExpertDataset.objects.select_for_update().filter(name=name).first()
            if target is None or target.layout != layout:
                raise FileImportError(
                    source, None, f"the dataset {name!r} was deleted while this file was imported, so nothing was "
                    f"added to it{' (one of that name holds other data now)' if target else ''}: import the file "
                    "again",
                )
            Experience.objects.filter(dataset=hidden).update(dataset=target)
        done = Imported(imported, name, layout, appended=hidden.appends, holds=before + imported)
        if committing:
            committing(target, done)
        if hidden.appends:
            ExpertDataset.all_objects.filter(pk=hidden.pk).delete()
        hidden_datasets.done(hidden.pk)
    return done


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


def _insert_batch(batch: list[list[Experience]], layout: str, user, source: str) -> int:
    """Insert and commit a batch of the file's rows (each one experience, or a DPO pair's two, with
    its preference: hidden with them until the dataset is shown); returns how many rows."""
    with transaction.atomic():
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


# ---- import jobs (the upload page) ----


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


@jobs.register(f"buffer.{BufferJob.Kind.IMPORT}", cancellable=True)
def _run_import(job: BufferJob, progress) -> dict:
    layout = job.params["layout"]
    if job.result:  # its rows were shown, and its worker killed before the job said so: redelivered
        job.rows_total = Imported.of_result(job.result, layout).rows
        return job.result
    if job.dataset_id is not None:  # a killed worker's half import, redelivered: start again
        hidden_datasets.delete_unready(job.dataset_id)
        job.dataset = None

    def created(hidden: ExpertDataset) -> None:
        # With the hidden dataset: a worker killed mid-import leaves its rows findable (above), and
        # no cleanup takes them for a leftover (hidden_imports).
        job.dataset = hidden
        BufferJob.objects.filter(pk=job.pk).update(dataset=hidden)

    shown = []

    def committing(dataset: ExpertDataset, imported: Imported) -> None:
        # With the rows: a job redelivered after this commit does not import them again (above).
        # The job in memory changes once they have committed (below): a failed job saves every field
        # it holds (jobs._finish), and one whose transaction failed after this (the hidden dataset's
        # delete, SQLite's "database is locked" at COMMIT) said "added 50 rows", which were not.
        BufferJob.objects.filter(pk=job.pk).update(dataset=dataset, result=imported.result())
        shown.append(dataset)

    imported = import_expert_data(
        job.upload.path,
        # A job queued before datasets had names takes its file's (the upload's own name is random).
        dataset=job.params.get("dataset") or default_dataset_name(job.original_filename),
        append=job.params.get("append", True),  # a job queued before the choice added, as imports did then
        layout=layout,
        fmt=job.params["format"],
        user=job.created_by,
        source=job.original_filename,
        progress=lambda rows, bytes_done, bytes_total: progress(rows, bytes_done),
        stop_if_cancelled=lambda: jobs.stop_if_cancelled(job),
        created=created,
        committing=committing,
    )
    job.dataset, job.rows_total = shown[0], imported.rows
    # Counted as the file's author counts: 5 pairs, not the 10 experiences they became.
    return imported.result()


@jobs.on_stop(f"buffer.{BufferJob.Kind.IMPORT}")
def _import_stopped(job: BufferJob) -> None:
    # import_expert_data deleted its hidden dataset already, unless that delete failed too (the
    # database gone): try again, and point the job at no dataset, so its row saves. Should this
    # fail as well, the dataset is a leftover of a finished job, deleted later (hidden_imports).
    if job.dataset_id is not None:
        hidden_datasets.delete_unready(job.dataset_id)
        job.dataset = None
