"""Runs on workers: who serves a run, how it is served, and what happens when its worker dies.

A run is served by one or two long worker tasks, each holding a *duty* of the run:
- `loop` (queue `train`): explorer and trainer in one process, as the headless engine runs them
  (overlapping in two threads from offset 1). Used with `synchronizer.method: memory` and for
  single-component modes.
- `explorer` (queue `explore`, explorer-K for each further one of explorer.engine_num) + `trainer`
  (queue `train`): with `synchronizer.method: checkpoint` or `nccl` in mode `both`, they run in
  separate workers (and machines) and meet through the Postgres buffer and the versioned weights
  directory (checkpoint) or a weight group the trainer opens at the address it writes on the run
  (nccl: Run.rendezvous["weights"]; a broken group ends the trainer's duty as a broken rank group
  does, and its new worker opens a new group that the explorers join).
A duty is held through a heartbeat written by a background thread (holding.claim_duty, .heartbeat,
.release_duty); the `watchdog` (Celery beat) sends on a duty whose heartbeat expired (its worker
died), and the new task resumes: the trainer from the last checkpoint, the explorer from its last
stored step. A failed or stopped run resumes the same way when its user resumes it
(services.resume_run queues it again). Pause and stop are statuses the duties check every step;
so is holding the duty: a worker that finds its duty taken over stops at once, saving and
changing nothing.

With trainer.strategy 'ddp' the process holding the trainer (duty `loop` or `trainer`) is the
trainer's rank 0: it alone talks to the database; it starts the other ranks of its machine as
`python -m workers.rft follow` processes for as long as the duty runs (ranks.trainer_ranks). With
trainer.num_nodes > 1 each further machine is a duty of its own, `trainer-node-K` (queue `train`):
the worker holding it starts that machine's ranks in each group rank 0 opens, meeting it at the
address rank 0 writes on the run (Run.rendezvous["trainer"]; ranks.serve_node). A rank that dies or hangs breaks
the group: rank 0's next collective fails naming it, and its duty ends as if its worker had died,
so the watchdog restarts the whole group from the last checkpoint (up to RFTWEB_MAX_HANDOVERS
times in a row without progress; then the run fails naming the rank, for its user to resume).

A duty has at most one task queued (Run.queued_tasks: sent, not taken yet; `send`): one queued or
served is not sent again, and the queued tasks of a finished run or a removed explorer are taken
back out of the broker (services.drop_queued). Celery does not hand on a task whose pool process
died under it (killed: signal 9 is most often the out-of-memory killer): worker_lost sends the
duty on once, and the second time in a row fails the run saying so.

The Celery tasks (workers/tasks.py) are entry points into start_run, serve, watchdog and
worker_lost here.
Tasks are sent by name (rftweb.celery.enqueue), so this module does not import them.
"""
import logging
import os
import socket
import threading
import time
from uuid import uuid4

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.utils import timezone

from rftweb.celery import enqueue

from . import capacity, duties, holding, services, system, turns
from .checkpoints import resume_point, run_checkpoint_dir, run_dir
from .config_keys import stored_config
from .duties import HANDED_OVER, NODE_DUTY, duties_of_run
from .failures import MAX_CAUSE_CHARS, describe_failure, is_rank_failure, without_server_paths
from .holding import DutyLost, HandBack, Stopped, pause, wait_while_paused
from .hosts import ProcessUsage
from .live import publisher
from .logs import DutyLog
from .models import MetricPoint, Run
from .ranks import serve_node, trainer_ranks
from .turns import SERVE_TASK

