"""State changes of runs. Views, commands and workers call these, never the models directly."""
import logging
import math

from django.db import connection, transaction
from django.utils import timezone

from apps.alerts import services as alerts
from apps.saved_models.directories import lock_named, not_resumable
from apps.tasksets.models import Taskset
from apps.tasksets.services import TASKSET_KEYS, missing_taskset
from rftweb.celery import enqueue, withdraw
from workers.rft.config import ConfigError, ConfigIssue, RunConfig, model_paths
from workers.rft.config_rules import data_issues

from . import summaries
from .checkpoints import forget_versions_after, lock_loaded, resume_point
from .config_checks import expert_dataset_gone, expert_dataset_issue, model_issues, source_run_issues
from .config_fit import fit_issues
from .duties import duties_of_run, workers_holding
from .live import broadcast
from .models import MetricPoint, Run
from .queries import unix_time
from .rewind import resume_counters, rewind

Status = Run.Status
logger = logging.getLogger(__name__)

# Which status may follow which. Anything else is refused with InvalidTransition. A run stops at
# once (-> stopped) when no worker holds it; a failed or stopped run is resumed by queueing it again.
TRANSITIONS: dict[str, set[str]] = {
    Status.QUEUED: {Status.STARTING, Status.STOPPED, Status.FAILED},
    Status.STARTING: {Status.RUNNING, Status.STOPPING, Status.STOPPED, Status.FAILED},
    Status.RUNNING: {Status.PAUSED, Status.STOPPING, Status.STOPPED, Status.COMPLETED, Status.FAILED},
    Status.PAUSED: {Status.RUNNING, Status.STOPPING, Status.STOPPED, Status.FAILED},
    Status.STOPPING: {Status.STOPPED, Status.FAILED},
    Status.STOPPED: {Status.QUEUED},
    Status.COMPLETED: set(),
    Status.FAILED: {Status.QUEUED},
}


class InvalidTransition(Exception):
    pass


@transaction.atomic
def set_status(run: Run, new_status: str, *, error: str | None = None) -> Run:
    """Move the run to `new_status`; `error` replaces the run's error ("" clears it). The lock is
    FOR NO KEY UPDATE, as live.next_seq's: the run's points and experiences are written meanwhile."""
    locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
    if new_status not in TRANSITIONS[locked.status]:
        raise InvalidTransition(f"run {locked.pk} cannot go from {locked.status} to {new_status}")
    locked.status = new_status
    now = timezone.now()
    if new_status == Status.RUNNING and locked.started_at is None:
        locked.started_at = now
    locked.finished_at = now if new_status in Run.FINISHED else None  # a resumed run is unfinished again
    if error is not None:
        locked.error = error
    locked.save(update_fields=["status", "started_at", "finished_at", "error", "updated_at"])
    if new_status in Run.FINISHED and locked.queued_tasks:
        transaction.on_commit(lambda: drop_queued(locked.pk))  # its duties' queued tasks go
    broadcast(locked.pk, {"type": "status", "status": locked.status, "error": locked.error})
    transaction.on_commit(lambda: _alert(locked.pk))
    run.refresh_from_db()
    return locked


def _alert(run_id: int) -> None:
    """Its owner's alerts and its sweep's end (apps/alerts): never in the way of the run itself."""
    try:
        alerts.run_changed(run_id)
    except Exception:  # noqa: BLE001 - logged; the run's status change has committed
        logger.exception("alerts for run %s failed", run_id)


