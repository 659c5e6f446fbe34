"""State changes of the buffer: rollouts from the explorer, and the curators' work from the admin.

Curation acts on a selection (a queryset of experiences, typically the admin changelist's). Quick
set-based changes (status, priority, delete) run in the request. Anything that reads every row
in Python (import, export, re-score, promote, a pipeline operator) is a `BufferJob`, each kind a
job type that apps.core.jobs runs on a Celery worker of the `default` queue: the job fixes the
selected ids when the curator confirms, reports its progress as it goes, and changes the buffer
all or nothing. Each kind stops when cancelled between two chunks of rows (jobs.stop_if_cancelled
in `_selected_rows` and between the import's batches), rolling back what it had done.
"""

import copy
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.db.models import BinaryField, ExpressionWrapper, F
from django.db.models.functions import MD5

from apps.core import jobs
from apps.core.files import FileImportError
from apps.core.jobs import JobError
from apps.feedback import history as feedback_history
from apps.feedback.models import Feedback
from apps.runs.config_checks import checked_reward_fn
from apps.tasksets.store import to_task
from workers.rft.rewards import build_reward

from . import exporters, importers
from .models import BufferJob, Experience
from .store import COPIED_FIELDS, to_experience, to_row

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


def import_expert_data(
    path,
    *,
    layout: str = "sft",
    fmt: str | None = None,
    user=None,
    source: str | None = None,
    progress: Callable | None = None,
    batch_size: int = IMPORT_BATCH_ROWS,
    stop_if_cancelled: Callable[[], None] | None = None,
) -> int:
    """Import a JSONL or Parquet file of expert data as experiences of source `expert` with no run,
    all or nothing: rows are streamed and inserted `batch_size` at a time inside one transaction,
    so a bad row anywhere leaves nothing behind. A DPO row becomes two experiences (chosen: ready;
    rejected: status rejected, so it is never imitated) and `user`'s preference between them.
    `progress(rows, bytes_done, bytes_total)` is called after every batch, and
    `stop_if_cancelled()` too, inside the transaction: what it raises rolls the import back.
    Returns the number of experiences created. Raises FileImportError."""
    path = Path(path)
    source = source or path.name
    fmt = fmt or importers.detect_expert_format(path.name)
    if layout == "dpo" and user is None:
        raise FileImportError(source, None, "a DPO import needs a user: each pair becomes their preference")
    rows = importers.read_expert_data(path, fmt, layout, display_name=source)
    pair_prefix = f"pair-{uuid.uuid4().hex[:12]}"  # each pair is a group of two, so the admin shows them side by side
    batch, created, read = [], 0, None
    with transaction.atomic():
        for number, (experiences, read) in enumerate(rows):
            if layout == "dpo":
                chosen, rejected = experiences
                group = f"{pair_prefix}-{number}"
                batch.append([_expert_row(chosen, group), _expert_row(rejected, group, Experience.Status.REJECTED)])
            else:
                batch.append([_expert_row(experiences[0])])
            if len(batch) == batch_size:
                created += _insert_imported(batch, layout, user, source)
                if progress:
                    progress(created, read.bytes_read, read.bytes_total)
                if stop_if_cancelled:
                    stop_if_cancelled()
        created += _insert_imported(batch, layout, user, source)
    if progress:
        progress(created, read.bytes_total, read.bytes_total)
    return created


