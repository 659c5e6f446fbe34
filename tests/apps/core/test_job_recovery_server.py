"""The embedded demo server killed (SIGKILL, its whole process group) while it imports a taskset,
then started again: the import runs again from the start and makes the taskset once; the killed
attempt's hidden taskset is gone (tests/apps/core/test_job_recovery.py has the parts)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import requests

from tests.journeys.test_newcomer import ROOT, newcomer_env
from tests.support import free_port, wait_for_port

ROWS = 20_000  # ~7 s of import on the loaded 2-core test machine (3,000 rows/s): killed after its first 500


class Server:
    """`manage.py demo --no-run` on its own data dir and SQLite file."""

    def __init__(self, tmp_path):
        self.tmp_path, self.proc, self.starts = tmp_path, None, 0
        self.env = newcomer_env(tmp_path / "data", RFTWEB_WATCHDOG_INTERVAL="2")

    def start(self) -> str:
        self.starts += 1
        port = free_port()
        log_path = self.tmp_path / f"demo-{self.starts}.log"
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "demo", f"127.0.0.1:{port}", "--no-run"],
                                         cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait_for_port(port, self.proc, log_path, timeout=180)
        return f"http://127.0.0.1:{port}"

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(90)

    def sql(self, query: str, *params) -> list[tuple]:
        with sqlite3.connect(self.tmp_path / "data" / "rftweb.sqlite3") as db:
            return db.execute(query, params).fetchall()


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path)
    try:
        yield started
    finally:
        started.kill(signal.SIGTERM)


def logged_in(base: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/accounts/login/")
    answer = session.post(f"{base}/accounts/login/", data={
        "username": "demo", "password": "demo", "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert answer.ok and "sessionid" in session.cookies, answer.text[:500]
    session.headers["X-CSRFToken"] = session.cookies["csrftoken"]
    return session


def wait(predicate, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
    return value


@pytest.mark.slow
def test_a_taskset_import_the_killed_server_left_runs_again_when_it_starts(server, tmp_path):
    upload = tmp_path / "big.jsonl"
    upload.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                              for i in range(ROWS)))
    base = server.start()
    session = logged_in(base)
    with open(upload, "rb") as file:
        answer = session.post(f"{base}/api/tasksets/", data={"name": "big"}, files={"file": file})
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]

    def hidden_with_tasks():
        rows = server.sql("SELECT t.id, count(k.id) FROM tasksets_taskset t JOIN tasksets_task k "
                          "ON k.taskset_id = t.id WHERE t.name = 'big' AND NOT t.ready GROUP BY t.id")
        return rows and rows[0][1] > 0 and rows[0]

    _, written = wait(hidden_with_tasks, 60, "the import's first batch")
    server.kill()
    status_of = "SELECT status FROM tasksets_tasksetimport WHERE id = ?"
    assert server.sql(status_of, job_id) == [("running",)] and written < ROWS, "killed in the middle of it"

    server.start()
    wait(lambda: server.sql(status_of, job_id)[0][0] not in ("pending", "running"), 60, "the import run again",
         every=0.5)

    status, error, rows_done = server.sql(
        "SELECT status, error, rows_done FROM tasksets_tasksetimport WHERE id = ?", job_id)[0]
    assert (status, error, rows_done) == ("succeeded", "", ROWS)
    assert server.sql("SELECT ready, task_count FROM tasksets_taskset WHERE name = 'big'") == [(1, ROWS)]
    assert server.sql("SELECT count(*) FROM tasksets_taskset WHERE NOT ready") == [(0,)], (
        "nothing left of the killed attempt: its hidden taskset went")
    assert server.sql("SELECT count(*) FROM tasksets_task k JOIN tasksets_taskset t ON k.taskset_id = t.id "
                      "WHERE t.name = 'big'") == [(ROWS,)]
