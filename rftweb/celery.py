"""The Celery app, `enqueue`: the one way the project sends work to a worker, and `withdraw`: the
one way it takes back work no worker has taken yet.

Services enqueue by task *name*, so no services module imports a tasks module (which imports the
services back): the import graph has no circles.
"""
import json
import logging
import os
import threading
from importlib import import_module
from uuid import uuid4

from celery import Celery
from kombu.exceptions import OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

log = logging.getLogger(__name__)
app = Celery("rftweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # apps/*/tasks.py
app.autodiscover_tasks(["workers"])  # workers/tasks.py


# Embedded: whether a task this process sends runs on a thread of it (serve_here).
_serving_here = True


def serve_here(yes: bool) -> None:
    """Embedded: whether the tasks this process sends run on its threads (they do unless told).
    A command that may exit before its run ends (rft_run, rft_resume) says no: its threads would
    die with it and leave the run half started, which nothing sent on again. What it sends
    meanwhile is dropped: it sends only start_run, and the run stays queued for the demo server,
    which starts queued runs (apps/runs/management/commands/demo.py, pick_up)."""
    global _serving_here
    _serving_here = yes


def enqueue(name: str, *args, queue: str = "default", task_id: str | None = None) -> str:
    """Send task `name` (its dotted path, e.g. "workers.tasks.start_run") to `queue`; returns its
    task id (`task_id`, else a new one), which the task reads as its request's id. Embedded (no
    REDIS_URL) it runs on a thread of this process, which is then the worker: its live updates
    reach this process's in-memory channel layer (not after serve_here(False): then nowhere)."""
    from django.conf import settings
    from django.db import connection

    module, _, attr = name.rpartition(".")
    task = getattr(import_module(module), attr)  # at call time: the tasks module imports the services
    task_id = task_id or str(uuid4())
    if not settings.RFTWEB_EMBEDDED:
        task.apply_async(args, queue=queue, task_id=task_id)
        return task_id
    if not _serving_here:
        return task_id

    def work():
        try:
            task.apply(args, task_id=task_id, throw=True)  # apply, not a call: the task knows its id
        finally:
            connection.close()

    threading.Thread(target=work, daemon=True, name=f"{name}{args}").start()
    return task_id


def withdraw(queue: str, task_ids) -> set[str]:
    """Take the tasks with these ids out of `queue` before a worker gets them. Returns the ids of
    those that will never run: taken out now, or in no queue and with no worker (lost, or already
    run). One a worker has reserved or runs is left to run.

    Celery itself cannot: `revoke` only has each live worker drop the task when it comes to it (a
    worker started later runs it), and the message stays queued, ahead of other runs' work, until
    then. Kombu's Redis transport keeps a queue as a Redis list of that name (tasks sent without
    a priority, as all of this project's are), each item a JSON message whose headers name its task
    id, and a message a worker has taken, until it is acknowledged, in the hash `unacked_key`.
    Embedded, a task runs on its thread as soon as it is sent: none waits anywhere."""
    from django.conf import settings

    wanted = set(task_ids)
    if settings.RFTWEB_EMBEDDED or not wanted:
        return wanted
    gone = set(wanted)
    conn = app.connection_for_write()
    try:
        with conn:
            channel = conn.default_channel
            client = channel.client
            # The queue before the unacked hash: a message moves from the one to the other.
            for raw in client.lrange(queue, 0, -1):
                task_id = _task_id(json.loads(raw))
                if task_id in wanted and not client.lrem(queue, 1, raw):
                    gone.discard(task_id)  # a worker took it meanwhile
            for raw in client.hvals(channel.unacked_key):
                gone.discard(_task_id(json.loads(raw)[0]))  # [message, exchange, routing key]
    except (OperationalError, *conn.connection_errors, *conn.channel_errors) as err:
        # Nothing withdrawn: each task exits on its first read when it comes (a stop still stops).
        log.warning("could not withdraw %d task(s) from %s: %s", len(wanted), queue, err)
        return set()
    return gone


def queue_lengths(queues) -> dict[str, int] | None:
    """{queue: tasks waiting in the broker} (kombu's Redis transport: a list per queue); None
    embedded (no broker) or when the broker does not answer."""
    from django.conf import settings

    if settings.RFTWEB_EMBEDDED:
        return None
    conn = app.connection_for_write()
    try:
        with conn:
            client = conn.default_channel.client
            return {queue: int(client.llen(queue)) for queue in queues}
    except (OperationalError, *conn.connection_errors, *conn.channel_errors) as err:
        log.warning("could not read the queue lengths: %s", err)
        return None


def _task_id(message: dict) -> str | None:
    return message.get("headers", {}).get("id")


CONTROL_TIMEOUT_S = 3.0  # a live worker answers a broadcast within milliseconds, between two tasks too


def set_consuming(worker: str, queues, consume: bool) -> bool:
    """Have Celery worker `worker` stop consuming `queues` (Flower's "cancel consumer": a message
    stays in the broker for the other workers) or consume them again. True once it answered for
    every queue; False when it did not (gone, or the broker is down), having changed what it did answer for."""
    command = app.control.add_consumer if consume else app.control.cancel_consumer
    try:
        return all(command(queue, destination=[worker], reply=True, timeout=CONTROL_TIMEOUT_S) for queue in queues)
    except OperationalError as err:
        log.warning("could not reach worker %s: %s", worker, err)
        return False
