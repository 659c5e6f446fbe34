"""What test modules share: the environment of the processes they start (Celery workers, daphne,
beat) on the test database and Redis, those processes (Stack), and polling for a condition."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]


def database_url() -> str:
    """The URL of this test's database, for a process the test starts: on SQLite its file (Celery
    workers and daphne share it with the test, as `make demo`'s with REDIS_URL do), not a Postgres
    URL naming the file."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    credentials = db["USER"] + (f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else "")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{db['HOST']}{port}/{db['NAME']}"  # no host: the Unix socket, as here


def service_env(**overrides) -> dict:
    """os.environ plus what a started process needs to reach this test's database, Redis and data dir."""
    from django.conf import settings

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "rftweb.test_settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "RFTWEB_DATA_DIR": str(settings.DATA_DIR),
        "RFTWEB_HEARTBEAT_INTERVAL": str(settings.RFTWEB_HEARTBEAT_INTERVAL),
        "RFTWEB_HEARTBEAT_TIMEOUT": str(settings.RFTWEB_HEARTBEAT_TIMEOUT),
        **overrides,
    }


def read_elsewhere(sql: str, params) -> tuple:
    """One row, read through a database connection of its own: what another process (a trainer,
    a job's page) would see of the test's commits."""
    from django.db import DEFAULT_DB_ALIAS, connections

    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    finally:
        other.close()


def watch_progress(monkeypatch, look) -> list:
    """Every progress write of the jobs run from now on (jobs.progress_writer, each write shown at
    once) followed by look(job): the list of what look returned, one item a write."""
    from contextlib import contextmanager

    from apps.core import jobs

    seen, real_writer = [], jobs.progress_writer

    @contextmanager
    def observed(job):
        with real_writer(job) as write:

            def write_and_look(rows_done, bytes_done=None):
                write(rows_done, bytes_done)
                seen.append(look(job))

            yield write_and_look

    monkeypatch.setattr(jobs, "PROGRESS_INTERVAL_SECONDS", 0)
    monkeypatch.setattr(jobs, "progress_writer", observed)
    return seen


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    """Wait until the server `proc` accepts connections on 127.0.0.1:`port`; raise with its log
    if it exits first or takes longer than `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server did not accept connections on port {port} in {timeout:.0f}s:\n{log.read_text()}")


def wait_for(predicate, timeout=300, what="condition", every=0.5):
    """The predicate's first truthy value, polled every `every` seconds; fails after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def websocket_connects(path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the real ASGI app accepts a websocket handshake at `path` with these headers."""
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from rftweb.asgi import application

    async def scenario():
        ws = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await ws.connect(timeout=10)
        if connected:
            await ws.disconnect()
        return connected

    return async_to_sync(scenario)()


@contextmanager
def command_importing(holder):
    """A live process of this machine, recorded as the command filling the hidden `holder` (an expert
    dataset, a taskset: ready False), as manage.py import_expert_data and import_taskset record
    theirs (apps.core.hidden_imports). Kill it and wait for it to leave the holder as a killed
    command does; killed at the end either way."""
    import psutil
    from django.utils import timezone

    from apps.core import job_owners
    from apps.core.models import JobOwner

    proc = subprocess.Popen(["sleep", "600"])
    try:
        JobOwner.objects.create(job_label=holder._meta.label_lower, job_id=holder.pk, host=socket.gethostname(),
                                pid=proc.pid, process_started=psutil.Process(proc.pid).create_time(),
                                pid_namespace=job_owners.pid_namespace(), since=timezone.now())
        yield proc
    finally:
        proc.kill()
        proc.wait()


def make_taskset(name="arith", n=40):
    """A taskset of `n` small arithmetic tasks (datasets.generate)."""
    from apps.tasksets.models import Task, Taskset
    from workers.rft import datasets

    taskset = Taskset.objects.create(name=name, task_count=n)
    Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=row["prompt"], answer=row["answer"], metadata=row["metadata"])
        for i, row in enumerate(datasets.generate("arithmetic", n, seed=0, max_operand=9))
    )



