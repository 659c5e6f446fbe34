"""Operations on tasksets: import from a file, import jobs for uploads, generated tasksets; which
runs a deletion would break."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, connection, transaction
from django.db.models import Q

from apps.core import hidden_imports, jobs
from apps.core.files import FileImportError, ReadProgress
from apps.runs.models import Run
from workers.rft import datasets
from workers.rft.memory import held_out_split, parse_taskset_spec
from workers.rft.rewards import REWARD_FNS
from workers.rft.workflows import WORKFLOWS

from .importers import FieldMapping, TaskFields, detect_task_format, read_tasks
from .models import Task, Taskset, TasksetImport

DEFAULT_WORKFLOW = Taskset._meta.get_field("default_workflow").default
DEFAULT_REWARD_FN = Taskset._meta.get_field("default_reward_fn").default
# No run draws from a hidden taskset (none can name it), so no TaskDraw points at its tasks.
hidden_tasksets = hidden_imports.HiddenImports(Taskset, Task.objects, "taskset",
                                               lambda ids: Task.objects.filter(pk__in=ids).delete(),
                                               TasksetImport.objects, "taskset")


TASKSET_KEYS = ("taskset", "eval_taskset", "expert_taskset")  # the buffer keys that name a taskset


def runs_needing(tasksets) -> list[tuple[Run, str]]:
    """(run, taskset name) for each run that names one of `tasksets` and may still read it: every
    run but a completed one, since a stopped or failed run is resumed, reading its tasksets anew.
    Deleting such a taskset failed a running run at its next step, and left a stopped one where
    no one could resume it."""
    names = {taskset.name for taskset in tasksets}
    naming = Q()
    for key in TASKSET_KEYS:
        naming |= Q(**{f"config__buffer__{key}__in": names})
    runs = Run.objects.filter(naming).exclude(status=Run.Status.COMPLETED).order_by("pk")
    return [(run, next(name for key in TASKSET_KEYS if (name := (run.config.get("buffer") or {}).get(key)) in names))
            for run in runs.only("pk", "name", "status", "config")]


class ImportProgress(NamedTuple):
    rows_done: int
    bytes_done: int
    bytes_total: int


ProgressCallback = Callable[[ImportProgress], None]


def import_taskset(
    path,
    *,
    name: str,
    mapping: FieldMapping,
    fmt: str | None = None,
    description: str = "",
    default_workflow: str = DEFAULT_WORKFLOW,
    default_reward_fn: str = DEFAULT_REWARD_FN,
    user=None,
    source: str | None = None,
    progress: ProgressCallback | None = None,
    batch_size: int | None = None,
    max_line_bytes: int | None = None,
    created: Callable[[Taskset], None] | None = None,
) -> Taskset:
    """Create the taskset `name` from a JSONL, CSV or Parquet file, all or nothing.

    Rows are streamed and inserted `batch_size` at a time (settings.IMPORT_BATCH_ROWS by
    default), each batch committed on its own, so memory stays flat and no transaction holds the
    database long however long the file is. The taskset stays hidden (ready False: not in
    Taskset.objects) until its last batch is in; a bad row anywhere, a cancel or any other error
    deletes it and its tasks (hidden_tasksets.delete_unready). `source` is the file name shown in
    errors and on the taskset (default: the path's name); `created(taskset)` is called in the
    transaction that creates it, to record the job that fills it (without it, this process is
    recorded: hidden_imports), `progress` after every committed batch (what it raises stops the
    import). Raises FileImportError.
    """
    path = Path(path)
    source = source or path.name
    fmt = fmt or detect_task_format(path.name)
    if max_line_bytes is None:
        max_line_bytes = settings.TASKSET_IMPORT_MAX_LINE_BYTES
    batch_size = batch_size or settings.IMPORT_BATCH_ROWS
    check_new_taskset_name(name, source)
    check_defaults(default_workflow, default_reward_fn, source)
    if len(description) > Taskset.MAX_DESCRIPTION:  # the form checks it; manage.py import_taskset does not
        raise FileImportError(source, None, f"the description is {len(description):,} characters; "
                                            f"at most {Taskset.MAX_DESCRIPTION:,}")
    rows = read_tasks(path, fmt, mapping, display_name=source, max_line_bytes=max_line_bytes)
    with transaction.atomic():
        taskset = _create_taskset(
            name=name,
            description=description,
            field_mapping={"format": fmt, **mapping.to_dict()},
            default_workflow=default_workflow,
            default_reward_fn=default_reward_fn,
            source=source,
            created_by=user,
            ready=False,
        )
        hidden_tasksets.created(taskset, created)
    try:
        _insert_tasks(taskset, rows, batch_size, progress)
    except BaseException:
        hidden_tasksets.delete_unready(taskset.pk)
        raise
    return taskset


def check_new_taskset_name(name: str, source: str = "") -> None:
    """Raise FileImportError unless `name` is a free, valid taskset name."""
    try:
        validate_slug(name)
    except ValidationError:
        raise FileImportError(
            source, None, f"{name!r} is not a valid taskset name (letters, digits, - and _)"
        ) from None
    taken = name_taken(name)
    if taken:
        raise FileImportError(source, None, taken)


def name_taken(name: str, instead_of: Taskset | None = None) -> str | None:
    """Why `name` cannot be a new taskset's (or `instead_of`'s new name): another taskset has it,
    in any case: 'good-csv' beside 'Good-CSV' looked like one taskset in the launch form's list."""
    others = Taskset.all_objects.filter(name__iexact=name)  # one being imported has its name too
    if instead_of is not None:
        others = others.exclude(pk=instead_of.pk)
    hidden_tasksets.set_aside(others)  # a killed import's frees its name (hidden_imports)
    found = others.values_list("pk", "name", "ready").first()
    if found is None:
        return None
    pk, other, ready = found
    importing = f"is being imported ({hidden_tasksets.importer(pk) or 'an import ending now'})"
    return (f"a taskset named {other!r} " + ("already exists" if ready else importing)
            + (" (names differ only in case)" if other != name else ""))