def finite_or_none(value):
    """Postgres JSON has no NaN or infinity; a diverged loss is stored as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def record_metrics(run: Run, role: str, step: int, values: dict) -> MetricPoint:
    """The run's point of `role` at `step`, and its summaries of the point's metrics with it
    (summaries.record). A replayed step (after a resume) replaces its point, whose time then says
    when it was recorded."""
    values = {key: finite_or_none(value) for key, value in values.items()}
    point = MetricPoint(run=run, role=role, step=step, values=values, time=timezone.now())
    with transaction.atomic(savepoint=False):
        replaced = _write_point(point)
        summaries.record(run.pk, role, step, values, replaced)
    broadcast(run.pk, {"type": "metrics", "role": role, "step": step, "time": unix_time(point.time),
                       "values": values})
    return point


def _write_point(point: MetricPoint) -> dict | None:
    """Insert the point, else replace the one at its step; the values it replaced (None: it is new).
    A new step is one statement, as the upsert it replaces was. The insert waits for another
    transaction's insert of the same step and then finds it, so what it replaced is always what
    was committed: the summaries take it out."""
    fields = [MetricPoint._meta.get_field(name) for name in ("run", "role", "step", "values", "time")]
    quote = connection.ops.quote_name
    insert = (f"INSERT INTO {MetricPoint._meta.db_table} ({', '.join(quote(field.column) for field in fields)}) "
              f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT (run_id, role, step) DO NOTHING RETURNING id")
    params = [field.get_db_prep_save(getattr(point, field.attname), connection) for field in fields]
    while True:  # again only if the point was deleted (the admin) between the insert and the lock
        with connection.cursor() as cursor:
            cursor.execute(insert, params)
            inserted = cursor.fetchone()
        if inserted:
            point.pk = inserted[0]
            return None
        at_step = MetricPoint.objects.filter(run_id=point.run_id, role=point.role, step=point.step)
        # The point's row alone: ordered by MetricPoint's default (run first) it was a join, and
        # FOR UPDATE locked the run's row too, a lock the foreign key checks of other duties'
        # inserts wait for at their commit (two duties rewriting the same eval steps deadlocked).
        held = at_step.select_for_update(of=("self",)).order_by("pk").values_list("pk", "values").first()
        if held:
            at_step.update(values=point.values, time=point.time)
            point.pk = held[0]
            return held[1]


def taskset_issues(buffer, *, resuming: bool = False) -> list[ConfigIssue]:
    """The buffer section's taskset keys (TASKSET_KEYS) that name no taskset here, or one without
    tasks: a launch's refusal, and a resume's (a taskset renamed, deleted or emptied since: a run
    on an emptied taskset was launched, and resumed, only to fail at its first step)."""
    issues = []
    for key in TASKSET_KEYS:
        if not (name := buffer.get(key)):
            continue
        taskset = Taskset.objects.filter(name=name).first()  # NUL: refused by from_dict
        if taskset is None:
            since = " (renamed or deleted since it launched?)" if resuming else ""
            issues.append(ConfigIssue(f"buffer.{key}", missing_taskset(name) + since))
        elif not taskset.own_tasks.exists():
            since = " since it launched" if resuming else ""
            issues.append(ConfigIssue(f"buffer.{key}", f"taskset {name!r} has no tasks (they were deleted{since}): "
                                                        "upload tasks to a new taskset and name it"))
    return issues


def validate_config(config: dict) -> RunConfig:
    """The engine's schema, plus what a shared server adds: model directories confined to the
    allowed roots (stored resolved), tasksets that exist, feedback source runs that exist and whose
    edits and pairs fit this run's tokenizer and prompts (config_checks.source_run_issues), a trainer
    some data could reach (config_rules.data_issues), and a run the live workers can hold
    (config_fit.fit_issues). Raises ConfigError naming each bad key.
    (Whoever may launch may name any run: launching needs the researcher role, and researchers
    watch every run, docs/security.md.)"""
    parsed = RunConfig.from_dict(config)
    issues = taskset_issues({key: getattr(parsed.buffer, key) for key in TASKSET_KEYS})
    dataset_issue = expert_dataset_issue(parsed)
    issues += [dataset_issue] if dataset_issue else []
    # A trainer nothing could ever reach trained nothing for its whole run (a mode 'train' grpo, sft
    # without expert data, dpo without pairs): the web app's sources count (annotators, imports).
    issues += data_issues(parsed, web=True)
    sources = list(Run.objects.filter(pk__in=parsed.feedback.source_runs).values_list("pk", "name", "config"))
    known_runs = {run_id for run_id, _, _ in sources}
    issues += [
        ConfigIssue("feedback.source_runs", f"no run with id {run_id}")
        for run_id in parsed.feedback.source_runs if run_id not in known_runs
    ]
    bad_models, resolved_models = model_issues(parsed)
    issues += [ConfigIssue(key, message) for key, message in bad_models]
    if sources and "model.path" not in {key for key, _ in bad_models}:
        policy = parsed.model.model_copy(update={"path": resolved_models.get("model.path", parsed.model.path)})
        issues += source_run_issues(parsed.model_copy(update={"model": policy}), sources)
    if issues:
        raise ConfigError(issues)
    for key, directory in resolved_models.items():
        setattr(parsed.model, key.removeprefix("model."), directory)
    too_big = fit_issues(parsed)  # what the live workers cannot hold: memory, cores, GPUs
    if too_big:
        raise ConfigError(too_big)
    return parsed


def launch_run(owner, name: str, config: dict) -> Run:
    """Validate, create the run and, once that commits, hand it to the workers."""
    parsed = validate_config(config)
    with transaction.atomic():
        # A saved model renamed since validate_config looked: refused, not a run that fails at start.
        # Likewise a checkpoint keep_checkpoints' rotation deleted since (checkpoints.lock_loaded).
        paths = {key: path for key, (path, _) in model_paths(parsed).items()}
        gone = lock_named(paths) + lock_loaded(paths)
        if gone:
            raise ConfigError([ConfigIssue(key, problem) for key, problem in gone])
        run = Run.objects.create(name=name, owner=owner, config=parsed.to_dict(), mode=parsed.mode)
        transaction.on_commit(lambda: enqueue("workers.tasks.start_run", run.pk))
    return run


def pause_run(run: Run) -> Run:
    return set_status(run, Status.PAUSED)


def resume_run(run: Run) -> Run:
    """Continue the run. A paused run's workers carry on in place. A failed or stopped run is queued
    again: its duties restart from its newest checkpoint (from step 0 when it has none) on the same
    run, metrics and buffer (replayed steps replace their metrics; the buffer gives back what the
    lost steps consumed), and its counters go back to that checkpoint's at once (rewind). Its
    error moves to `resumes`, so the run no longer shows it as current.
    Refused while a worker still holds one of its duties (it lets go within a step), and for good
    once buffer retention archived or dropped its buffer (buffer_retired)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if locked.status == Status.PAUSED:
            return set_status(run, Status.RUNNING)
        if locked.status not in (Status.FAILED, Status.STOPPED):
            raise InvalidTransition(
                f"run {locked.pk} is {locked.status}: only a paused, failed or stopped run can be resumed"
            )
        if locked.buffer_retired_at is not None:
            raise InvalidTransition(f"run {locked.pk} cannot be resumed: {buffer_retired(locked)}")
        gone = taskset_issues(locked.config.get("buffer") or {}, resuming=True)
        if gone:  # it would queue, then fail at its first step
            raise InvalidTransition(f"run {locked.pk} cannot be resumed: " + "; ".join(
                f"{issue.key}: {issue.message}" for issue in gone))
        if dataset_gone := expert_dataset_gone(locked):  # the same
            raise InvalidTransition(f"run {locked.pk} cannot be resumed: {dataset_gone}")
        moved = not_resumable(locked.config)
        if moved:  # it would queue, then fail at start on a directory that is not there
            raise InvalidTransition(f"run {locked.pk} cannot be resumed: " + "; ".join(moved))
        busy = workers_holding(locked)
        if busy:
            duty, worker = next(iter(busy.items()))
            raise InvalidTransition(
                f"run {locked.pk} cannot be resumed yet: worker {worker} still holds its {duty} duty "
                "and lets go within a step; try again in a moment"
            )
        checkpoint = resume_point(locked)  # what its trainer will go on from (run_engine)
        locked.resumes = [*locked.resumes, {
            "at": timezone.now().isoformat(),
            "after": locked.status,
            "error": locked.error,
            "checkpoint": {"version": checkpoint.version, "step": checkpoint.step} if checkpoint else None,
        }]
        locked.heartbeats = {}  # the workers that served it are gone; whoever starts it now holds it
        locked.save(update_fields=["resumes", "heartbeats", "updated_at"])
        set_status(locked, Status.QUEUED, error="")
        # Its counters and charts go back to where its trainer goes on from now, as its worker will
        # take them back when it starts: this answer and its page said the old ones until then.
        counters = resume_counters(locked, checkpoint)
        if counters is not None:
            rewind(locked, **counters)
        forget_versions_after(locked, checkpoint.version if checkpoint else 0)  # no worker holds it (busy above)
        transaction.on_commit(lambda: enqueue("workers.tasks.start_run", locked.pk))
    run.refresh_from_db()
    return run