log = logging.getLogger(__name__)
Status = Run.Status
DATABASE_LOST = (OperationalError, InterfaceError)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def set_explorers(run: Run, count: int) -> Run:
    """Serve the run with `count` explorers from now on (explorer.engine_num), while it runs: the
    new ones are sent to explore workers once this commits; those beyond `count` stop within
    seconds (the engine checks inside a step, workers/rft/stopping.py), and the groups they were
    rolling out go back to the others.
    ConfigError (naming explorer.engine_num) for a count the run's config refuses;
    services.InvalidTransition for a run that is not running or paused."""
    from workers.rft.config import ConfigError, ConfigIssue, RunConfig

    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if locked.status not in (Status.RUNNING, Status.PAUSED):
            raise services.InvalidTransition(
                f"run {locked.name!r} is {locked.status}: explorers are added or removed while it runs or is paused")
        before = duties_of_run(locked)
        changed = count != locked.config.get("explorer", {}).get("engine_num", 1)
        if changed and (fixed := fixed_explorers(locked)):
            raise ConfigError([ConfigIssue("explorer.engine_num", fixed)])
        config = {**locked.config, "explorer": {**locked.config.get("explorer", {}), "engine_num": count}}
        locked.config = RunConfig.from_dict(config).to_dict()
        locked.save(update_fields=["config", "updated_at"])
        send(locked, [duty for duty in duties_of_run(locked) if duty not in before])
        # Those beyond the count: their queued tasks go (their workers leave after their share).
        transaction.on_commit(lambda: services.drop_queued(locked.pk))
    run.refresh_from_db()
    return run


def fixed_explorers(run: Run) -> str | None:
    """Why the run's explorers cannot be added or removed while it trains (None: they can). The
    config rule for a launch said "set mode 'both' and synchronizer.method 'checkpoint'", which a
    launched run cannot do: what is left is to launch it again with them."""
    mode, method = run.config.get("mode", "both"), run.config.get("synchronizer", {}).get("method", "memory")
    if method == "nccl":
        return ("synchronizer.method 'nccl' sends the weights to a group of a fixed size: this run keeps its "
                "explorers (checkpoint sync adds and removes them)")
    if "trainer" in duties_of_run(run):
        return None
    why, wanted = ((f"mode '{mode}' runs no explorers in workers of their own", "mode 'both' and ")
                   if mode != "both" else
                   (f"synchronizer.method '{method}' runs the explorer inside the trainer's worker", ""))
    return (f"{why}, and a launched run keeps its mode and sync method: Launch again, with {wanted}synchronizer.method "
            "'checkpoint', for a run whose explorers are added and removed while it trains")


def send(run: Run, wanted) -> list[str]:
    """Send a task for each of the `wanted` duties that has none queued (Run.queued_tasks) and no live
    worker, once the caller's transaction commits; returns the duties sent. Toggling explorers
    32 <-> 1 forty times had queued 620 tasks, ahead of other runs' work; ten stop/resumes 352.
    Which task a worker takes does not decide which duty it serves: the one of its queue that
    asked first does (turns.py)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        timeout, now = settings.RFTWEB_HEARTBEAT_TIMEOUT, timezone.now().isoformat()
        new = {duty: {"task": str(uuid4()), "queue": duties.queue_of(duty), "at": now,
                      "asked": turns.asked_at(locked, duty)} for duty in wanted
               if duty not in locked.queued_tasks and duties.holder(locked, duty, timeout) in (None, HANDED_OVER)}
        if new:
            locked.queued_tasks = {**locked.queued_tasks, **new}
            locked.save(update_fields=["queued_tasks"])
        for duty, sent in new.items():
            transaction.on_commit(lambda duty=duty, sent=sent: enqueue(SERVE_TASK, run.pk, duty, queue=sent["queue"],
                                                                       task_id=sent["task"]))
    return list(new)


def start_run(run_id: int) -> None:
    """A queued run starts: one task per duty (but none for a duty whose task is still queued: a
    stopped run's task that a worker had taken when the stop withdrew the others)."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        if run.status != Status.QUEUED:
            return
        services.set_status(run, Status.STARTING)
        send(run, duties_of_run(run))


# ---- serving a duty ------------------------------------------------------------------------------


class Heartbeat(threading.Thread):
    """Beats every `interval` seconds while the task lives, however long a step takes, and records
    what the duty's process uses with each beat (system.py). Embedded, where every duty is a thread
    of the server, one duty of the run records the server's."""

    def __init__(self, run: Run, duty: str, worker: str, interval: float):
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}-{duty}")
        self.target_run, self.duty, self.worker, self.interval = run, duty, worker, interval
        self.stopped = threading.Event()
        self.usage = ProcessUsage()
        if not settings.RFTWEB_EMBEDDED:
            self.source = duty
        else:
            self.source = system.SERVER if duty in ("loop", "trainer") else None

    def run(self):
        try:
            while not self.stopped.wait(self.interval):
                try:
                    activity = _activities.get((self.target_run.pk, self.duty))
                    doing = activity.now() if activity is not None else None
                    if not holding.heartbeat(self.target_run, self.duty, self.worker, doing):
                        return  # the duty was taken over: the duty's next status check stops it
                    if self.source is not None:
                        system.record(self.target_run, self.source, system.measure(self.usage), time.time())
                except DATABASE_LOST as err:  # beat again once the database is back
                    log.warning("heartbeat of run %s (%s) missed: %s", self.target_run.pk, self.duty, err)
                    connection.close()
        finally:
            connection.close()

    def stop(self):
        self.stopped.set()
        self.join(timeout=5)