def rename_problem(taskset: Taskset, name: str) -> str | None:
    """Why `taskset` may not be renamed `name`: a run that may still read it (every run but a
    completed one: a stopped or failed run is resumed) finds its tasksets by name, so it would
    fail at its next step or resume (runs_needing, as a delete is refused)."""
    if name == taskset.name:
        return None
    taken = name_taken(name, instead_of=taskset)
    if taken:
        return taken
    runs = runs_needing([taskset])
    if runs:
        named = ", ".join(f"run {run.pk} {run.name!r} ({run.status})" for run, _ in runs)
        return (f"{named} {'read' if len(runs) > 1 else 'reads'} taskset {taskset.name!r} by its name: renamed, it "
                "would fail at its next step or resume; rename it once those runs are completed or deleted")
    return None


def check_defaults(workflow: str, reward_fn: str, source: str = "") -> None:
    """Raise FileImportError unless the workflow and reward fn are registered: a taskset naming an
    unknown one would import, then fail every run launched on it."""
    for registry, name in ((WORKFLOWS, workflow), (REWARD_FNS, reward_fn)):
        if name not in registry:
            raise FileImportError(
                source, None, f"unknown {registry.kind} {name!r}; known: {', '.join(registry.names())}"
            )


def _create_taskset(**fields) -> Taskset:
    try:
        return Taskset.all_objects.create(**fields)
    except IntegrityError:  # another import took the name since check_new_taskset_name
        raise FileImportError(fields["source"], None, f"a taskset named {fields['name']!r} already exists") from None


def _insert_tasks(
    taskset: Taskset,
    rows: Iterable[tuple[TaskFields, ReadProgress]],
    batch_size: int,
    progress: ProgressCallback | None,
) -> None:
    batch, count, read = [], 0, None
    for fields, read in rows:
        batch.append(
            Task(
                taskset_id=taskset.pk,
                index=count,
                prompt=fields.prompt,
                answer=fields.answer,
                metadata=fields.metadata,
                difficulty=fields.difficulty,
            )
        )
        count += 1
        if len(batch) == batch_size:
            _flush(batch)
            if progress:
                progress(ImportProgress(count, read.bytes_read, read.bytes_total))
    with transaction.atomic():  # the last tasks, the count and the taskset shown, at once
        _flush(batch)
        taskset.task_count, taskset.ready = count, True
        taskset.save(update_fields=["task_count", "ready"])
        hidden_tasksets.done(taskset.pk)
    if progress:
        progress(ImportProgress(count, read.bytes_total, read.bytes_total))


def _flush(batch: list[Task]) -> None:
    with transaction.atomic():  # one short write transaction per batch (settings.IMPORT_BATCH_ROWS)
        Task.objects.bulk_create(batch)
    batch.clear()
    # With DEBUG on, Django keeps the SQL of every query; a million-row import would keep it all.
    connection.queries_log.clear()


# ---- import jobs (the upload page) ----


def start_taskset_import(
    *,
    upload,
    name: str,
    fmt: str,
    mapping: FieldMapping,
    description: str = "",
    default_workflow: str = DEFAULT_WORKFLOW,
    default_reward_fn: str = DEFAULT_REWARD_FN,
    user=None,
) -> TasksetImport:
    """Save an uploaded file under MEDIA_ROOT/uploads/ and queue its import (run_import) once this
    transaction commits (embedded, it runs on a thread of this process: see rftweb.celery.enqueue)."""
    job = TasksetImport(
        original_filename=Path(upload.name).name,
        name=name,
        format=fmt,
        field_mapping=mapping.to_dict(),
        description=description,
        default_workflow=default_workflow,
        default_reward_fn=default_reward_fn,
        bytes_total=upload.size,
        created_by=user,
    )
    job.upload.save(upload.name, upload, save=False)  # copied in chunks, never whole in memory
    job.save()
    jobs.enqueue_job(job)
    return job


