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
A duty is held through a heartbeat written by a background thread (services.claim_duty, .heartbeat,
.release_duty); the `watchdog` (Celery beat) sends on a duty whose heartbeat expired (its worker
died), and the new task resumes: the trainer from the last checkpoint, the explorer from its last
stored step. A failed or stopped run resumes the same way when its user resumes it
(services.resume_run queues it again). Pause and stop are statuses the duties check every step;
so is holding the duty: a worker that finds its duty taken over stops at once, saving and
changing nothing.

With trainer.strategy 'ddp' the process holding the trainer (duty `loop` or `trainer`) is the
trainer's rank 0: it alone talks to the database; it starts the other ranks of its machine as
`python -m workers.rft follow` processes for as long as the duty runs (trainer_ranks). With
trainer.num_nodes > 1 each further machine is a duty of its own, `trainer-node-K` (queue `train`):
the worker holding it starts that machine's ranks in each group rank 0 opens, meeting it at the
address rank 0 writes on the run (Run.rendezvous["trainer"]; serve_node). A rank that dies or hangs breaks
the group: rank 0's next collective fails naming it, and its duty ends as if its worker had died,
so the watchdog restarts the whole group from the last checkpoint (up to RFTWEB_MAX_HANDOVERS
times in a row without progress; then the run fails naming the rank, for its user to resume).

The Celery tasks (workers/tasks.py) are entry points into start_run, serve and watchdog here.
Tasks are sent by name (rftweb.celery.enqueue), so this module does not import them.
"""
import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction

from rftweb.celery import enqueue

from . import capacity, services
from .checkpoints import run_checkpoint_dir
from .live import publisher
from .logs import DutyLog
from .models import MetricPoint, Run
from .services import NODE_DUTY, duties_of_run

log = logging.getLogger(__name__)
Status = Run.Status
SERVE_TASK = "workers.tasks.serve_duty"
WAIT_SECONDS = 0.5  # how often a duty waiting for the other one looks again
DATABASE_LOST = (OperationalError, InterfaceError)
DISK_FULL_MARKS = ("No space left on device", "StorageFull", "file write failed")
MAX_CAUSE_CHARS = 1000  # an exception can quote a whole input back
FOLLOWERS_EXIT_SECONDS = 10  # for released follower ranks to exit before they are killed
# torch holds one process group per process: one data-parallel trainer at a time in a worker
# process (an embedded server, or a threads pool, may serve several runs at once).
TRAINER_GROUP = threading.Lock()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_dir(run: Run) -> Path:
    """The run's work dir (weights versions, checkpoints). Named by id *and* creation time: ids are
    reused after a database reset, and a new run must never resume from an old run's files."""
    return settings.DATA_DIR / "runs" / f"{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def set_explorers(run: Run, count: int) -> Run:
    """Serve the run with `count` explorers from now on (explorer.engine_num), while it runs: the
    new ones are sent to explore workers once this commits; those beyond `count` stop after the
    part of a step they are rolling out (wait_while_paused), leaving no group half done.
    ConfigError (naming explorer.engine_num) for a count the run's config refuses;
    services.InvalidTransition for a run that is not running or paused."""
    from workers.rft.config import ConfigError, ConfigIssue, RunConfig

    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (Status.RUNNING, Status.PAUSED):
            raise services.InvalidTransition(
                f"run {locked.name!r} is {locked.status}: explorers are added or removed while it runs or is paused")
        before = duties_of_run(locked)
        if (locked.config.get("synchronizer", {}).get("method") == "nccl"
                and count != locked.config.get("explorer", {}).get("engine_num", 1)):
            raise ConfigError([ConfigIssue("explorer.engine_num", "synchronizer.method 'nccl' sends the weights to a "
                                           "group of a fixed size: this run keeps its explorers (checkpoint sync "
                                           "adds and removes them)")])
        config = {**locked.config, "explorer": {**locked.config.get("explorer", {}), "engine_num": count}}
        locked.config = RunConfig.from_dict(config).to_dict()
        locked.save(update_fields=["config", "updated_at"])
        for duty in duties_of_run(locked):
            if duty not in before:
                transaction.on_commit(lambda duty=duty: send(locked.pk, duty))
    run.refresh_from_db()
    return run


def send(run_id: int, duty: str) -> None:
    enqueue(SERVE_TASK, run_id, duty, queue=services.queue_of(duty))


