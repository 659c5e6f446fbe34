"""A duty's hold on its run: what changes who holds it (a worker's claim, its heartbeats, the
watchdog's hand-over, a killed pool process's worker_lost, a release, a curator's hand-back; who
holds it now is read in duties.py), and what a duty checks while it serves and waits (supervision
serves it; ranks waits on it too). The exceptions end the duty's serving, each in its own way
(supervision.serve_claimed)."""
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .duties import HANDED_OVER, NODE_DUTY, duties_of_run, holder, is_explorer, pid_namespace, queue_of, workers_holding
from .failures import describe_lost_worker
from .hosts import serving
from .models import MetricPoint, Run
from .services import InvalidTransition, set_status

Status = Run.Status
WAIT_SECONDS = 0.5  # how often a duty waiting for the other one looks again


class DutyLost(Exception):
    """Another worker holds this duty now (the watchdog handed it on, or the run was resumed)."""


class Stopped(Exception):
    """The run stopped (or ended) while the duty waited for the run's other duties."""


class HandBack(Exception):
    """The worker serving the duty is shutting down in order (SIGTERM), or a curator handed the
    duty back (`hand_back`): the duty saved what a resume needs at a step boundary and lets the run
    go, still active, for another worker (it is queued again at once, keeping its place: turns.py;
    the run carries on from that checkpoint)."""