@jobs.register(TasksetImport.job_type, cancellable=True)
def run_import(job: TasksetImport, progress: jobs.Progress) -> Taskset:
    if job.taskset_id is not None:  # run again: by a killed worker's redelivery, or after its end failed to save
        imported = Taskset.objects.filter(pk=job.taskset_id).first()  # shown: the import had finished
        if imported is not None:
            job.rows_total = imported.task_count
            return imported
        hidden_tasksets.delete_unready(job.taskset_id)  # a half import: start again

    def created(taskset: Taskset) -> None:
        # With the taskset: a worker killed mid-import leaves it findable (above), and no cleanup
        # takes it for a leftover (hidden_imports).
        job.taskset = taskset
        type(job).objects.filter(pk=job.pk).update(taskset=taskset)

    def reported(update: ImportProgress) -> None:
        # After each committed batch: a cancel stops the import, which deletes what it wrote.
        progress(update.rows_done, update.bytes_done)
        jobs.stop_if_cancelled(job)

    taskset = import_taskset(
        job.upload.path,
        name=job.name,
        fmt=job.format,
        mapping=FieldMapping.from_dict(job.field_mapping),
        description=job.description,
        default_workflow=job.default_workflow,
        default_reward_fn=job.default_reward_fn,
        user=job.created_by,
        source=job.original_filename,
        progress=reported,
        created=created,
    )
    job.rows_total = taskset.task_count
    return taskset


@jobs.on_stop(TasksetImport.job_type)
def _import_stopped(job: TasksetImport) -> None:
    # import_taskset deleted its taskset already, unless that delete failed too (the database
    # gone): try again, and point the job at no taskset, so its row saves. Should this fail as
    # well, the taskset is a leftover of a finished job, deleted later (hidden_imports).
    if job.taskset_id is not None:
        hidden_tasksets.delete_unready(job.taskset_id)
        job.taskset = None


# ---- generated tasksets ----


@dataclass(frozen=True)
class GeneratedTaskset:
    """A taskset made by one of the engine's generators (workers.rft.datasets)."""

    name: str
    generator: str
    n: int
    seed: int = 0
    params: dict = field(default_factory=dict)
    held_out_from: str | None = None  # no prompt of this taskset appears in the new one
    split: str | None = None  # 'train' | 'eval': the engine's fixed held-out split (workers.rft.memory)
    description: str = ""
    default_workflow: str = DEFAULT_WORKFLOW
    default_reward_fn: str = DEFAULT_REWARD_FN


# Operands up to 30 give ~3,000 distinct arithmetic problems: enough that 2,000 training draws
# still leave plenty unseen for a genuinely held-out eval set (with the generator's default of 10
# there are ~300, and the training set covers nearly all of them).
ARITHMETIC_PARAMS = {"max_operand": 30}
# Single-digit addition, split as the engine splits it headless (`arithmetic:n=1000,max_operand=9,
# ops=+,split=train|eval`): the demo run and tests/workers/rft/test_learning.py learn the same task.
ADDITION_PARAMS = {"max_operand": 9, "ops": "+"}
BUILTIN_TASKSETS = (
    GeneratedTaskset(
        "addition",
        "arithmetic",
        1_000,
        params=ADDITION_PARAMS,
        split="train",
        description="Single-digit addition (the distinct problems minus a held-out fifth): the quick demo's task.",
    ),
    GeneratedTaskset(
        "addition-eval",
        "arithmetic",
        1_000,
        params=ADDITION_PARAMS,
        split="eval",
        description="The held-out fifth of single-digit addition; never in 'addition'.",
    ),
    GeneratedTaskset(
        "arithmetic",
        "arithmetic",
        2_000,
        seed=0,
        params=ARITHMETIC_PARAMS,
        description="a + b, a - b and a * b with operands 0..30.",
        default_reward_fn="exact_match",
    ),
    GeneratedTaskset(
        "arithmetic-eval",
        "arithmetic",
        200,
        seed=1,
        params=ARITHMETIC_PARAMS,
        held_out_from="arithmetic",
        description="Held-out arithmetic: 200 distinct problems, none of them in 'arithmetic'.",
        default_reward_fn="exact_match",
    ),
    GeneratedTaskset(
        "countdown",
        "countdown",
        1_000,
        seed=0,
        description="Reach a target number from three numbers with + - * / (answer inside <answer></answer>).",
        default_reward_fn="countdown",
    ),
    GeneratedTaskset(
        "episodes",
        "episodes",
        64,
        description="Environment episodes, one seed each, for explorer.workflow: multi_turn (the environment is "
        "named by explorer.workflow_args.env).",
    ),
)


