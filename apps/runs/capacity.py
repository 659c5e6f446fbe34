"""Capacity: the workers that serve runs and jobs, and what each one holds.

A Celery worker registers when it is ready (workers/tasks.py's signal handlers), with what its
machine has (hosts.py: memory, cores, GPUs: a launch checks a run against them), beats every
RFTWEB_HEARTBEAT_INTERVAL seconds on a thread of its main process (which registers it where that
failed), and is marked stopped on an orderly shutdown; one silent for RFTWEB_HEARTBEAT_TIMEOUT
without that is lost. Its slots are its pool processes. What a slot holds is read off the active
runs' duty heartbeats, which name the Celery worker serving each duty (`node`,
holding.claim_duty). Embedded (no Celery) the web process is the one worker: its threads serve
every duty, without a slot limit.

The Workers page and /api/workers/ show `overview()`, as Celery Flower and Ray's dashboard show
theirs: who is there, what each holds since when, and who was lost. What a run waits for, given
them: waits.py.
"""
import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from functools import cache

from django.conf import settings
from django.core.cache import cache as shared_cache
from django.db import Error as DatabaseError
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from . import duties
from .hosts import GB, ProcessUsage, cpu_count, gone, gpus, memory_bytes
from .models import Run, Worker

log = logging.getLogger(__name__)

LOST_SHOWN_FOR = timedelta(hours=24)  # lost and stopped workers stay on the page this long
EARLIER_LIVES_KEPT = 10  # of a worker restarted under the same name, within that day
ALL_QUEUES = ["default", "train", "explore"]


@dataclass
class Holding:
    """One duty a worker's slot serves."""

    run_id: int
    run_name: str
    run_status: str
    duty: str
    since: datetime | None  # when this worker claimed it
    last_beat: datetime


@dataclass
class WorkerState:
    name: str
    host: str
    pid: int | None
    queues: list[str]
    slots: int | None  # None: embedded, no limit
    gpus: list[dict]
    version: str
    started_at: datetime | None
    last_seen: datetime | None
    state: str  # live | lost | stopped
    holds: list[Holding] = field(default_factory=list)
    memory_gb: float | None = None  # what its processes may use (hosts.memory_bytes), for the launch's check
    cpus: int | None = None
    stopped_at: datetime | None = None
    restarted_at: datetime | None = None  # an earlier life: when the same name started again
    usage: dict = field(default_factory=dict)  # what its processes used at its last beat (hosts.ProcessUsage)
    drain: dict = field(default_factory=dict)  # {"by", "at"} while a curator has it drained (drain)

    @property
    def free(self) -> int | None:
        """Slots that would take a duty: none while it drains (what it waits for counts it out)."""
        if self.slots is None:
            return None
        return 0 if self.drain else max(0, self.slots - len(self.holds))

    def as_json(self) -> dict:
        data = asdict(self)
        data["free"] = self.free
        data["url"] = worker_url(self.name)
        for key in ("started_at", "last_seen", "stopped_at", "restarted_at"):
            data[key] = data[key] and data[key].isoformat()
        for hold in data["holds"]:
            hold["since"] = hold["since"] and hold["since"].isoformat()
            hold["last_beat"] = hold["last_beat"].isoformat()
            hold["run_url"] = f"/runs/{hold['run_id']}/"
        return data


def worker_url(name: str) -> str:
    """Its page (/workers/<name>/): any name a worker was started with (`-n`), its odd characters
    quoted (a test's has "@", "/", "?", "#", a space and "ü")."""
    return reverse("worker-detail", args=[name])


def embedded_name() -> str:
    return f"embedded@{socket.gethostname()}"


def this_node() -> str | None:
    """The Celery hostname of the worker serving the current task (what duty heartbeats name);
    embedded, this web process; None outside a task (holdings() then names the duty's process)."""
    if settings.RFTWEB_EMBEDDED:
        return embedded_name()
    from celery import current_task

    return getattr(getattr(current_task, "request", None), "hostname", None)


# ---- what workers report ----------------------------------------------------------------------


@cache
def code_version() -> str:
    """The commit the worker runs (RFTWEB_VERSION where the image has no git checkout)."""
    if version := os.environ.get("RFTWEB_VERSION"):
        return version[:64]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=settings.BASE_DIR, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()[:64] if out.returncode == 0 else ""