# What the engine of each duty this process serves does now ({(run id, duty): its loop's
# workers.rft.activity.Activity}), for the heartbeat to write on the duty's beat.
_activities: dict = {}


def serve(run_id: int, duty: str, task: str | None = None) -> str:
    """Hold `duty` of the run until it ends: claim it, beat, run the engine (again, in place, after
    a database outage), and let it go, failing the run with the error if there was one. `task`:
    the Celery task serving it (what its queued entry and its heartbeat name): it serves the
    waiting duty of its queue that asked first (turns.turn), which may be another run's."""
    if turns.turn_away(capacity.this_node(), run_id, duty, task):
        return "draining"
    if task is not None and not settings.RFTWEB_EMBEDDED:  # embedded: every duty has a thread of its own
        run_id, duty = turns.turn(run_id, duty, task)
    run = Run.objects.get(pk=run_id)
    me = worker_id()
    # A task of a run stopped or ended exits on this one read (a stop may leave 1,000 queued),
    # unless the run counts it as the duty's queued task: claim_duty then notes that it came.
    counted = task is not None and run.queued_tasks.get(duty, {}).get("task") == task
    if run.status not in Run.SERVED and not counted:
        return "skipped"
    if not holding.claim_duty(run, duty, me, settings.RFTWEB_HEARTBEAT_TIMEOUT, node=capacity.this_node(),
                               task=task):
        return "skipped"
    # What this duty's threads log while it serves goes to the run page's Logs panel (logs.py).
    with DutyLog(run_dir(run), run_id, duty, secrets=[run.secret], clean=without_server_paths):
        return serve_claimed(run, duty, me)


def log_for_run(run: Run, duty: str, level: int, message: str, *args) -> None:
    """Log a line here and in the run's Logs panel as the duty's: what the watchdog or the Celery
    worker's main process sees happen to a duty from outside it (its worker killed, its heartbeat
    lapsed), which the duty's own log cannot say."""
    with DutyLog(run_dir(run), run.pk, duty, secrets=[run.secret], clean=without_server_paths):
        log.log(level, message, *args)


def serve_claimed(run: Run, duty: str, me: str) -> str:
    """serve, once `me` holds the duty."""
    run_id = run.pk
    beat = Heartbeat(run, duty, me, settings.RFTWEB_HEARTBEAT_INTERVAL)
    beat.start()
    failure = broke = handed_back = None
    with _serving:
        _serving.count += 1
    try:
        while True:
            try:
                if duty.startswith(NODE_DUTY):
                    return serve_node(run, duty, me)
                return run_engine(run, duty, me)
            except DATABASE_LOST as err:
                # Postgres restarted or the network blipped: wait for it, then resume in place from
                # the last checkpoint, exactly as a replacement worker would.
                log.warning("run %s (%s) lost the database (%s); resuming once it is back", run_id, duty, err)
                if not wait_for_database(settings.RFTWEB_DATABASE_OUTAGE_SECONDS):
                    return "lost the database"  # the watchdog hands the duty on once it is back
    except DutyLost as lost:
        log.warning("%s; it stops here", lost)
        return "taken over"
    except Stopped as stopped:
        log.info("run %s (%s): %s", run_id, duty, stopped)
        return "stopped"
    except HandBack as leaving:
        log.info("run %s (%s): %s; the run carries on when a worker takes the duty again", run_id, duty, leaving)
        handed_back = str(leaving)
        return "handed back"
    except Exception as exc:
        close_old_connections()
        if is_rank_failure(exc):  # the watchdog restarts the group (see the module's docstring)
            log.warning("run %s (%s): its trainer's rank group broke: %s", run_id, duty, exc)
            broke = without_server_paths(f"{type(exc).__name__}: {exc}")[:MAX_CAUSE_CHARS]
            return "group broke"
        log.exception("run %s (%s) failed", run_id, duty)
        failure = describe_failure(duty, exc, run_dir(run))
        return "failed"
    finally:
        beat.stop()
        _activities.pop((run_id, duty), None)
        try:  # let the duty go (failing the run with the error, if any): it may be resumed at once
            holding.release_duty(run, duty, me, error=failure, broke=broke, handed_back=handed_back)
            # Queued now, keeping its place (turns.py); but not by an embedded server shutting down,
            # whose new thread would take it back at once: the next start's watchdog sends it on.
            if handed_back and run.status in Run.SERVED and not (
                    settings.RFTWEB_EMBEDDED and capacity.node_stopping(None)):
                send(run, [duty])
        except DATABASE_LOST:
            log.warning("run %s (%s): the database is gone; the duty's heartbeat expires instead", run_id, duty)
        publisher.flush()
        with _serving:
            _serving.count -= 1
            _serving.notify_all()


