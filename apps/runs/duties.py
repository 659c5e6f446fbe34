"""A run's duties (supervision.py's docstring: what each worker task holds while the run is
served), the queue each goes to, and who holds each as the run's heartbeats say. Read-only: what
changes a holding (claim, heartbeat, hand-over, release) is in holding.py."""
import os
import socket
from datetime import datetime
from functools import cache

from django.conf import settings
from django.utils import timezone

from workers.rft.synchronizer import SPLIT_SYNC_METHODS

from .models import Run

NODE_DUTY = "trainer-node-"  # + K: the trainer's ranks on machine K (1..trainer.num_nodes-1)


def duties_of_run(run: Run) -> tuple[str, ...]:
    """The duties a worker task each holds while the run is served (supervision.py's docstring)."""
    return duties_of(run.config)


def duties_of(config: dict) -> tuple[str, ...]:
    """The duties a run of this (stored) config has."""
    # .get with the schema's defaults: a run stored before a key existed does not have it.
    mode, trainer = config.get("mode", "both"), config.get("trainer", {})
    split = mode == "both" and config.get("synchronizer", {}).get("method", "memory") in SPLIT_SYNC_METHODS
    several = trainer.get("strategy", "single") != "single" and mode != "explore"
    nodes = trainer.get("num_nodes", 1) if several else 1
    explorers = ("explorer", *(f"explorer-{k}" for k in range(1, config.get("explorer", {}).get("engine_num", 1))))
    return ((*explorers, "trainer") if split else ("loop",)) + tuple(f"{NODE_DUTY}{k}" for k in range(1, nodes))


def is_explorer(duty: str) -> bool:
    """explorer, or explorer-K: one of the run's explorer.engine_num explorers."""
    return duty == "explorer" or duty.startswith("explorer-")


def queue_of(duty: str) -> str:
    """The Celery queue whose workers serve the duty."""
    return "explore" if is_explorer(duty) else "train"


# A duty is held by the worker its heartbeat names, until that worker lets it go ("ended") or
# falls silent for RFTWEB_HEARTBEAT_TIMEOUT seconds. Only claim_duty makes a worker the holder;
# a worker that finds another holder stops (the watchdog or a resume gave the duty away).
HANDED_OVER = "watchdog"  # the holder the watchdog writes when it sends a dead worker's duty on


def heartbeat_age(run: Run, duty: str) -> float | None:
    """Seconds since the duty's last heartbeat (None: it never had one)."""
    beat = run.heartbeats.get(duty)
    if not beat:
        return None
    return (timezone.now() - datetime.fromisoformat(beat["at"])).total_seconds()


def holder(run: Run, duty: str, timeout: float | None = None) -> str | None:
    """Who holds the duty as `run` was read: a worker id, HANDED_OVER (a task was sent on for it
    and has not started yet) or None (never claimed, or let go). With `timeout`, who holds it
    alive: None also for a worker silent for `timeout` seconds or whose process is gone."""
    beat = run.heartbeats.get(duty)
    if not beat or beat.get("ended"):
        return None
    if timeout is not None and (heartbeat_age(run, duty) > timeout
                                or process_is_gone(beat["worker"], beat.get("pid_namespace", ""))):
        return None
    return beat["worker"]


def process_is_gone(worker: str, namespace: str) -> bool:
    """True for a worker ("host:pid", supervision.worker_id) of this machine whose process has
    exited (killed): nobody need wait for its heartbeat to expire. `namespace`: the pid namespace
    its pid is of (pid_namespace(), recorded with it). Unknown elsewhere: False, and so for a pid
    of another namespace under this host name (a container with docker's network_mode: host, two
    machines named `ubuntu`): this process table would judge another process by its number."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if not same_namespace(namespace):
        return earlier_boot(namespace)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    # A killed pool process whose parent died too waits as a zombie until init reaps it (a
    # container's PID 1 may never): it is gone all the same.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@cache
def pid_namespace() -> str:
    """The pid namespace this process's pid is a pid of, on this boot of this machine
    ("<machine id>/<boot id>/pid:[<inode>]": a namespace's inode is unique within a boot, a boot id
    across machines and boots); "" where there is no /proc to say (macOS: no pid namespaces, the
    host name tells). The machine id (systemd's, "" where the image has none) tells an earlier
    boot of this machine from another machine of the same host name: earlier_boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot_id:
            boot = boot_id.read().strip()
        return f"{_machine_id()}/{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _machine_id() -> str:
    try:
        with open("/etc/machine-id") as machine_id:
            return machine_id.read().strip()
    except OSError:
        return ""


def same_namespace(recorded: str) -> bool:
    """Whether a pid_namespace() recorded earlier is this process's. One recorded before the
    machine id was part of it ("<boot id>/pid:[<inode>]", a job owner of core 0002's) is if its
    boot and inode are: an owner killed before an upgrade was taken as running for good."""
    now = pid_namespace()
    return recorded == now or (recorded.count("/") == 1 and recorded == now.partition("/")[2])


def earlier_boot(namespace: str) -> bool:
    """Whether `namespace` (a pid_namespace() recorded under this host name) is this machine's
    before its last reboot: every process of it is gone. After a reboot (the laptop closed) an
    embedded demo's or an import command's job was taken as running for good: no pid of the old
    boot is judged here, and they have no Celery worker to ask."""
    machine, _, rest = namespace.partition("/")
    mine, _, now = pid_namespace().partition("/")
    return bool(machine) and machine == mine and rest.partition("/")[0] != now.partition("/")[0]


def workers_holding(run: Run) -> dict[str, str]:
    """{duty: worker} for the duties a live worker holds."""
    timeout = settings.RFTWEB_HEARTBEAT_TIMEOUT
    held = {duty: holder(run, duty, timeout) for duty in run.heartbeats}
    return {duty: worker for duty, worker in held.items() if worker not in (None, HANDED_OVER)}