def start_run(run_id: int) -> None:
    """A queued run starts: one task per duty."""
    run = Run.objects.get(pk=run_id)
    if run.status != Status.QUEUED:
        return
    services.set_status(run, Status.STARTING)
    for duty in duties_of_run(run):
        send(run_id, duty)


# ---- serving a duty ------------------------------------------------------------------------------


class Heartbeat(threading.Thread):
    """Beats every `interval` seconds while the task lives, however long a step takes, and logs
    system metrics (CPU, memory, GPU) with each beat."""

    def __init__(self, run: Run, duty: str, worker: str, interval: float):
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}-{duty}")
        self.target_run, self.duty, self.worker, self.interval = run, duty, worker, interval
        self.stopped = threading.Event()

    def run(self):
        try:
            while not self.stopped.wait(self.interval):
                try:
                    if not services.heartbeat(self.target_run, self.duty, self.worker):
                        return  # the duty was taken over: the duty's next status check stops it
                    if self.duty in ("loop", "trainer"):  # one series per run
                        services.record_metrics(self.target_run, "system", int(time.time()), system_metrics())
                except DATABASE_LOST as err:  # beat again once the database is back
                    log.warning("heartbeat of run %s (%s) missed: %s", self.target_run.pk, self.duty, err)
                    connection.close()
        finally:
            connection.close()

    def stop(self):
        self.stopped.set()
        self.join(timeout=5)


def system_metrics() -> dict:
    # Imported here: torch loads only in workers, not in every web process that imports this module.
    import psutil
    import torch

    values = {"cpu_percent": psutil.cpu_percent(), "memory_gb": psutil.Process().memory_info().rss / 2**30}
    if torch.cuda.is_available():
        values["gpu_memory_gb"] = torch.cuda.memory_allocated() / 2**30
    return values


class DutyLost(Exception):
    """Another worker holds this duty now (the watchdog handed it on, or the run was resumed)."""


class Stopped(Exception):
    """The run stopped (or ended) while the duty waited for the run's other duties."""


class HandBack(Exception):
    """The worker serving the duty is shutting down in order (SIGTERM): the duty saved what a
    resume needs at a step boundary and lets the run go, still active, for another worker (the
    watchdog sends the duty on; the run carries on from that checkpoint)."""


def still_served(run: Run, duty: str, worker: str) -> bool:
    """Whether the run is still to be served (Run.SERVED) by this duty; DutyLost once `worker`
    no longer holds it. What a duty waiting for others looks at, so that a stop reaches it."""
    run.refresh_from_db(fields=["status", "heartbeats"])
    if services.holder(run, duty) != worker:
        raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
    return run.status in Run.SERVED


def wait_while_paused(run: Run, duty: str, worker: str, interval: float = 1.0, leaving=lambda: False) -> str:
    """The run's status once it is not paused (or, paused, once `leaving()`: its worker shuts
    down); DutyLost as soon as `worker` no longer holds `duty`, or the duty is no longer the run's
    (an explorer beyond a lowered explorer.engine_num)."""
    while True:
        run.refresh_from_db(fields=["status", "heartbeats", "config"])
        if services.holder(run, duty) != worker:
            raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
        if duty not in duties_of_run(run):
            raise DutyLost(f"run {run.pk}: {duty} is no longer one of its duties (explorers: "
                           f"{run.config['explorer']['engine_num']})")
        if run.status != Status.PAUSED or leaving():
            return run.status
        time.sleep(interval)