# Workers a command has just started (manage.py demo), by queue, until they register: a run's page
# said "none is live. Start one ..." in the stack's first minute while its own workers started.
STARTING_KEY, STARTING_FOR_S = "workers-starting", 180


def workers_starting(names_by_queue: dict[str, list[str]]) -> None:
    """Note that these workers are starting here (in the cache every web process shares)."""
    shared_cache.set(STARTING_KEY, {"at": time.time(), "queues": names_by_queue}, timeout=STARTING_FOR_S)


def register(name: str, queues: list[str], slots: int) -> datetime:
    """A worker is ready (again: a restarted worker of the same name starts afresh, its last life
    kept for the page's Stopped or Lost list). Returns when this life started, which its beats name."""
    now = timezone.now()
    earlier = []
    if (before := Worker.objects.filter(name=name).first()) is not None:
        life = {"host": before.host, "pid": before.pid, "version": before.version, "memory_gb": before.memory_gb,
                "cpus": before.cpus,
                **{key: value and value.isoformat() for key, value in (
                    ("started_at", before.started_at), ("last_seen", before.last_seen),
                    ("stopped_at", before.stopped_at))}}
        shown_since = now - LOST_SHOWN_FOR
        earlier = [old for old in [*before.earlier, life]
                   if datetime.fromisoformat(old["last_seen"]) >= shown_since][-EARLIER_LIVES_KEPT:]
    Worker.objects.update_or_create(name=name, defaults={
        "earlier": earlier,
        "host": socket.gethostname(), "pid": os.getpid(), "pid_namespace": duties.pid_namespace(),
        "queues": sorted(queues), "slots": slots,
        "gpus": gpus(), "memory_gb": round(memory_bytes() / GB, 1), "cpus": cpu_count(), "version": code_version(),
        "started_at": now, "last_seen": now, "stopped_at": None, "drain": {},  # a new life consumes its queues
    })
    return now


def beat(name: str, life: datetime | None, queues: list[str], slots: int, usage: dict | None = None) -> datetime:
    """The worker's heartbeat, for its life that started at `life` (what register returned). Returns
    that life's start: a new one's when it registers the worker instead, because its registration
    failed (`life` None: the database was down as it started) or the row is not this life's (a
    beat that only moved last_seen kept an earlier life's started_at, so a job the dead life owned
    was taken as run: job_owners.is_gone). A row another live worker of the same name beats is
    left to it, saying so: the two took the row in turn every beat, each making the other's running
    jobs look orphaned and wiping its drain."""
    now = timezone.now()
    if life is not None and Worker.objects.filter(name=name, started_at=life).update(
            last_seen=now, gpus=gpus(), usage=usage or {}):
        return life
    other = Worker.objects.filter(name=name).first()
    if (life is not None and other is not None and other.stopped_at is None
            and (now - other.last_seen).total_seconds() < settings.RFTWEB_HEARTBEAT_TIMEOUT):
        log.warning("Another live worker is named %s (on %s, pid %s, since %s): this one's beats are not "
                    "recorded while it beats. Give each worker its own name (celery -n NAME@%%h).",
                    name, other.host, other.pid, other.started_at)
        return life
    return register(name, queues, slots)


def stopped(name: str, life: datetime | None) -> None:
    """The worker's life that started at `life` stopped in order. Another life's row is left as it
    is: a leftover worker of the same name stopping (a demo killed whole and started again) marked
    the live one stopped, which then handed back every duty it took, every 2.5 s."""
    if life is not None:
        Worker.objects.filter(name=name, started_at=life).update(stopped_at=timezone.now())


# Embedded: this server process is shutting down (the demo command's SIGTERM handler).
_server_stopping = threading.Event()


def stop_serving() -> None:
    """Embedded: the server is shutting down; its duties hand their runs back at their next step."""
    _server_stopping.set()


def node_stopping(node: str | None) -> bool:
    """Whether the worker serving a duty (`node`, this_node()) is shutting down in order: its
    duties then hand their runs back at their next step (holding.HandBack) instead of holding
    the shutdown for the runs' whole life. Celery: the worker's row says stopped (worker_stopping)."""
    if settings.RFTWEB_EMBEDDED:
        return _server_stopping.is_set()
    return node is not None and Worker.objects.filter(name=node, stopped_at__isnull=False).exists()