# The duties this process serves right now (an embedded server: several threads).
_serving = threading.Condition()
_serving.count = 0


def wait_for_duties(timeout: float) -> bool:
    """An embedded server shutting down (capacity.stop_serving): wait until its duties have
    handed their runs back. False if some still run after `timeout` seconds."""
    with _serving:
        return _serving.wait_for(lambda: _serving.count == 0, timeout)


def run_engine(run: Run, duty: str, worker: str) -> str:
    """Build the engine for the duty from the run's last checkpoint and stored steps, and run it."""
    # Imported here: torch loads only in workers, not in every web process that imports this module.
    from workers.rft.loop import EXPLORER, TRAINER, Loop

    from .store import run_stores

    config = stored_config(run.config)
    stores = run_stores(run, config, duty, worker)
    components = (EXPLORER,) if duties.is_explorer(duty) else {"trainer": (TRAINER,)}.get(duty)
    node = capacity.this_node()

    def leaving_why() -> str | None:
        """Why the duty lets the run go for another worker: its worker shuts down in order, or a
        curator handed it back (holding.hand_back; the heartbeats status() read)."""
        if capacity.node_stopping(node):
            return f"its worker {node} is shutting down"
        asked = run.heartbeats.get(duty, {}).get("hand_back")
        return f"{asked['by']} handed it back to its queue" if asked else None

    leaving = lambda: leaving_why() is not None  # noqa: E731
    status = lambda: wait_while_paused(run, duty, worker, leaving=leaving)  # noqa: E731
    final_eval = None  # the trainer of a split run: the version its first explorer evaluates last
    # Closed when the duty ends: a worker process outlives its runs, vLLM's processes and the
    # follower ranks must not.
    with trainer_ranks(run, config, duty, worker) as ranks, Loop(config, stores, run_dir(run), components=components,
                                                                 ranks=ranks) as loop:
        resumed = None  # the checkpoint it goes on from, for the run page's duty line
        if loop.trainer is not None:
            checkpoint = resume_point(run)  # its newest left: a curator may have deleted newer ones
            if checkpoint is not None:
                resumed = {"version": checkpoint.version, "step": checkpoint.step}
                log.info("run %s (%s): resumed from checkpoint v%s (trainer step %s)",
                         run.pk, duty, checkpoint.version, checkpoint.step)
                # Only from the run's own directory: the path is a row a worker trusts, not a place
                # any file may be loaded from.
                loop.resume(run_checkpoint_dir(checkpoint, run_dir(run)))
            else:
                loop.start_over()
                # A restart, not the run's first start (a Resume took its counters back to 0 already:
                # services.resume_run).
                if run.trainer_step or run.model_version or run.resumes:
                    resumed = {"version": 0, "step": 0}
                    log.info("run %s (%s): resumed with no checkpoint (none yet, or deleted): from step 0 "
                             "(same run)", run.pk, duty)
            # Steps after the checkpoint are replayed: give them back the rows the lost steps took,
            # and take the run's step and charts back to where this trainer is.
            stores.buffer.rewind(checkpoint.created_at if checkpoint else None)
            stores.metrics.rewind(loop.trainer.step, loop.trainer.step // loop.sync.interval,
                                  loop.explorer.step if loop.explorer is not None else None)
        run.refresh_from_db()
        _activities[(run.pk, duty)] = loop.activity
        # Each change goes to the open run pages at once, with the step's metrics (live.py coalesces
        # them): on the heartbeat alone (10 s), polled every 10 s, the duty line was 6 s behind the
        # step cards on median and 14 s at worst, naming a step long done.
        loop.activity.on_change = lambda doing: publisher.publish(run.pk, {"type": "activity", "duty": duty,
                                                                           "doing": doing})
        loop.activity.doing(EXPLORER if duties.is_explorer(duty) else TRAINER, "loaded the model")
        if duties.is_explorer(duty):
            loop.explorer.step = run.explorer_step  # steps already stored are not redone
            if run.explorer_step:
                log.info("run %s (%s): resumed after explorer step %s", run.pk, duty, run.explorer_step)
        status()  # nobody took the duty over while the engine loaded
        holding.mark_started(run, duty, worker, from_checkpoint=resumed)

        # A stop or a worker shutting down: the loop saves a checkpoint at this step first.
        stopping = lambda: status() in (Status.STOPPING, *Run.FINISHED) or leaving()  # noqa: E731
        if duties.is_explorer(duty):
            outcome = loop.run_explorer(should_stop=lambda: status() != Status.RUNNING or leaving(), wait=pause,
                                        trained=lambda: trainer_steps(run) >= config.trainer.total_steps,
                                        evaluates_ends=duty == "explorer")
        elif duty == "trainer":
            outcome = loop.run_trainer(stopping, explored_steps=lambda: explorer_steps(run), wait=pause)
            if outcome == "completed" and config.explorer.eval_interval:
                final_eval = loop.final_version()
        else:
            outcome = loop.run(should_stop=stopping, wait=pause)
    if final_eval is not None:
        del loop  # its model freed while the explorer evaluates (its ranks are released)
        outcome = wait_for_final_eval(run, final_eval, stopping)
    if outcome == "stopped" and (why := leaving_why()):
        raise HandBack(why)
    if not duties.is_explorer(duty):
        finish(run, status(), stores.checkpoints.latest(), duty)
    elif outcome == "stopped":
        log.info("run %s (%s): stopped at explorer step %s", run.pk, duty, explorer_steps(run))
    return outcome


