"""The Celery app, and `enqueue`: the one way the project sends work to a worker.

Services enqueue by task *name*, so no services module imports a tasks module (which imports the
services back): the import graph has no circles.
"""
import os
import threading
from importlib import import_module

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

app = Celery("rftweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # apps/*/tasks.py
app.autodiscover_tasks(["workers"])  # workers/tasks.py


def enqueue(name: str, *args, queue: str = "default") -> None:
    """Send task `name` (its dotted path, e.g. "workers.tasks.start_run") to `queue`. Embedded (no
    REDIS_URL) it runs on a thread of this process, which is then the worker: its live updates
    reach this process's in-memory channel layer."""
    from django.conf import settings
    from django.db import connection

    module, _, attr = name.rpartition(".")
    task = getattr(import_module(module), attr)  # at call time: the tasks module imports the services
    if not settings.RFTWEB_EMBEDDED:
        task.apply_async(args, queue=queue)
        return

    def work():
        try:
            task(*args)
        finally:
            connection.close()

    threading.Thread(target=work, daemon=True, name=f"{name}{args}").start()