class WorkerBeat(threading.Thread):
    """The worker's own heartbeat, on a thread of its main process (its pool processes may all be
    busy with steps that take minutes)."""

    def __init__(self, name: str, queues: list[str], slots: int, interval: float, life: datetime | None):
        super().__init__(daemon=True, name=f"worker-beat-{name}")
        self.worker_name, self.queues, self.slots, self.interval, self.life = name, queues, slots, interval, life
        self.stopping = threading.Event()
        self.usage = ProcessUsage()

    def run(self):
        try:
            while not self.stopping.wait(self.interval):
                try:
                    self.life = beat(self.worker_name, self.life, self.queues, self.slots, self.usage())
                except DatabaseError as err:  # beat again once the database is back
                    log.warning("worker %s: heartbeat missed: %s", self.worker_name, err)
                    connection.close()
        finally:
            connection.close()

    def stop(self):
        self.stopping.set()
        self.join(timeout=5)


_beats: dict[str, WorkerBeat] = {}


def worker_ready(controller) -> None:
    """Celery's worker_ready (workers/tasks.py): register the worker and start its heartbeat."""
    queues = controller.app.amqp.queues
    names, slots, life = list(queues.consume_from or queues), int(controller.concurrency or 1), None
    try:
        life = register(controller.hostname, names, slots)
    except DatabaseError as err:
        log.warning("worker %s: not registered (%s); its heartbeat will register it", controller.hostname, err)
    finally:
        connection.close()  # the heartbeat thread has its own
    _beats[controller.hostname] = WorkerBeat(controller.hostname, names, slots, settings.RFTWEB_HEARTBEAT_INTERVAL,
                                             life)
    _beats[controller.hostname].start()


def worker_stopping(name: str) -> None:
    """Celery's worker_shutting_down (SIGTERM or SIGINT: a warm shutdown) and worker_shutdown: an
    orderly stop, not a loss. Marked stopped at once: its pool processes' duties see it at their
    next step, save, and let their runs go to another worker (Celery waits for them)."""
    thread = _beats.get(name)  # kept: Celery sends both signals, and each names this life
    if thread is not None:
        thread.stop()
    try:
        stopped(name, thread.life if thread is not None else None)
    except DatabaseError as err:
        log.warning("worker %s: not marked stopped (%s)", name, err)
    finally:
        connection.close()


# ---- a curator drains a worker ------------------------------------------------------------------


SHOWN_NAME = 100  # a worker's name is quoted back this far in a refusal: a URL may carry a whole paste


def shown_name(name: str) -> str:
    """`name` as a message quotes it: repr, cut at SHOWN_NAME characters."""
    return repr(name[:SHOWN_NAME]) + ("…" if len(name) > SHOWN_NAME else "")


class DrainRefused(Exception):
    """Not drained or undrained, changing nothing; the message says why (the API answers each kind
    with its own status: api/workers.py)."""


class NoSuchWorker(DrainRefused):
    """No worker of that name ever registered."""


class NoAnswer(DrainRefused):
    """The worker did not answer the broker's command in time (stopping, or the broker is down)."""


def draining(node: str | None) -> bool:
    """Whether the Celery worker `node` (this_node()) is drained: a duty's task that reached it
    anyway (taken as the drain came) goes back to its queue (turns.turn_away)."""
    return node is not None and not settings.RFTWEB_EMBEDDED and Worker.objects.filter(
        name=node, stopped_at__isnull=True).exclude(drain={}).exists()


def set_drain(name: str, by: str, drain: bool) -> Worker:
    """Drain the live worker `name` (it finishes what it holds and takes no new duty: it stops
    consuming its queues, as Flower's "cancel consumer", so their tasks wait in the broker for the
    other workers) or undrain it (it consumes them again). Marked first, so that a task it had
    taken as the drain came goes back (draining); put back when the worker does not answer.
    DrainRefused embedded, or for a worker not live; NoSuchWorker for a name no worker registered;
    NoAnswer for one that does not answer."""
    from rftweb.celery import set_consuming

    if settings.RFTWEB_EMBEDDED:
        raise DrainRefused("the embedded server serves every duty on threads of its own: there is no worker to "
                           "drain (docs/scale.md: Celery workers)")
    worker = Worker.objects.filter(name=name).first()
    if worker is None:
        raise NoSuchWorker(f"worker {shown_name(name)} is not live: no worker of that name has registered")
    live = next((w for w in overview()["workers"] if w.name == name and w.slots is not None), None)
    if live is None:
        raise DrainRefused(f"worker {shown_name(name)} is not live: it takes no duty already")
    if bool(worker.drain) == drain:
        return worker  # already so: a second click, or another curator's
    before = worker.drain
    worker.drain = {"by": by, "at": timezone.now().isoformat()} if drain else {}
    worker.save(update_fields=["drain"])
    if not set_consuming(name, worker.queues, consume=not drain):
        set_consuming(name, worker.queues, consume=not before)  # whatever it did answer for, back
        worker.drain = before
        worker.save(update_fields=["drain"])
        raise NoAnswer(f"worker {shown_name(name)} did not answer (stopping, or the broker is down): nothing changed; "
                       "try again")
    log.info("worker %s %s by %s", name, "drained" if drain else "undrained", by)
    return worker


