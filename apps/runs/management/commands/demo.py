"""`make demo`: set up, start a demo run, and serve the dashboard with its workers.

Embedded (no REDIS_URL): the run trains on a thread of this process, which also serves the pages,
so live updates travel through the in-memory channel layer. With REDIS_URL, a Celery worker and
beat are started beside the server and stopped with it.
"""
import os
import signal
import subprocess
import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from apps.accounts.services import create_user
from apps.runs import services, supervision
from apps.runs.models import Run
from apps.runs.presets import PRESETS
from apps.tasksets.services import load_builtin_tasksets

DEMO_USER, DEMO_PASSWORD = "demo", "demo"
DEMO_RUN = "demo: tiny model learns addition (MIX)"


class Command(BaseCommand):
    help = "Migrate, load the built-in tasksets, start the demo run and serve rftweb with its workers."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--no-run", action="store_true", help="do not start the demo run")

    def handle(self, addrport, no_run, **_):
        call_command("migrate", interactive=False, verbosity=0)
        for name, created in load_builtin_tasksets():
            self.stdout.write(f"taskset {name}: {'created' if created else 'present'}")
        user = get_user_model().objects.filter(username=DEMO_USER).first()
        if user is None:
            user = create_user(DEMO_USER, DEMO_PASSWORD, is_superuser=True)
        helpers = [] if settings.RFTWEB_EMBEDDED else self.start_workers()
        try:
            if not no_run:
                self.start_demo_run(user)
            self.stdout.write(self.style.SUCCESS(
                f"rftweb on http://{addrport}/  (log in as {DEMO_USER} / {DEMO_PASSWORD})"
            ))
            # --noreload keeps the server in this process, beside the embedded worker thread.
            call_command("runserver", addrport, use_reloader=False)
        finally:
            for proc in helpers:
                os.killpg(proc.pid, signal.SIGTERM)

    def start_demo_run(self, user) -> None:
        supervision.watchdog()  # a run left over from an earlier session continues
        active = Run.objects.exclude(status__in=Run.FINISHED).filter(name=DEMO_RUN).first()
        if active:
            self.stdout.write(f"demo run {active.pk} is {active.status}")
            return
        run = services.launch_run(user, DEMO_RUN, PRESETS["quick-demo"].config)
        self.stdout.write(f"started demo run {run.pk}")

    def start_workers(self) -> list[subprocess.Popen]:
        celery = [sys.executable, "-m", "celery", "-A", "rftweb"]
        commands = [
            # A run's duties hold a worker process each for the run's whole life, so each queue gets
            # workers of its own: with one process for everything an import waited until the demo
            # run's 1,000 steps were done, and with 2 processes for train and explore together a
            # 2-explorer run beside the demo run (trainer + 2 explorers, the demo's loop holding
            # one) waited for good. 2 train slots: the demo's loop and another run's trainer; 2
            # explore slots: that run's explorers (the Workers page shows what each holds).
            celery + ["worker", "-n", "train@%h", "-Q", "train", "-c", "2", "-l", "info"],
            celery + ["worker", "-n", "explore@%h", "-Q", "explore", "-c", "2", "-l", "info"],
            celery + ["worker", "-n", "jobs@%h", "-Q", "default", "-c", "1", "-l", "info"],
            celery + ["beat", "-l", "info", "-s", str(settings.DATA_DIR / "celerybeat-schedule")],
        ]
        return [subprocess.Popen(c, start_new_session=True) for c in commands]