def explorer_steps(run: Run) -> int:
    run.refresh_from_db(fields=["explorer_step"])
    return run.explorer_step


def trainer_steps(run: Run) -> int:
    run.refresh_from_db(fields=["trainer_step"])
    return run.trainer_step


def wait_for_final_eval(run: Run, version: int, stopping) -> str:
    """A split run's trainer is done: its first explorer evaluates the final version
    (Loop.run_explorer), and the run completes once that is stored, as a single loop's does, so a
    completed run's held-out figure is its final model's. 'stopped' on a stop meanwhile."""
    while not run.metrics.filter(role=MetricPoint.Role.EVAL, values__model_version=version).exists():
        if stopping():
            return "stopped"
        pause()
    return "completed"


def finish(run: Run, status: str, checkpoint, duty: str) -> None:
    """The trainer (or the single loop) is done: completed, or stopped if a stop was asked. Its
    log line comes first, so the run page that reloads the Logs panel on the new status finds it
    (a stopped-and-resumed run of 300 steps had logged nothing of its life)."""
    if status in Run.FINISHED:
        return
    ended = Status.STOPPED if status == Status.STOPPING else Status.COMPLETED
    run.refresh_from_db(fields=["explorer_step", "trainer_step"])
    step = {Run.Mode.EXPLORE: f"at explorer step {run.explorer_step}",  # a bench run trains nothing
            Run.Mode.BENCH: "its evaluation"}.get(run.mode, f"at trainer step {run.trainer_step}")
    saved = f", checkpoint v{checkpoint.version}" if checkpoint else ""
    log.info("run %s (%s): %s %s%s", run.pk, duty, ended, step, saved)
    services.set_status(run, ended)


def wait_for_database(timeout: float) -> bool:
    """True once a new connection works, False after `timeout` seconds of trying."""
    deadline = time.monotonic() + timeout
    while True:
        connection.close()
        try:
            connection.ensure_connection()
            return True
        except DATABASE_LOST:
            if time.monotonic() > deadline:
                return False
            time.sleep(1)