# ---- what the page shows ----------------------------------------------------------------------


def holdings() -> dict[str, list[Holding]]:
    """{worker name: the duties it holds alive}, from the active runs' heartbeats."""
    held: dict[str, list[Holding]] = {}
    for run in Run.objects.filter(status__in=Run.ACTIVE).only("pk", "name", "status", "heartbeats"):
        for duty, worker in duties.workers_holding(run).items():
            beat_ = run.heartbeats[duty]
            since = beat_.get("since")
            held.setdefault(beat_.get("node") or worker, []).append(Holding(
                run.pk, run.name, run.status, duty, since and datetime.fromisoformat(since),
                datetime.fromisoformat(beat_["at"]),
            ))
    for holds in held.values():
        holds.sort(key=lambda h: (h.run_id, h.duty))
    return held


_server_usage = ProcessUsage()  # embedded: the server process, measured as the page asks


def overview(now: datetime | None = None) -> dict[str, list[WorkerState]]:
    """{"workers": the live ones, "lost": those silent without stopping (the last day's),
    "stopped": those that stopped in order (the last day's)}."""
    now = now or timezone.now()
    held = holdings()
    if settings.RFTWEB_EMBEDDED:
        me = WorkerState(embedded_name(), socket.gethostname(), os.getpid(), ALL_QUEUES, None, [], code_version(),
                         None, now, "live", held.pop(embedded_name(), []),
                         round(memory_bytes() / GB, 1), cpu_count(), usage=_server_usage())
        return {"workers": [me], "lost": [], "stopped": []}
    timeout = timedelta(seconds=settings.RFTWEB_HEARTBEAT_TIMEOUT)
    out = {"workers": [], "lost": [], "stopped": []}
    for worker in Worker.objects.filter(last_seen__gte=now - LOST_SHOWN_FOR - timeout):
        if worker.stopped_at is not None:
            state = "stopped"
        else:
            state = "live" if now - worker.last_seen <= timeout and not gone(worker) else "lost"
        shown = WorkerState(
            worker.name, worker.host, worker.pid, worker.queues, worker.slots, worker.gpus, worker.version,
            worker.started_at, worker.last_seen, state, held.pop(worker.name, []) if state == "live" else [],
            worker.memory_gb, worker.cpus, worker.stopped_at, usage=worker.usage if state == "live" else {},
            drain=worker.drain if state == "live" else {},
        )
        out["workers" if state == "live" else state].append(shown)
        restarted = worker.started_at
        for life in reversed(worker.earlier):  # newest first: each was ended by the next one's start
            last_seen = datetime.fromisoformat(life["last_seen"])
            if now - last_seen <= LOST_SHOWN_FOR:
                ended = life["stopped_at"] and datetime.fromisoformat(life["stopped_at"])
                out["stopped" if ended else "lost"].append(WorkerState(
                    worker.name, life["host"], life["pid"], worker.queues, worker.slots, [], life["version"],
                    datetime.fromisoformat(life["started_at"]), last_seen, "stopped" if ended else "lost",
                    memory_gb=life.get("memory_gb"), cpus=life.get("cpus"), stopped_at=ended, restarted_at=restarted))
            restarted = datetime.fromisoformat(life["started_at"])
    for section in ("lost", "stopped"):  # the latest first
        out[section].sort(key=lambda shown: shown.stopped_at or shown.last_seen, reverse=True)
    # Duties held by a worker that never registered (started before this version): still shown.
    for name, holds in held.items():
        out["workers"].append(WorkerState(name, "", None, [], None, [], "", None, None, "live", holds))
    return out