RETIRED = {"archive": "archived", "drop": "dropped"}


def buffer_retired(run: Run) -> str:
    """Why a run whose buffer retention took away (apps/buffer/retention.py) cannot go on: a
    resumed trainer would rewind and replay rollouts that are gone."""
    record = run.buffer_retirement
    how, job = RETIRED.get(record.get("action"), "retired"), record.get("job")
    if record.get("state") == "in progress":
        return (f"its buffer is being {how} by buffer retention (buffer job {job}); cancel that job to resume "
                "it, or launch a new run from its config (Launch again)")
    if record.get("state") == "partial":
        kept = f"; their archive is {record['archive']}" if record.get("archive") else ", with no archive"
        return (f"buffer job {job} was {record.get('stopped', 'stopped')} after deleting {record['deleted']:,} of "
                f"its rows{kept}; launch a new run from its config (Launch again)")
    archive = f"; its archive is the file {record['archive']} under the data directory" if record.get("archive") else ""
    return (f"its buffer was {how} on {run.buffer_retired_at:%Y-%m-%d} by buffer retention"
            f"{f' (buffer job {job})' if job else ''}{archive}; launch a new run from its config (Launch again)")


def describe_resume(run: Run, was: str) -> str:
    """What resume_run did to a run that was `was`, for a person: where it continues from."""
    if was == Status.PAUSED:
        return f"run {run.pk} carries on where it was paused"
    checkpoint = run.resumes[-1]["checkpoint"]
    if checkpoint is None:
        return (f"run {run.pk} has no checkpoint (none yet, or deleted): it starts again from step 0 "
                "(the same run: replayed steps replace their metrics)")
    return f"run {run.pk} resumes from checkpoint v{checkpoint['version']} (trainer step {checkpoint['step']})"