class Stack:
    """The Celery worker and beat processes of one test, started as an operator starts them, on
    the test database and Redis (the `stack` fixture of tests/journeys kills what is left)."""

    def __init__(self, tmp_path: Path, **env):
        self.tmp_path, self.env, self.procs = tmp_path, service_env(RFTWEB_WATCHDOG_INTERVAL="2", **env), []
        self.logs: dict[int, Path] = {}  # pid -> its log

    def start(self, *args, ready: str) -> subprocess.Popen:
        log_path = self.tmp_path / f"{args[0]}-{uuid.uuid4().hex[:6]}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "rftweb", *args], cwd=ROOT, env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.logs[proc.pid] = log_path
        wait_for(lambda: ready in log_path.read_text() or proc.poll() is not None, timeout=90, what=f"celery {args[0]}")
        assert proc.poll() is None, log_path.read_text()
        return proc

    def worker(self, queues: str = "default,train,explore", slots: int = 1, name: str = "",
               loglevel: str | None = "info") -> subprocess.Popen:
        """loglevel None: without `-l`, as the README starts one (Celery's WARNING: its console says
        nothing of its tasks, "ready." included; it is ready once it has registered)."""
        from apps.runs.models import Worker

        name = name or f"{queues.split(',')[0]}-{uuid.uuid4().hex[:8]}@localhost"
        level = ["-l", loglevel] if loglevel else []
        proc = self.start("worker", "-Q", queues, "-c", str(slots), "-n", name, "--without-gossip",
                          "--without-mingle", *level, ready="ready." if loglevel else "[queues]")
        if not loglevel:
            wait_for(lambda: Worker.objects.filter(name=name).exists(), timeout=90, what=f"worker {name} registered")
        return proc

    def beat(self) -> subprocess.Popen:
        return self.start("beat", "-s", str(self.tmp_path / "beat-schedule"), "-l", "info", ready="beat: Starting")

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def migrate_to(target: tuple[str, str]):
    """The database at one app's migration (app, name); the apps (historical models) as they were there."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    return executor.loader.project_state([target]).apps


def migrate_to_newest() -> None:
    """Every app at its newest migration, as the tests after a migration test expect: migrating one
    app backwards also unapplies the migrations of other apps that depend on it (the buffer's taking
    feedback's 0004 with it), which migrating that one app forwards again does not reapply."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def api_launcher(user, default_name: str = "launched"):
    """post(config, name=default_name): a launch through the API as a script sends it (the user's
    bearer token, CSRF checks on), answering the response."""
    import json

    from django.test import Client
    from django.urls import reverse

    from apps.runs.api import token_for

    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")

    def post(config, name=default_name):
        return client.post(reverse("api-runs"), json.dumps({"name": name, "config": config}),
                           content_type="application/json")

    return post


def browser_client(user):
    """A logged-in client as a browser posts, answering 500s instead of raising them."""
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def forget_login_failures() -> None:
    """Clear the login throttle's counts (apps.accounts.throttle) in the tests' cache: a wrong
    password typed by an earlier test from the test client's 127.0.0.1 counts for 15 minutes, and
    every attempt counts before its password is checked, so a test with small limits started locked."""
    from django.core.cache import cache

    from apps.accounts.throttle import PREFIX

    client = getattr(cache, "_cache", None)
    if client is None or not hasattr(client, "get_client"):
        cache.clear()  # the in-process cache: its own, nothing else in it matters
        return
    redis_client = client.get_client(write=True)
    for key in redis_client.scan_iter(match=f"*{PREFIX}:*"):
        redis_client.delete(key)


def daphne_command(port: int, interface: str = "127.0.0.1") -> list[str]:
    """daphne serving rftweb.asgi as docker/Dockerfile starts it. A listen backlog of 1024: Twisted's
    default is 50 pending connections, and 200 feedback posts at once on a loaded 2-core machine
    overflowed it (18 of /proc/net/netstat's ListenOverflows in one run: dropped handshakes, retried a
    second or more later). A websocket handshake may take 30 s: daphne's 5 s dropped 33 of 100 sockets
    opening at once while CI loaded the machine (they all opened within 1.1 s on it alone)."""
    return [sys.executable, "-m", "daphne", "-e", f"tcp:port={port}:interface={interface}:backlog=1024",
            "--websocket_connect_timeout", "30", "rftweb.asgi:application"]


def on_another_connection(work, wait_seconds: float = 5):
    """What work() returns, run on a thread with its own database connection, or raise if it took
    longer than `wait_seconds` (it waited for an import's write lock: the other connection's write
    takes milliseconds, SQLite's busy timeout is 30 s)."""
    from django.db import connection

    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(wait_seconds)
    assert not thread.is_alive(), f"the other connection waited over {wait_seconds} s for the import's write lock"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def run_cancelled_after_two_batches(monkeypatch, job_label: str, job) -> tuple:
    """Run an import job, cancelled from another connection (as a person's Cancel) once it has
    committed two batches. Returns (the ended job, rows_done as the canceller read it, whether the
    cancel was taken, how many cancel checks the runner made: 3 when it stopped at the first check
    after the cancel)."""
    from django.apps import apps

    from apps.core import jobs

    model = apps.get_model(job_label)
    checks, seen = [], []
    stop_if_cancelled = jobs.stop_if_cancelled

    def cancel_after_two_batches(running):
        checks.append(running.pk)
        if len(checks) == 3:  # the runner's check before it starts, then after the first two batches
            def look_and_cancel():
                saved = model.objects.get(pk=running.pk)
                return saved.rows_done, jobs.cancel_job(saved).cancel_requested_at is not None

            seen.append(on_another_connection(look_and_cancel))
        stop_if_cancelled(running)

    monkeypatch.setattr(jobs, "stop_if_cancelled", cancel_after_two_batches)
    ended = jobs.run_job(job_label, job.pk)
    rows_saved, cancelled = seen[0]
    return ended, rows_saved, cancelled, len(checks)


def owner_died(job) -> None:
    """The process recorded as running `job` (apps/core/job_owners.py) has exited, as a killed
    worker's has: a test's Killed exception out of run_job leaves this live process its owner, and
    run_job leaves a job that a live process runs to it (a redelivery beside it)."""
    from apps.core import jobs
    from apps.core.models import JobOwner

    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    JobOwner.objects.filter(job_label=jobs.label(job), job_id=job.pk).update(pid=exited.pid)


def leftovers_queued(monkeypatch) -> list[str]:
    """The tasks an import's name check queues to delete the leftovers it set aside
    (apps.core.hidden_imports): recorded here, for the test to run, not sent to a broker."""
    from apps.core import hidden_imports

    queued = []
    monkeypatch.setattr(hidden_imports, "enqueue", lambda name, *args, **options: queued.append(name))
    return queued


def taskset_with_a_task(name: str, **fields):
    """A taskset a run may name: a launch refuses one with no tasks (runs.services.taskset_issues)."""
    from apps.tasksets.models import Task, Taskset

    taskset = Taskset.objects.create(name=name, task_count=1, **fields)
    Task.objects.create(taskset=taskset, index=0, prompt="What is 1 + 1?", answer="2")
    return taskset