def _expert_row(
    fields: importers.ExperienceFields, group_id: str | None = None, status=Experience.Status.READY
) -> Experience:
    return Experience(
        run=None,
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
    rows = Experience.objects.bulk_create([row for experiences in batch for row in experiences])
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
    batch.clear()
    # With DEBUG on, Django keeps the SQL of every query; a million-row import would keep it all.
    connection.queries_log.clear()
    return len(rows)


def start_import(*, upload, layout: str, fmt: str, user=None) -> BufferJob:
    """Save an uploaded file under MEDIA_ROOT and queue its import once this transaction commits."""
    job = BufferJob(
        kind=BufferJob.Kind.IMPORT,
        params={"layout": layout, "format": fmt},
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
    return _start_selection_job(BufferJob.Kind.EXPORT, queryset, {"what": what, "format": fmt}, user)


def export_rows(
    rows: Iterable[tuple[int, list]], path: Path, *, what: str, fmt: str, progress: Callable | None = None
) -> int:
    """Write chunks of rows, as `_selected_rows` yields them, to `path`; returns rows written."""
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
        rows = export_rows(_selected_rows(job, EXPORTS[what][0]()), path, what=what, fmt=fmt, progress=progress)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {"exported": rows, "file_bytes": path.stat().st_size}


def export_filename(job: BufferJob) -> str:
    return f"{job.params['what']}-{job.pk}.{job.params['format']}"


# ---- jobs over a selection: re-score, promote, pipeline operator ----


def start_rescore(queryset, *, reward_fn, user=None) -> BufferJob:
    """Queue re-scoring the selection with a reward fn spec (a name, or {name: weight}), checked as
    a launch checks explorer.reward_fn (its models confined and stored resolved); raises
    ConfigError naming each bad key."""
    spec = checked_reward_fn(reward_fn)
    return _start_selection_job(BufferJob.Kind.RESCORE, queryset, {"reward_fn": spec}, user)


@jobs.register(f"buffer.{BufferJob.Kind.RESCORE}", cancellable=True)
def _rescore(job: BufferJob, progress) -> dict:
    """reward and reward_components from the reward fn, on the response and the row's task; the
    previous reward is kept in metadata['rescored']. Rows without a task (imported data) have no
    answer to check and are skipped. Advantages are left as they were."""
    spec = job.params["reward_fn"]
    reward = build_reward(spec)
    counts = Counter(rescored=0, skipped_without_task=0)
    rows = Experience.objects.select_related("task").only(
        "response_text", "reward", "reward_components", "metadata", "task"
    )
    with transaction.atomic():
        for done, chunk in _selected_rows(job, rows):
            scored = [row for row in chunk if row.task is not None]
            for row in scored:
                try:
                    total, components = reward(row.response_text, to_task(row.task))
                except Exception as exc:
                    raise JobError(f"the reward fn failed on experience {row.pk}: {exc!r}") from exc
                row.metadata = {**row.metadata, "rescored": {"reward_fn": spec, "previous_reward": row.reward}}
                row.reward, row.reward_components = total, components
            Experience.objects.bulk_update(scored, ["reward", "reward_components", "metadata"])
            counts.update(rescored=len(scored), skipped_without_task=len(chunk) - len(scored))
            progress(done)
    return dict(counts)


def start_promotion(queryset, *, user=None) -> BufferJob:
    return _start_selection_job(BufferJob.Kind.PROMOTE, queryset, {}, user)


@jobs.register(f"buffer.{BufferJob.Kind.PROMOTE}", cancellable=True)
def _promote(job: BufferJob, progress) -> dict:
    """An expert copy of each selected experience (MIX and SFT imitate expert data), ready, in
    the same run, with the original as its parent. Expert rows, and rows promoted before, are skipped."""
    counts = Counter(promoted=0, skipped=0)
    with transaction.atomic():
        for done, chunk in _selected_rows(job, Experience.objects.all()):
            promoted_before = set(
                Experience.objects.filter(
                    parent_id__in=[row.pk for row in chunk], source=Experience.Source.EXPERT
                ).values_list("parent_id", flat=True)
            )
            copies = [
                _expert_copy(row)
                for row in chunk
                if row.source != Experience.Source.EXPERT and row.pk not in promoted_before
            ]
            Experience.objects.bulk_create(copies)
            counts.update(promoted=len(copies), skipped=len(chunk) - len(copies))
            progress(done)
    return dict(counts)


def _expert_copy(row: Experience) -> Experience:
    fields = {name: getattr(row, name) for name in COPIED_FIELDS if name != "use_count"}
    fields |= {
        "source": Experience.Source.EXPERT,
        "group_id": f"promoted-{row.group_id}"[:100],
        "advantage": None,  # expert data is imitated, not weighted
    }
    return Experience(
        **fields, run_id=row.run_id, task_id=row.task_id, status=Experience.Status.READY, parent_id=row.pk
    )


def check_operator(name: str, params: dict):
    """The experience pipeline operator `name` (workers.rft.pipelines) if `params` are what it
    declares, checked as a run config's pipeline is (config.operator_issues: names, types, bounds);
    raises ConfigError naming each bad one otherwise."""
    from workers.rft.config import ConfigError, operator_issues
    from workers.rft.pipelines import EXPERIENCE_OPERATORS  # imports torch: only where an operator is asked for

    issues = operator_issues([{"name": name, **params}], EXPERIENCE_OPERATORS, "operator")
    if issues:
        raise ConfigError(issues)
    return EXPERIENCE_OPERATORS.get(name)


def start_pipeline(queryset, *, operator: str, params: dict, user=None) -> BufferJob:
    """Queue running an experience pipeline operator over the selection; raises ConfigError for an
    unknown operator or parameters it does not declare."""
    check_operator(operator, params)
    # Operators compare experiences within a task (dedupe) or a group (group_std_filter): the
    # rows are processed in task and group order, never splitting a task between chunks.
    order = (F("task_id").asc(nulls_last=True), MD5("prompt_text"), "group_id", "pk")
    return _start_selection_job(
        BufferJob.Kind.PIPELINE, queryset, {"operator": operator, "params": params}, user, order=order
    )


@jobs.register(f"buffer.{BufferJob.Kind.PIPELINE}", cancellable=True)
def _run_pipeline(job: BufferJob, progress) -> dict:
    """Run the operator as the explorer would, over the selection one whole task at a time, and
    store the outcome: rows it drops become `rejected` (metadata['rejected_by'] names it), changed
    fields are saved, experiences it adds (promote_to_expert's copies) are inserted with the row
    they came from as parent. Rows without token ids (text-only imported data) are skipped: the
    operators measure and compare responses by their tokens."""
    from workers.rft.pipelines import EXPERIENCE_OPERATORS, PipelineContext, build_operators, run_experience_operators

    name = job.params["operator"]
    ops = build_operators(EXPERIENCE_OPERATORS, [{"name": name, **job.params["params"]}])
    context = PipelineContext()
    counts = Counter(kept=0, changed=0, rejected=0, added=0, skipped_without_tokens=0)
    with transaction.atomic():
        for done, rows in _whole_tasks(_selected_rows(job, Experience.objects.all())):
            usable = [row for row in rows if row.response_ids is not None]
            counts["skipped_without_tokens"] += len(rows) - len(usable)
            try:
                outcome, metrics = run_experience_operators(ops, [_engine_experience(row) for row in usable], context)
            except Exception as exc:
                raise JobError(
                    f"operator {name!r} failed on experiences {usable[0].pk}…{usable[-1].pk}: {exc!r}"
                ) from exc
            counts.update(_store_outcome(usable, outcome, name))
            counts.update({key: value for key, value in metrics.items() if isinstance(value, int)})
            progress(done)
    return dict(counts)


def _task_key(row: Experience):
    """What the operators take for the row's task: the task, or for a row without one, its prompt."""
    return row.task_id if row.task_id is not None else ("prompt", row.prompt_text)


def _engine_experience(row: Experience):
    """The row as the engine's Experience, with copies of everything an operator might change in place."""
    experience = to_experience(row)
    return replace(
        experience,
        task_id=_task_key(row),
        prompt_ids=list(row.prompt_ids or []),
        response_ids=list(row.response_ids),
        action_mask=list(row.action_mask or []),
        messages=copy.deepcopy(row.messages),
        reward_components=copy.deepcopy(row.reward_components),
        metadata=copy.deepcopy(row.metadata),
    )


def _store_outcome(rows: list[Experience], outcome: list, operator: str) -> Counter:
    by_id = {row.pk: row for row in rows}
    kept, changed, changed_fields, added = set(), [], set(), []
    for experience in outcome:
        row = by_id.get(experience.id)
        if row is None:
            raise JobError(
                f"operator {operator!r} made an experience from none of the selected ones; the admin cannot place it"
            )
        if experience.id in kept:  # a second experience from the same row: a new one
            new = to_row(experience, row.run_id)
            new.task_id, new.parent_id = row.task_id, row.pk  # the operator saw a stand-in task key
            added.append(new)
            continue
        kept.add(experience.id)
        fields = [name for name in COPIED_FIELDS if not _same(getattr(row, name), getattr(experience, name))]
        for name in fields:
            setattr(row, name, getattr(experience, name))
        if fields:
            changed.append(row)
            changed_fields.update(fields)
    rejected = [row for row in rows if row.pk not in kept]
    for row in rejected:
        row.status, row.metadata = Experience.Status.REJECTED, {**row.metadata, "rejected_by": operator}
    if changed:
        Experience.objects.bulk_update(changed, sorted(changed_fields))
    Experience.objects.bulk_update(rejected, ["status", "metadata"])
    feedback_history.status_decided([row.pk for row in rejected])
    Experience.objects.bulk_create(added)
    return Counter(kept=len(kept), changed=len(changed), rejected=len(rejected), added=len(added))


def _same(stored, produced) -> bool:
    # A missing token array reaches the operators as an empty list.
    return stored == produced or (stored is None and produced == [])


def _whole_tasks(chunks: Iterator[tuple[int, list]]) -> Iterator[tuple[int, list]]:
    """Re-cut (rows read, rows) chunks so that no task's experiences are split between two."""
    pending, done = [], 0
    for done, rows in chunks:
        rows = pending + rows
        cut = len(rows)
        while cut and _task_key(rows[cut - 1]) == _task_key(rows[-1]):
            cut -= 1
        pending = rows[cut:]
        if cut:
            yield done, rows[:cut]
    if pending:
        yield done, pending


# ---- running jobs ----


def _start_selection_job(kind: str, queryset, params: dict, user, order=("pk",)) -> BufferJob:
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


def _selected_rows(job: BufferJob, rows) -> Iterator[tuple[int, list]]:
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
    created = import_expert_data(
        job.upload.path,
        layout=job.params["layout"],
        fmt=job.params["format"],
        user=job.created_by,
        source=job.original_filename,
        progress=lambda rows, bytes_done, bytes_total: progress(rows, bytes_done),
        stop_if_cancelled=lambda: jobs.stop_if_cancelled(job),
    )
    job.rows_total = created
    return {"imported": created}


def delete_jobs(queryset) -> int:
    """Delete finished jobs with their files (uploads not yet imported, export files), but never
    a retention archive that holds rows the job deleted: it is their only copy (the run's
    buffer_retirement names it; kept_archives lists them). Raises JobError, deleting nothing, if
    one is pending or running (jobs.refuse_unfinished)."""
    doomed = list(queryset)
    jobs.refuse_unfinished(doomed)
    for job in doomed:
        for file in (job.upload, None if job.archive_holds_deleted_rows else job.output):
            if file:
                file.delete(save=False)
    return BufferJob.objects.filter(pk__in=[job.pk for job in doomed]).delete()[0]


def kept_archives(queryset) -> list[str]:
    """The archives delete_jobs would keep of these jobs (paths under the data dir)."""
    return [job.output.name for job in queryset if job.archive_holds_deleted_rows]