def serve(run_id: int, duty: str) -> str:
    """Hold `duty` of the run until it ends: claim it, beat, run the engine (again, in place, after
    a database outage), and let it go, failing the run with the error if there was one."""
    run = Run.objects.get(pk=run_id)
    me = worker_id()
    # A task of a run stopped or ended exits on this one read: a stop may leave 1,000 queued.
    claimed = run.status in Run.SERVED and services.claim_duty(
        run, duty, me, settings.RFTWEB_HEARTBEAT_TIMEOUT, node=capacity.this_node()
    )
    if not claimed:
        return "skipped"
    # What this duty's threads log while it serves goes to the run page's Logs panel (logs.py).
    with DutyLog(run_dir(run), run_id, duty, secrets=[run.secret], clean=without_server_paths):
        return serve_claimed(run, duty, me)


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
        try:  # let the duty go (failing the run with the error, if any): it may be resumed at once
            services.release_duty(run, duty, me, error=failure, broke=broke, handed_back=handed_back)
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
    from workers.rft.config import RunConfig
    from workers.rft.loop import EXPLORER, TRAINER, Loop

    from .store import run_stores

    config = RunConfig.from_dict(run.config)
    stores = run_stores(run, config, duty, worker)
    components = (EXPLORER,) if services.is_explorer(duty) else {"trainer": (TRAINER,)}.get(duty)
    node = capacity.this_node()
    leaving = lambda: capacity.node_stopping(node)  # noqa: E731 - its worker shuts down in order
    status = lambda: wait_while_paused(run, duty, worker, leaving=leaving)  # noqa: E731
    final_eval = None  # the trainer of a split run: the version its first explorer evaluates last
    # Closed when the duty ends: a worker process outlives its runs, vLLM's processes and the
    # follower ranks must not.
    with trainer_ranks(run, config, duty, worker) as ranks, Loop(config, stores, run_dir(run), components=components,
                                                                 ranks=ranks) as loop:
        if loop.trainer is not None:
            checkpoint = stores.checkpoints.latest()
            if checkpoint is not None:
                log.info("run %s (%s): from checkpoint v%s (trainer step %s)",
                         run.pk, duty, checkpoint.version, checkpoint.step)
                # Only from the run's own directory: the path is a row a worker trusts, not a place
                # any file may be loaded from.
                loop.resume(run_checkpoint_dir(checkpoint, run_dir(run)))
            elif run.trainer_step:
                log.info("run %s (%s): no checkpoint yet, from step 0 (same run)", run.pk, duty)
            # Steps after the checkpoint are replayed: give them back the rows the lost steps took.
            stores.buffer.rewind(checkpoint.created_at if checkpoint else None)
        run.refresh_from_db()
        if services.is_explorer(duty):
            loop.explorer.step = run.explorer_step  # steps already stored are not redone
        status()  # nobody took the duty over while the engine loaded
        services.mark_started(run, duty, worker)

        # A stop or a worker shutting down: the loop saves a checkpoint at this step first.
        stopping = lambda: status() in (Status.STOPPING, *Run.FINISHED) or leaving()  # noqa: E731
        if services.is_explorer(duty):
            outcome = loop.run_explorer(should_stop=lambda: status() != Status.RUNNING or leaving(), wait=pause,
                                        trained=lambda: trainer_steps(run) >= config.trainer.total_steps,
                                        evaluates_ends=duty == "explorer")
        elif duty == "trainer":
            outcome = loop.run_trainer(stopping, explored_steps=lambda: explorer_steps(run), wait=pause)
            if outcome == "completed" and config.explorer.eval_interval:
                final_eval = loop.final_version()
        else:
            outcome = loop.run(should_stop=stopping)
    if final_eval is not None:
        del loop  # its model freed while the explorer evaluates (its ranks are released)
        outcome = wait_for_final_eval(run, final_eval, stopping)
    if outcome == "stopped" and leaving():
        raise HandBack(f"its worker {node} is shutting down")
    if not services.is_explorer(duty):
        finish(run, status())
    return outcome


def pause() -> None:
    time.sleep(WAIT_SECONDS)


def is_rank_failure(exc: BaseException) -> bool:
    """A rank of the trainer died or hung (distributed.RankFailure), here or on another machine,
    or an explorer of its weight group did (weight_broadcast.WeightSyncError)."""
    failures = []
    if "workers.rft.distributed" in sys.modules:  # else torch was not even loaded: no group ran here
        from workers.rft.distributed import RankFailure

        failures.append(RankFailure)
    if "workers.rft.weight_broadcast" in sys.modules:
        from workers.rft.weight_broadcast import WeightSyncError

        failures.append(WeightSyncError)
    return isinstance(exc, tuple(failures))


