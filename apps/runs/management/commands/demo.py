"""`make demo`: set up, start a demo run, and serve the dashboard with its workers.

Embedded (no REDIS_URL): the run trains on a thread of this process, which also serves the pages,
so live updates travel through the in-memory channel layer, and threads do what beat does on the
full stack: the watchdog, which here also starts the runs left queued (`pick_up`: rft_run and
rft_resume leave theirs to this server) and re-runs the jobs a killed server left behind, the
alerts, and the buffer retention sweep (apps/buffer/retention.py) when
RFTWEB_BUFFER_RETENTION_DAYS turns it on. With REDIS_URL, a Celery worker and beat are started
beside the server and stopped with it.
"""
import ctypes
import faulthandler
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection

from apps.accounts.services import create_user
from apps.alerts import services as alerts
from apps.buffer import retention
from apps.core import hidden_imports, jobs
from apps.runs import capacity, services, supervision
from apps.runs.models import Run
from apps.runs.presets import PRESETS
from apps.tasksets.services import load_builtin_tasksets

DEMO_USER, DEMO_PASSWORD = "demo", "demo"
# How long a stop waits for the runs to reach a step boundary and save (a tiny-model step takes
# well under a second; a SmolLM2 step on CPU, ~30 s).
STOP_SECONDS = 60
DEMO_RUN = "demo: tiny model learns addition (MIX)"
logger = logging.getLogger(__name__)


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
        if "RFTWEB_BASE_URL" not in os.environ:  # alerts link to this server (its workers read it too)
            os.environ["RFTWEB_BASE_URL"] = settings.RFTWEB_BASE_URL = f"http://{addrport}"
        helpers = [] if settings.RFTWEB_EMBEDDED else self.start_workers()
        if settings.RFTWEB_EMBEDDED:  # what beat does on the full stack
            if settings.RFTWEB_BUFFER_RETENTION_DAYS:
                every(settings.RFTWEB_BUFFER_RETENTION_INTERVAL, retention.sweep, "buffer retention")
            else:  # what the sweep also does: the hidden data of imports whose process is gone
                every(settings.RFTWEB_BUFFER_RETENTION_INTERVAL, hidden_imports.delete_leftovers, "leftover imports")
            every(settings.RFTWEB_ALERT_INTERVAL, alerts.beat, "alerts")
        # SIGTERM (a service manager, `kill`) and SIGHUP (its terminal closed) stop as Ctrl-C does:
        # runserver exits, then the runs are handed back at a step boundary (below), and nothing is
        # left half done.
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGHUP, _interrupt)
        # `kill -USR1 <pid>` prints where each thread is to the log, as a Celery worker's does: what
        # an import, a page or a run thread waits on when it hangs (embedded, all are threads here).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            if not no_run:
                self.start_demo_run(user)
            if settings.RFTWEB_EMBEDDED:  # after start_demo_run's watchdog: two at once would both send on
                every(settings.RFTWEB_WATCHDOG_INTERVAL, pick_up, "watchdog")
            self.stdout.write(self.style.SUCCESS(
                f"rftweb on http://{addrport}/  (log in as {DEMO_USER} / {DEMO_PASSWORD})"
            ))
            # --noreload keeps the server in this process, beside the embedded worker thread.
            call_command("runserver", addrport, use_reloader=False)
        finally:
            self.stop(helpers)

    def stop(self, helpers: list[subprocess.Popen]) -> None:
        """Embedded: the run threads save at their next step and let their runs go (they resume
        when the server is back). Full stack: each worker's main process gets SIGTERM, a warm
        shutdown that waits for its duties to do the same (its pool processes must not get it
        too: they would die mid-step, and Celery report them lost); what is left after
        STOP_SECONDS is killed."""
        if settings.RFTWEB_EMBEDDED:
            capacity.stop_serving()
            if not supervision.wait_for_duties(STOP_SECONDS):
                self.stderr.write(f"runs still training after {STOP_SECONDS} s: stopping without them")
            return
        for proc in helpers:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for proc in helpers:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"celery {' '.join(proc.args[5:8])} still busy after {STOP_SECONDS} s: killed")
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its pool processes too, whatever is left
            except ProcessLookupError:
                pass  # the whole group has exited

    def start_demo_run(self, user) -> None:
        supervision.watchdog()  # a run left over from an earlier session continues
        active = Run.objects.exclude(status__in=Run.FINISHED).filter(name=DEMO_RUN).first()
        if active:
            self.stdout.write(f"demo run {active.pk} is {active.status}")
            return
        run = services.launch_run(user, DEMO_RUN, PRESETS["quick-demo"].config)
        self.stdout.write(f"started demo run {run.pk}")

    def start_workers(self) -> list[subprocess.Popen]:
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)  # beat's schedule file goes there: it died without
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
        host = socket.gethostname()  # what %h becomes
        capacity.workers_starting({"train": [f"train@{host}"], "explore": [f"explore@{host}"],
                                   "default": [f"jobs@{host}"]})
        return [subprocess.Popen(c, start_new_session=True, preexec_fn=_stop_with_parent(os.getpid()))
                for c in commands]


def pick_up() -> None:
    """Embedded, beat's watchdog (every RFTWEB_WATCHDOG_INTERVAL seconds): start the runs left
    queued, which no thread of any process will start (rft_run and rft_resume leave theirs to this
    server: rftweb.celery.serve_here), and send on the duties whose thread is gone with its
    process (supervision.watchdog: an `rft_run --wait` stopped with Ctrl-C), and run again the jobs
    nobody runs (jobs.rerun_orphaned: an import this server's killed predecessor left running). Not
    while this server stops: its runs are handed back for its next start."""
    if capacity.node_stopping(None):
        return
    try:
        jobs.rerun_orphaned()
    except Exception:  # a busy SQLite's "database is locked": the runs' part of the round goes on all the same
        logger.exception("watchdog: the jobs nobody runs were not looked at; the next round looks again")
    for run_id in Run.objects.filter(status=Run.Status.QUEUED).values_list("pk", flat=True):
        supervision.start_run(run_id)  # one another thread started meanwhile is left as it is
    supervision.watchdog()


def every(seconds: float, work, what: str) -> None:
    """Embedded, a beat entry: `work` now and every `seconds` while the server runs, on a daemon
    thread (it ends with the process)."""
    threading.Thread(target=repeat, args=(seconds, work, what), daemon=True, name=what).start()


def repeat(seconds: float, work, what: str) -> None:
    while True:
        try:
            work()
        except Exception:  # noqa: BLE001 - logged; the next round tries again, the server goes on
            logger.exception("%s failed", what)
        finally:
            connection.close()  # this thread's own: it would otherwise stay open between rounds
        time.sleep(seconds)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with_parent(parent: int):
    """For a worker, before it runs: SIGTERM (an orderly stop) when the demo's process dies, however
    it dies (Linux's PR_SET_PDEATHSIG). In a session of its own (Ctrl-C must reach the demo alone),
    a worker outlived a demo killed with SIGKILL; started again, the demo ran a second worker of
    each name, and the leftovers took tasks from its queues."""
    def arm():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl (not Linux): stopped by the demo's own stop only
            return
        if os.getppid() != parent:  # the demo died before the call: the signal would never come
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # runserver's own way out, as for Ctrl-C