def missing_taskset(name: str) -> str:
    """Why a run config's taskset `name` names no taskset here, and what to name instead. The headless
    engine reads a name as a generator spec or a file (workers/rft/memory.py), so every example config
    names one (`arithmetic:n=1000,max_operand=9,ops=+,split=train`); a server reads only the tasksets it
    holds, and its built-in ones are those specs' tasks under a name."""
    builtin = [spec for spec in BUILTIN_TASKSETS if spec.name == name]
    if builtin:
        return (f"no taskset named {name!r}: it is built in but not loaded on this server yet "
                "(`python manage.py load_builtin_tasksets` loads it; `make demo` does)")
    generator, params = parse_taskset_spec(name)
    if generator not in datasets.BUILTIN_TASKSETS:
        return f"no taskset named {name!r}: upload it, or pick one the Tasksets page lists"
    wanted = {"n": params.pop("n", 100), "seed": params.pop("seed", 0), "split": params.pop("split", None), **params}
    made_by = [spec for spec in BUILTIN_TASKSETS if spec.generator == generator]
    same = [spec.name for spec in made_by if not spec.held_out_from
            and {"n": spec.n, "seed": spec.seed, "split": spec.split, **spec.params} == wanted]
    headless = f"no taskset named {name!r}: a generator spec, which only the headless engine reads"
    if same:
        return f"{headless}; name the built-in taskset {same[0]!r} instead: it holds this spec's tasks"
    return (f"{headless}; name a taskset instead: upload yours, or a built-in one made by {generator!r} "
            f"({', '.join(spec.name for spec in made_by)})")


def create_generated_taskset(spec: GeneratedTaskset, *, user=None) -> Taskset:
    """Create a taskset from a generator spec. Raises FileImportError if the name is taken."""
    settings_text = ", ".join([f"n={spec.n}", f"seed={spec.seed}", *(f"{k}={v}" for k, v in spec.params.items())])
    if spec.split:
        settings_text += f", split={spec.split}"
    source = f"generated by {spec.generator} ({settings_text})"
    check_new_taskset_name(spec.name, source)
    if spec.held_out_from:
        excluded = set(Taskset.objects.get(name=spec.held_out_from).own_tasks.values_list("prompt", flat=True))
        tasks = _held_out_tasks(spec, excluded)
    else:
        tasks = datasets.generate(spec.generator, spec.n, seed=spec.seed, **spec.params)
    if spec.split:
        tasks = held_out_split(tasks, spec.split)
    with transaction.atomic():
        taskset = _create_taskset(
            name=spec.name,
            description=spec.description,
            default_workflow=spec.default_workflow,
            default_reward_fn=spec.default_reward_fn,
            source=source,
            created_by=user,
        )
        Task.objects.bulk_create(
            Task(
                taskset=taskset,
                index=index,
                prompt=task["prompt"],
                answer=task["answer"],
                metadata=task.get("metadata") or {},
                difficulty=task.get("difficulty") or 0.0,
            )
            for index, task in enumerate(tasks)
        )
        taskset.task_count = len(tasks)
        taskset.save(update_fields=["task_count"])
    return taskset


def _held_out_tasks(spec: GeneratedTaskset, excluded: set) -> list[dict]:
    """The first `spec.n` distinct generated tasks whose prompt is not in `excluded`.

    The generator is deterministic and its first k tasks are a prefix of its first 2k, so asking
    for more until there are enough keeps the result a function of the spec alone."""
    wanted = 4 * spec.n
    while True:
        chosen, seen = [], set(excluded)
        for task in datasets.generate(spec.generator, wanted, seed=spec.seed, **spec.params):
            if task["prompt"] not in seen:
                seen.add(task["prompt"])
                chosen.append(task)
                if len(chosen) == spec.n:
                    return chosen
        if wanted >= 64 * spec.n:
            raise ValueError(
                f"{spec.generator} with {spec.params} has fewer than {spec.n} problems outside {spec.held_out_from!r}"
            )
        wanted *= 2


def load_builtin_tasksets(*, user=None) -> list[tuple[str, bool]]:
    """Create the built-in tasksets that do not exist yet; return (name, created) for each."""
    results = []
    for spec in BUILTIN_TASKSETS:
        if Taskset.objects.filter(name=spec.name).exists():
            results.append((spec.name, False))
        else:
            create_generated_taskset(spec, user=user)
            results.append((spec.name, True))
    return results