@contextmanager
def trainer_ranks(run: Run, config, duty: str, worker: str):
    """The trainer's ranks (distributed.Ranks) while the duty runs, with this process as rank 0
    and the others started here; None unless the duty holds a trainer of several ranks. On the way out
    (Loop.close has sent its followers stop, unless the group broke) the followers get
    FOLLOWERS_EXIT_SECONDS to exit, then are killed, and the group goes.

    The group's store listens on 127.0.0.1 when every rank is on this machine, else on
    RFTWEB_NODE_ADDRESS alone; its ranks prove they know the run's secret (Run.secret) before
    they join. Waiting for ranks that do not come ends as soon as the run is no longer served
    (Stopped): a stop reaches a leader waiting for 999 machines."""
    trainer = config.trainer
    if trainer.strategy == "single" or services.is_explorer(duty):
        yield None
        return
    import torch
    import torch.distributed as dist

    from workers.rft.distributed import JoinCancelled, RankFailure, free_port, join
    from workers.rft.models import pick_device

    device = pick_device(config.model.device).type
    local_size, world_size = trainer.num_processes, trainer.num_processes * trainer.num_nodes
    if device == "cuda" and torch.cuda.device_count() < local_size:
        raise ValueError(f"trainer.num_processes is {local_size}: {local_size} ranks need as many GPUs; "
                         f"this worker's machine has {torch.cuda.device_count()}")
    if not TRAINER_GROUP.acquire(blocking=False):
        raise RuntimeError("this worker process already trains a data-parallel run (one per process): resume this "
                           "run once that one has ended, or serve runs from Celery workers (a process each)")
    threads = torch.get_num_threads()  # join shares the cores out between the ranks
    host = settings.RFTWEB_NODE_ADDRESS if trainer.num_nodes > 1 else "127.0.0.1"
    port = free_port(host)
    followers, ranks, generation = [], None, None
    try:
        for rank in range(1, local_size):
            followers.append(start_follower(config, rank, world_size, f"{host}:{port}", device, run.secret))
        log.info("run %s (%s): trainer rank 0 is process %s, ranks 1..%s are processes %s", run.pk, duty,
                 os.getpid(), local_size - 1, [proc.pid for proc in followers])
        if trainer.num_nodes > 1:
            generation = services.open_rendezvous(run, "trainer", host, port, world_size)
        try:
            ranks = join(0, world_size, 0, (host, port, True), trainer.collective_timeout_s, device,
                         local_world_size=local_size, secret=run.secret,
                         should_stop=lambda: not still_served(run, duty, worker))
        except JoinCancelled as err:
            raise Stopped(f"{err}: the run is {run.status}") from err
        except (RuntimeError, dist.DistError) as err:
            exited = [f"rank {rank} exited with {proc.poll()}" for rank, proc in enumerate(followers, 1)
                      if proc.poll() is not None]
            if exited:
                raise RankFailure(f"{', '.join(exited)} before joining (the worker's log has its error)") from err
            if trainer.num_nodes > 1:
                raise RankFailure(
                    f"not every machine's ranks joined within {trainer.collective_timeout_s:g} s "
                    f"(trainer.collective_timeout_s): each of the trainer.num_nodes ({trainer.num_nodes}) needs a "
                    f"train worker free to serve it, reaching {host}:{port} "
                    "(RFTWEB_NODE_ADDRESS)") from err
            raise
        yield ranks
    finally:
        if generation is not None:
            services.close_rendezvous(run, "trainer", generation)
        end_followers(followers, at_once=ranks is None or ranks.failed)
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        TRAINER_GROUP.release()


def start_follower(config, rank: int, world_size: int, master: str, device: str, secret: str,
                   local_rank: int | None = None, local_size: int | None = None) -> subprocess.Popen:
    """A follower rank as a process of its own (not multiprocessing: a Celery pool process is
    daemonic, and may start no children that way); its output goes to the worker's log. On the
    leader's machine its local rank (its GPU) is its rank. The run's secret goes in its
    environment (not its command line, which every user of the machine can read)."""
    from workers.rft.distributed import SECRET_ENV

    local = [] if local_rank is None else ["--local-rank", str(local_rank), "--local-world-size", str(local_size)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.rft", "follow", "-", "--rank", str(rank), "--world-size", str(world_size),
         "--master", master, "--device", device, *local],
        stdin=subprocess.PIPE, cwd=settings.BASE_DIR, text=True, env={**os.environ, SECRET_ENV: secret},
    )
    with proc.stdin:
        proc.stdin.write(json.dumps(config.to_dict()))
    return proc


def end_followers(followers: list[subprocess.Popen], at_once: bool) -> None:
    """Wait for released followers to exit; kill the rest (at once: the group broke, a live
    follower may be stuck in a collective)."""
    deadline = time.monotonic() + (0 if at_once else FOLLOWERS_EXIT_SECONDS)
    for proc in followers:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if not at_once:
                log.warning("follower rank process %s did not exit when released; killing it", proc.pid)
            proc.kill()
            proc.wait()