def stop_run(run: Run) -> Run:
    """Ask the workers to stop; they check the status every step and every 2 s inside one
    (workers/rft/stopping.py). A run no worker holds (not started yet, or its workers died) stops
    at once."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if locked.is_finished:
            raise InvalidTransition(f"run {locked.pk} is already {locked.status}")
        if not workers_holding(locked):
            return set_status(run, Status.STOPPED)
        if locked.status == Status.STOPPING:
            raise InvalidTransition(f"run {locked.pk} is already stopping: its workers stop within seconds")
        return set_status(run, Status.STOPPING)


PROGRESS_FIELDS = ("explorer_step", "trainer_step", "model_version")


def set_progress(run: Run, **progress: int) -> None:
    """Move the run's step counters and model version forward, never back (a trainer that goes
    back to its checkpoint says so once: DjangoMetricSink.rewind). One conditional UPDATE a field: the row
    lock and Postgres's recheck of the WHERE under it keep concurrent callers in order, without
    the savepoint and SELECT FOR UPDATE of a read-then-write."""
    unknown = set(progress) - set(PROGRESS_FIELDS)
    if unknown:
        raise ValueError(f"unknown progress field(s) {sorted(unknown)}")
    changed = {
        field: value for field, value in progress.items()
        if Run.objects.filter(pk=run.pk, **{f"{field}__lt": value}).update(**{field: value})
    }
    if changed:
        broadcast(run.pk, {"type": "progress", **changed})
    for key, value in changed.items():
        setattr(run, key, value)


def drop_queued(run_id: int) -> None:
    """Withdraw from the broker the queued tasks of duties the run no longer has (all, once it is
    finished; those beyond a lowered explorer.engine_num) and forget them: a resumed run sends
    afresh. One a worker already has stays noted until it comes (claim_duty) and exits."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        needed = () if locked.is_finished else duties_of_run(locked)
        unneeded = [sent for duty, sent in locked.queued_tasks.items() if duty not in needed]
        gone = set()
        for queue in {sent["queue"] for sent in unneeded}:
            gone |= withdraw(queue, [sent["task"] for sent in unneeded if sent["queue"] == queue])
        if gone:
            locked.queued_tasks = {duty: sent for duty, sent in locked.queued_tasks.items() if sent["task"] not in gone}
            locked.save(update_fields=["queued_tasks"])


def open_rendezvous(run: Run, group: str, host: str, port: int, world_size: int) -> int:
    """Rank 0 opens a group at host:port, as Run.rendezvous[group]: "trainer", the trainer's ranks
    on several machines (the other machines' node duties start theirs in it: ranks.serve_node);
    "weights", the trainer's weight group for synchronizer.method nccl (world_size: its explorers).
    Returns its generation."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).only("rendezvous").get(pk=run.pk)
        generation = locked.rendezvous.get(group, {}).get("generation", 0) + 1
        opened = {"generation": generation, "host": host, "port": port, "world_size": world_size}
        locked.rendezvous = {**locked.rendezvous, group: opened}
        locked.save(update_fields=["rendezvous"])
    return generation


def close_rendezvous(run: Run, group: str, generation: int) -> None:
    """The group of that generation is over: no one joins it any more."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).only("rendezvous").get(pk=run.pk)
        if locked.rendezvous.get(group, {}).get("generation") == generation:
            locked.rendezvous = {**locked.rendezvous, group: {"generation": generation}}
            locked.save(update_fields=["rendezvous"])
