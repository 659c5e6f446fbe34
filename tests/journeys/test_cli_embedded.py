"""A researcher beside the embedded demo (`make demo` without DATABASE_URL / REDIS_URL) launches and
resumes runs from the command line, as the README's "Runs" shows: `manage.py rft_run` and
`rft_resume` without `--wait` return at once and the demo server trains the run; `--wait` with no
server running trains it in the command.

Embedded, a task runs on a thread of the process that sends it: the command's thread died with the
command, and a run launched without --wait stayed queued for ever (nothing sends a duty no worker
claimed again). The server now starts the runs left queued (demo.pick_up). On SQLite, the embedded
default, and on Postgres (DATABASE_URL without REDIS_URL)."""
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from tests.journeys.test_newcomer import ADMIN_DB, ROOT, newcomer_env
from tests.support import free_port, wait_for_port

CONFIG = """
model: {path: tiny}
algorithm: {name: grpo, repeat_times: 2}
explorer: {batch_size: 2, max_new_tokens: 4, use_chat_template: false}
trainer: {total_steps: 3}
buffer: {taskset: addition}
"""
PICK_UP_S = 2  # RFTWEB_WATCHDOG_INTERVAL: how often the server looks for queued runs


def manage(env, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def status_of(env, run_id: int) -> tuple:
    query = "SELECT status, trainer_step, error FROM runs_run WHERE id = %s"
    if "DATABASE_URL" in env:
        with psycopg.connect(env["DATABASE_URL"]) as db:
            return db.execute(query, (run_id,)).fetchone()
    with sqlite3.connect(f"{env['RFTWEB_DATA_DIR']}/rftweb.sqlite3") as db:
        return db.execute(query.replace("%s", "?"), (run_id,)).fetchone()


def wait_for_status(env, run_id: int, wanted: str, timeout: float = 180) -> tuple:
    deadline = time.monotonic() + timeout
    while (row := status_of(env, run_id))[0] != wanted:
        assert row[0] != "failed", row
        assert time.monotonic() < deadline, f"run {run_id} is {row} after {timeout:.0f} s, not {wanted}"
        time.sleep(1)
    return row


@pytest.fixture(params=["sqlite", "postgres"])
def embedded(request, tmp_path):
    """The embedded demo server (no REDIS_URL; no demo run) on SQLite or on a Postgres database of
    its own, and the environment its commands share."""
    env = newcomer_env(tmp_path / "data", RFTWEB_WATCHDOG_INTERVAL=str(PICK_UP_S))
    database = None
    if request.param == "postgres":
        database = f"rftweb_cli_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(ADMIN_DB, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        env["DATABASE_URL"] = f"postgres://postgres@localhost:5432/{database}"
    port = free_port()
    log_path = tmp_path / "demo.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "manage.py", "demo", f"127.0.0.1:{port}", "--no-run"], cwd=ROOT,
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, server, log_path, timeout=180)
        (tmp_path / "sums.yaml").write_text(CONFIG)
        yield env, server, tmp_path / "sums.yaml"
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(90)
            except subprocess.TimeoutExpired:
                server.kill()
        if database is not None:
            with psycopg.connect(ADMIN_DB, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.mark.slow
def test_runs_launched_and_resumed_from_the_command_line_train_on_the_embedded_server(embedded):
    env, server, config = embedded
    launched = manage(env, "rft_run", str(config), "--owner", "demo")
    assert launched.returncode == 0, launched.stderr
    assert "launched run 1 (sums)" in launched.stdout
    assert "the demo server (make demo) starts it" in launched.stdout
    assert wait_for_status(env, 1, "completed")[1] == 3

    longer = config.with_name("longer.yaml")
    longer.write_text(CONFIG.replace("total_steps: 3", "total_steps: 1000"))
    second = manage(env, "rft_run", str(longer), "--owner", "demo")
    assert second.returncode == 0, second.stderr
    wait_for_status(env, 2, "running")
    assert manage(env, "rft_stop", "2").returncode == 0
    stopped_at = wait_for_status(env, 2, "stopped")[1]
    resumed = manage(env, "rft_resume", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "the demo server (make demo) starts it" in resumed.stdout
    wait_for_status(env, 2, "running")
    deadline = time.monotonic() + 120
    while status_of(env, 2)[1] <= stopped_at:  # it trains on
        assert time.monotonic() < deadline, status_of(env, 2)
        time.sleep(1)
    assert manage(env, "rft_stop", "2").returncode == 0
    wait_for_status(env, 2, "stopped")

    # With no server running, --wait trains the run in the command itself, once no server took it.
    server.send_signal(signal.SIGTERM)
    server.wait(90)
    alone = manage(env, "rft_run", str(config), "--owner", "demo", "--name", "alone", "--wait", timeout=300)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "no demo server started run 3" in alone.stdout
    assert status_of(env, 3)[:2] == ("completed", 3)