def hand_back(run: Run, duty: str, by: str) -> None:
    """Ask the worker holding the run's `duty` to hand it back to its queue (the Workers page, for
    a curator): it saves at its next step and lets go, as on an orderly shutdown. InvalidTransition
    for a run not served, a duty no live worker holds, or a trainer machine's duty (it leaves with
    the trainer's group: hand back the trainer)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if locked.status not in Run.SERVED:
            raise InvalidTransition(f"run {locked.name!r} is {locked.status}: no duty of it to hand back")
        if duty.startswith(NODE_DUTY):
            raise InvalidTransition(f"{duty} leaves with its trainer's group: hand back the trainer")
        if duty not in workers_holding(locked):
            raise InvalidTransition(f"no live worker holds the {duty} duty of run {locked.name!r}")
        if is_explorer(duty) and locked.config.get("synchronizer", {}).get("method") == "nccl":
            # As set_explorers refuses to change their number: handed back, one broke the group, the
            # trainer waited synchronizer.timeout_s and restarted from its checkpoint.
            raise InvalidTransition(
                f"{duty} is in the trainer's nccl weight group, of a fixed size: handing it back would break the "
                "group; hand back the trainer (the group goes with it), or stop the run and resume it")
        asked = {"by": by, "at": timezone.now().isoformat()}
        locked.heartbeats = {**locked.heartbeats, duty: {**locked.heartbeats[duty], "hand_back": asked}}
        locked.save(update_fields=["heartbeats"])


# A duty's pool process killed twice at the same trainer step is out of memory (or worse), not
# unlucky: Celery handed an out-of-memory launch's task on 7 times in 58 s (workers/tasks.py).
KILLS_BEFORE_FAILING = 2


def _write_beat(run: Run, duty: str, worker: str, node: str | None = None, task: str | None = None) -> None:
    """The duty's heartbeat on `run` (the caller saves it): its worker process (`host:pid`, and the
    pid namespace of that pid: duties.process_is_gone), the
    Celery worker (`node`, for the Workers page) and task (`task`), since when it holds the duty and
    since when its steps run (`started`, mark_started), kept while the same process beats (not
    across a claim of a duty it had let go: a hand-back asked of the last holding is not this one's)."""
    previous = run.heartbeats.get(duty, {})
    now = timezone.now().isoformat()
    kept = {key: previous[key] for key in ("handovers", "handed_over_at_step", "handed_over_at", "kills", "lost",
                                           "asked") if key in previous}
    if previous.get("worker") == worker and not previous.get("ended"):
        held = ("node", "task", "since", "started", "from_checkpoint", "doing", "hand_back")
        kept |= {key: previous[key] for key in held if key in previous}
    kept.setdefault("since", now)
    kept |= {key: value for key, value in (("node", node), ("task", task)) if value is not None}
    run.heartbeats = {**run.heartbeats, duty: {**kept, "at": now, "worker": worker, "pid_namespace": pid_namespace()}}


def claim_duty(run: Run, duty: str, worker: str, timeout: float, node: str | None = None,
               task: str | None = None) -> bool:
    """Take a duty the run still has (explorer.engine_num may have been lowered) while it is to be
    served (Run.SERVED), unless another live worker holds it. A redelivered or duplicated task,
    or any task of a run stopping or finished (hundreds may be queued), then exits at once. The
    claiming Celery `task` goes on the heartbeat, and out of Run.queued_tasks, claimed or not."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        entry = locked.queued_tasks.get(duty, {})
        came = task is not None and entry.get("task") == task
        if came:
            locked.queued_tasks = {key: sent for key, sent in locked.queued_tasks.items() if key != duty}
        claimed = (locked.status in Run.SERVED and duty in duties_of_run(locked)
                   and holder(locked, duty, timeout) in (None, HANDED_OVER, worker))
        if claimed:
            _write_beat(locked, duty, worker, node, task)
            if came and "asked" in entry:  # its place in the queue, kept for a hand-over (turns.py)
                locked.heartbeats[duty]["asked"] = entry["asked"]
        if claimed or came:
            locked.save(update_fields=["heartbeats", "queued_tasks"])
    return claimed


def heartbeat(run: Run, duty: str, worker: str, doing: list | None = None) -> bool:
    """`worker` is alive and still holds `duty`, doing `doing` (workers.rft.activity: what its
    engine does now, for the duty line). False, writing nothing, once it does not: the duty was
    handed to another worker or the run was resumed since."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).only("heartbeats").get(pk=run.pk)
        if holder(locked, duty) != worker:
            return False
        _write_beat(locked, duty, worker)
        if doing is not None:
            locked.heartbeats[duty]["doing"] = doing
        locked.save(update_fields=["heartbeats"])
    return True


def hand_over(run: Run, duty: str, limit: int) -> bool:
    """The watchdog sends on the duty of a worker that stopped beating: the first task to claim it
    holds it. After `limit` hand-overs in a row with no trainer step between (a worker killed at
    the same step each time), the run fails instead, for its user to resume: returns False."""
    with transaction.atomic():
        return _hand_over(Run.objects.select_for_update(no_key=True).get(pk=run.pk), duty, limit)


def worker_lost(run: Run, duty: str, task: str, cause: str) -> bool:
    """The pool process running Celery task `task` for the duty died (WorkerLostError, `cause`:
    "Worker exited prematurely: signal 9 (SIGKILL) Job: 3."): True, the duty is to be sent on; the
    KILLS_BEFORE_FAILING-th time in a row with no trainer step between, the run fails saying so.
    False, changing nothing, for a task that held nothing or a run no longer served."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        beat = locked.heartbeats.get(duty, {})
        queued = locked.queued_tasks.get(duty, {}).get("task") == task  # killed before it claimed
        if locked.status not in Run.SERVED or not (queued or beat.get("task") == task and not beat.get("ended")):
            return False
        if queued:
            locked.queued_tasks = {key: sent for key, sent in locked.queued_tasks.items() if key != duty}
            locked.save(update_fields=["queued_tasks"])
        return _hand_over(locked, duty, settings.RFTWEB_MAX_HANDOVERS, lost=cause)


def _hand_over(locked: Run, duty: str, limit: int, lost: str | None = None) -> bool:
    """hand_over, or worker_lost with `lost`, on the run's locked row."""
    beat = locked.heartbeats.get(duty, {})
    step = locked.trainer_step
    stuck = _no_step_since(locked, beat)
    kills = (beat.get("kills", 0) if stuck else 0) + (lost is not None)
    if kills >= KILLS_BEFORE_FAILING:
        set_status(locked, Status.FAILED, error=describe_lost_worker(duty, lost, kills, step))
        return False
    # A duty its worker handed back in order (SIGTERM, after saving) waits for a worker as long
    # as it takes: that is a restart or a deploy, not a worker dying at the same step again.
    orderly = beat.get("handed_back")
    if lost is not None and beat.get("worker") == HANDED_OVER:
        handovers = beat.get("handovers", 1)  # the watchdog was first to send on this very loss
    else:
        handovers = (beat.get("handovers", 0) if stuck else 0) + (0 if orderly else 1)
    if handovers > limit:
        queue = queue_of(duty)
        advice = "Resume the run to continue from its last checkpoint."
        if beat.get("broke"):
            why = f"its trainer's rank group broke ({beat['broke']})"
        elif beat.get("worker") == HANDED_OVER and not serving(queue):
            # Resumed as it is, the run would wait for ever: say what it waits for.
            why = f"no live worker serves the `{queue}` queue to take it over"
            advice = (f"Start one (celery -A rftweb worker -Q {queue}, docs/scale.md), then resume the run: it "
                      "continues from its last checkpoint.")
        elif beat.get("worker") == HANDED_OVER:
            why = "no worker took it over"
        else:
            why = f"its worker {beat.get('worker')} stopped beating (killed? out of memory?)"
        set_status(locked, Status.FAILED, error=(
            f"{duty} failed: {why} at trainer step {step}, and the watchdog hands a "
            f"duty on at most {limit} time(s) in a row without progress. {advice}"
        ))
        return False
    now = timezone.now().isoformat()
    locked.heartbeats = {**locked.heartbeats, duty: {
        "at": now, "worker": HANDED_OVER, "handovers": handovers, "handed_over_at_step": step, "handed_over_at": now,
        **({"task": beat["task"]} if "task" in beat else {}),  # the task that lost it (worker_lost)
        **({"handed_back": orderly} if orderly else {}),
        **({"asked": beat["asked"]} if "asked" in beat else {}),  # its place in the queue (turns.py)
        **({"kills": kills, "lost": lost or beat.get("lost")} if kills else {}),
    }}
    locked.save(update_fields=["heartbeats"])
    return True


def _no_step_since(run: Run, beat: dict) -> bool:
    """Whether the duty was handed on before and the run has done no step since: a trainer step (an
    explorer step in mode explore, an eval in bench), a replayed one included. It compared
    trainer_step, which never goes back: a second kill while the replacement replayed the steps
    after its checkpoint read as two kills at one step, and failed the run ("out of memory?")."""
    since = parse_datetime(beat.get("handed_over_at") or "")
    if since is None:
        return beat.get("handed_over_at_step") == run.trainer_step  # a beat from before handed_over_at
    role = {Run.Mode.EXPLORE: "explorer", Run.Mode.BENCH: "eval"}.get(run.mode, "trainer")
    return not MetricPoint.objects.filter(run=run, role=role, time__gt=since).exists()


def release_duty(run: Run, duty: str, worker: str, *, error: str | None = None, broke: str | None = None,
                 handed_back: str | None = None) -> bool:
    """`worker` lets the duty go (its task ends); with `error`, the run fails with it, in the same
    transaction, so that no one sees a failed run whose duty is still held. With `broke` (why the
    trainer's rank group broke) the run stays active and the watchdog hands the duty on, as for a
    dead worker; with `handed_back` (its worker shut down in order, after saving at a step
    boundary) likewise, saying why. The last duty of a stopping run to go stops it (a stop ends a run when its duties
    have left, not at the watchdog's next tick). False, changing nothing, when the worker no
    longer held the duty."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if holder(locked, duty) != worker:
            return False
        beat = {**locked.heartbeats[duty], "ended": timezone.now().isoformat()}
        if broke is not None:
            beat["broke"] = broke
        if handed_back is not None:
            beat["handed_back"] = handed_back
        locked.heartbeats = {**locked.heartbeats, duty: beat}
        locked.save(update_fields=["heartbeats"])
        if error is not None and not locked.is_finished:
            set_status(locked, Status.FAILED, error=error)
        elif locked.status == Status.STOPPING and not workers_holding(locked):
            set_status(locked, Status.STOPPED)
    run.refresh_from_db(fields=["status", "error", "heartbeats"])
    return True


def mark_started(run: Run, duty: str, worker: str, from_checkpoint: dict | None = None) -> None:
    """`worker`'s duty has loaded its engine and begins its steps (a trainer machine's duty: its
    ranks joined their group): its heartbeat says since when (`started`; the run page's duty
    state goes from starting to running) and which checkpoint it went on from ({version, step}),
    and the run goes starting -> running, once (another of its duties may be first)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        beat = locked.heartbeats.get(duty)
        if beat is not None and beat.get("worker") == worker and not beat.get("ended"):
            started = {"started": timezone.now().isoformat(), **({"from_checkpoint": from_checkpoint}
                                                                  if from_checkpoint else {})}
            locked.heartbeats = {**locked.heartbeats, duty: {**beat, **started}}
            locked.save(update_fields=["heartbeats"])
        if locked.status == Status.STARTING and not duty.startswith(NODE_DUTY):
            set_status(run, Status.RUNNING)


def still_served(run: Run, duty: str, worker: str) -> bool:
    """Whether the run is still to be served (Run.SERVED) by this duty; DutyLost once `worker`
    no longer holds it. What a duty waiting for others looks at, so that a stop reaches it."""
    run.refresh_from_db(fields=["status", "heartbeats"])
    if holder(run, duty) != worker:
        raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
    return run.status in Run.SERVED


def wait_while_paused(run: Run, duty: str, worker: str, interval: float = 1.0, leaving=lambda: False) -> str:
    """The run's status once it is not paused (or, paused, once `leaving()`: its worker shuts
    down); DutyLost as soon as `worker` no longer holds `duty`, or the duty is no longer the run's
    (an explorer beyond a lowered explorer.engine_num)."""
    while True:
        run.refresh_from_db(fields=["status", "heartbeats", "config"])
        if holder(run, duty) != worker:
            raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
        if duty not in duties_of_run(run):
            raise DutyLost(f"run {run.pk}: {duty} is no longer one of its duties (explorers: "
                           f"{run.config['explorer']['engine_num']})")
        if run.status != Status.PAUSED or leaving():
            return run.status
        time.sleep(interval)


def pause() -> None:
    time.sleep(WAIT_SECONDS)