# ---- the watchdog ---------------------------------------------------------------------------------


def watchdog() -> list[tuple[int, str]]:
    """Send on the duties of active runs whose worker is gone (killed, lost its machine, or its
    rank group broke), up to RFTWEB_MAX_HANDOVERS times in a row without progress; then the run
    fails. A duty no worker ever claimed is not sent again: its task is still queued (a run of
    256 explorers on 2 explore workers has 254 waiting), and sending it each tick grew the queue
    without bound. One the watchdog sent on that nobody claimed counts a hand-over each timeout,
    unsent, so a run no worker serves still fails after the limit. A stopping run that no worker
    holds any more is stopped: nobody is left to stop it. Failed runs are left alone: resuming
    one is its user's call. Returns the (run id, duty) sent on."""
    timeout = settings.RFTWEB_HEARTBEAT_TIMEOUT
    resumed = []
    for run in Run.objects.filter(status__in=Run.ACTIVE):
        if run.status == Status.STOPPING:
            if not duties.workers_holding(run):
                services.set_status(run, Status.STOPPED)
            continue
        lapsed = []
        if any(sent.get("taken") for sent in run.queued_tasks.values()):  # turned to, and never claimed?
            with transaction.atomic():
                lapsed = turns.untaken(Run.objects.select_for_update(no_key=True).get(pk=run.pk), timeout)
        if lapsed:
            run.refresh_from_db()
            resumed += [(run.pk, sent) for sent in send(run, lapsed)]
        for duty in duties_of_run(run):
            beat = run.heartbeats.get(duty)
            if beat is None or duties.holder(run, duty, timeout) is not None:
                continue  # its first task is queued (start_run, set_explorers sent it), or it is held
            if settings.RFTWEB_EMBEDDED and beat["worker"] == worker_id():
                # Embedded, a thread of this very process: alive while the process is (one that ends
                # lets its duty go). Its beat lapses when the machine is busy, and sending its duty
                # on restarted a run that was training (the demo server's watchdog, beside CI's load).
                continue
            if not holding.hand_over(run, duty, settings.RFTWEB_MAX_HANDOVERS):
                break  # the run failed: its user resumes it
            if beat["worker"] == duties.HANDED_OVER:
                continue  # sent on before and not claimed yet: that task is still queued
            log_for_run(run, duty, logging.WARNING, "run %s (%s): %s: the duty is sent on to another worker",
                        run.pk, duty, _why_lost(run, duty, beat))
            resumed += [(run.pk, sent) for sent in send(run, [duty])]
    return resumed


def _why_lost(run: Run, duty: str, beat: dict) -> str:
    """Why the watchdog sends a duty on, as its log line says (it said "sent no heartbeat for 120 s"
    of a process found gone after 28 s, and of a worker whose rank group broke while it beat)."""
    if beat.get("broke"):
        return f"its trainer's rank group broke ({beat['broke']})"
    if beat.get("handed_back"):
        return f"worker {beat['worker']} handed it back ({beat['handed_back']})"
    if duties.process_is_gone(beat["worker"], beat.get("pid_namespace", "")):
        return f"the process of worker {beat['worker']} is gone (killed?)"
    return f"worker {beat['worker']} sent no heartbeat for {duties.heartbeat_age(run, duty):.0f} s"


def worker_lost(task: str, run_id: int, duty: str = "loop", *, cause: str) -> None:
    """Celery's worker process running serve_duty task `task` died under it (killed: signal 9 is
    most often the kernel's out-of-memory killer). Called in the Celery worker's main process
    (workers/tasks.py): the duty is sent on once; the second time in a row the run fails,
    saying so (holding.worker_lost)."""
    try:
        run_id, duty = turns.owner_of(task, run_id, duty)  # a turn may have given it another duty
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            log.warning("run %s (%s): the process serving task %s is gone: %s", run_id, duty, task, cause)
            return
        log_for_run(run, duty, logging.WARNING, "run %s (%s): the process serving task %s is gone: %s",
                    run_id, duty, task, cause)
        if holding.worker_lost(run, duty, task, cause):
            send(run, [duty])
    finally:
        connection.close()  # the worker's main process serves no request that would close it