def serve_node(run: Run, duty: str, worker: str) -> str:
    """Machine K of a trainer on several (duty trainer-node-K): start its ranks (K*P .. K*P+P-1,
    P = trainer.num_processes) in each group rank 0 opens, once per group, until the run is no
    longer served: on a stop it leaves within FOLLOWERS_EXIT_SECONDS (its followers' time to take
    rank 0's stop), whether or not a group ever formed. A group that rank 0 closed or replaced
    takes its ranks with it."""
    from workers.rft.config import RunConfig
    from workers.rft.models import pick_device

    config = RunConfig.from_dict(run.config)
    node, local_size = int(duty.removeprefix(NODE_DUTY)), config.trainer.num_processes
    device = pick_device(config.model.device).type
    served, followers = None, []
    try:
        while True:
            if not still_served(run, duty, worker):
                # Rank 0 sends its followers stop once its last step and checkpoint are done:
                # they get FOLLOWERS_EXIT_SECONDS for that, not the run's whole life.
                end_followers(followers, at_once=False)
                followers = []
                return run.status
            run.refresh_from_db(fields=["rendezvous"])
            group = run.rendezvous.get("trainer", {})
            if followers and (group.get("generation") != served or "host" not in group):
                end_followers(followers, at_once=False)  # released by a stop, or left in a broken group
                followers = []
            if not followers and "host" in group and group["generation"] != served:
                served = group["generation"]
                master = f"{group['host']}:{group['port']}"
                followers = [start_follower(config, node * local_size + i, group["world_size"], master, device,
                                            run.secret, local_rank=i, local_size=local_size)
                             for i in range(local_size)]
                log.info("run %s (%s): ranks %s..%s joining group %s at %s", run.pk, duty, node * local_size,
                         (node + 1) * local_size - 1, served, master)
                services.mark_started(run, duty, worker)
            pause()
    finally:
        end_followers(followers, at_once=True)


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


def finish(run: Run, status: str) -> None:
    """The trainer (or the single loop) is done: completed, or stopped if a stop was asked."""
    if status not in Run.FINISHED:
        services.set_status(run, Status.STOPPED if status == Status.STOPPING else Status.COMPLETED)


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


# ---- a failure, as its user reads it --------------------------------------------------------------


def describe_failure(duty: str, exc: BaseException, work_dir: Path) -> str:
    """The run's error, as every researcher watching the run reads it: the cause and what to do.
    The traceback is not part of it (it names the server's files and code): serve logs it in the
    worker's log. A full disk surfaces as OSError, torch's RuntimeError or safetensors' own error:
    look at the error's text and at the disk itself."""
    disk_full = getattr(exc, "errno", None) == errno.ENOSPC or any(mark in str(exc) for mark in DISK_FULL_MARKS)
    if disk_full or free_bytes(work_dir) < 1024 * 1024:
        return (
            f"{duty} failed: the disk holding the run's directory ({without_server_paths(work_dir)} in the data "
            "directory) is full (no space left on device). Free space there, then resume the run: it continues "
            "from its last checkpoint."
        )
    cause = without_server_paths(f"{type(exc).__name__}: {exc}")
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[:MAX_CAUSE_CHARS] + " [...]"
    return (
        f"{duty} failed: {cause}\n\nThe traceback is in the worker's log, for the server's administrators. "
        "Fix the cause, then resume the run: it continues from its last checkpoint."
    )


def without_server_paths(text) -> str:
    """Paths in the data directory as the user knows them (relative to it); the server's own
    directories (the code, Python's install) not at all."""
    text = str(text)
    for directory, shown_as in (
        (settings.DATA_DIR, ""),
        (settings.BASE_DIR, "<rftweb>/"),
        (Path(sys.prefix), "<python>/"),
        (Path(sys.base_prefix), "<python>/"),
    ):
        text = text.replace(f"{directory}{os.sep}", shown_as).replace(str(directory), shown_as or ".")
    return text


def free_bytes(path: Path) -> float:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return float("inf")


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
            if not services.workers_holding(run):
                services.set_status(run, Status.STOPPED)
            continue
        for duty in duties_of_run(run):
            beat = run.heartbeats.get(duty)
            if beat is None or services.holder(run, duty, timeout) is not None:
                continue  # its first task is queued (start_run, set_explorers sent it), or it is held
            if not services.hand_over(run, duty, settings.RFTWEB_MAX_HANDOVERS):
                break  # the run failed: its user resumes it
            if beat["worker"] == services.HANDED_OVER:
                continue  # sent on before and not claimed yet: that task is still queued
            send(run.pk, duty)
            resumed.append((run.pk, duty))
    return resumed
