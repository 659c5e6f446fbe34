"""A run's log (apps/runs/logs.py): each duty keeps the lines its own threads log, never another
run's served in the same process; the files stay bounded; a read puts errors and warnings first;
no secret reaches a line; the run page's JSON (run-logs) checks what it is asked."""
import json
import logging
import threading

import pytest
from django.conf import settings
from django.urls import reverse

from apps.runs import failures, logs, supervision
from apps.runs.logs import DutyLog
from apps.runs.models import Run

log = logging.getLogger("workers.rft.test_probe")


def serve_in_thread(work_dir, run_id, duty, lines, started: threading.Barrier, **options):
    """A thread serving (run_id, duty): it logs `lines` and starts a helper thread (as the loop
    starts its explorer thread) that logs too, in step with the other serving thread."""

    def helper():
        log.info("run %s: from the %s explorer thread", run_id, duty)

    def body():
        with DutyLog(work_dir, run_id, duty, **options):
            started.wait()
            for line in lines:
                log.info(line)
            child = threading.Thread(target=helper, name="rft-explorer")
            child.start()
            child.join()
            started.wait()

    thread = threading.Thread(target=body, name=f"serve-{run_id}-{duty}")
    thread.start()
    return thread


def messages(work_dir, **options) -> list[str]:
    return [line["message"] for line in logs.read(work_dir, **options)["lines"]]


def test_two_runs_served_in_threads_of_one_process_keep_their_own_lines(tmp_path):
    first, second = tmp_path / "run-1", tmp_path / "run-2"
    together = threading.Barrier(2)  # both serve at once: each hears the other's lines, and must drop them
    threads = [
        serve_in_thread(first, 1, "loop", [f"run 1 line {i}" for i in range(20)], together),
        serve_in_thread(second, 2, "loop", [f"run 2 line {i}" for i in range(20)], together),
    ]
    log.warning("the process's own line, served by no duty")
    for thread in threads:
        thread.join()
    log.info("after the duties ended")

    for run_id, work_dir in ((1, first), (2, second)):
        lines = logs.read(work_dir)["lines"]
        assert sorted(line["message"] for line in lines) == sorted(
            [f"run {run_id} line {i}" for i in range(20)] + [f"run {run_id}: from the loop explorer thread"]
        )
        assert {line["duty"] for line in lines} == {"loop"}
        assert [line["thread"] for line in lines if "explorer thread" in line["message"]] == ["rft-explorer"]
    assert logging.getLogger().handlers == [h for h in logging.getLogger().handlers if not isinstance(h, DutyLog)]


def test_duties_of_one_run_each_write_their_file_and_a_read_merges_them(tmp_path):
    together = threading.Barrier(2)
    threads = [serve_in_thread(tmp_path, 7, duty, [f"{duty} says hi"], together) for duty in ("explorer", "trainer")]
    for thread in threads:
        thread.join()
    assert sorted(path.name for path in (tmp_path / "logs").iterdir()) == ["explorer.jsonl", "trainer.jsonl"]
    found = logs.read(tmp_path)
    assert found["duties"] == ["explorer", "trainer"]
    assert {"explorer says hi", "trainer says hi"} <= set(messages(tmp_path))


def test_what_a_celery_worker_prints_is_info_and_its_progress_bars_are_left_out(tmp_path):
    """Celery logs a worker's stdout and stderr at WARNING on `celery.redirected`; the full-stack walk
    found 30 "warnings" in a minute, all frames of transformers' "Writing model shards" bar."""
    printed = logging.getLogger(logs.REDIRECTED)
    with DutyLog(tmp_path, 7, "trainer"):
        printed.warning("Writing model shards:  40%|####      | 2/5 [00:00<00:00, 72.95it/s]")
        printed.warning("step 3: loss 0.5")
        logging.getLogger("workers.rft.loop").warning("a real warning")

    found = logs.read(tmp_path)
    assert [(line["level"], line["message"]) for line in found["lines"]] == [
        ("WARNING", "a real warning"), ("INFO", "step 3: loss 0.5")
    ]


def test_a_worker_whose_console_prints_warnings_only_still_logs_its_duties_info_lines(tmp_path):
    """Celery sets the root logger to its `-l` level, WARNING unless told: a train worker started
    the README's way took a duty handed over to it and wrote none of its info lines ("resumed
    from checkpoint v70"), so the Logs panel showed nothing from it. Its console still prints what
    it printed."""
    import io

    root = logging.getLogger()
    console = logging.StreamHandler(io.StringIO())
    before = root.level, {handler: handler.level for handler in root.handlers}
    root.addHandler(console)
    root.setLevel(logging.WARNING)  # what `celery -A rftweb worker` does
    try:
        with DutyLog(tmp_path, 3, "loop"):
            log.info("run 3 (loop): resumed from checkpoint v70 (trainer step 70)")
            log.warning("run 3 (loop): a warning")
        log.info("the worker's own info line, after the duty")
    finally:
        root.removeHandler(console)
        root.setLevel(before[0])
        for handler, level in before[1].items():
            handler.setLevel(level)
    assert messages(tmp_path) == ["run 3 (loop): a warning",
                                  "run 3 (loop): resumed from checkpoint v70 (trainer step 70)"]
    assert console.stream.getvalue() == "run 3 (loop): a warning\n"


def test_a_duty_serving_when_the_server_loads_its_asgi_application_keeps_its_lines(tmp_path):
    """`manage.py demo` starts the demo run's duty on a thread, then runserver loads rftweb.asgi
    (daphne's get_application). Loading it set Django up again, whose logging config dropped the
    root logger's handlers, the duty's DutyLog among them: under CI's load the run's thread opened
    its log first, and its Logs panel showed no line for the run's whole life."""
    import sys

    from daphne.management.commands.runserver import Command as Runserver

    import rftweb

    root = logging.getLogger()
    before = sys.modules.pop("rftweb.asgi", None), root.handlers[:], root.level
    try:
        with DutyLog(tmp_path, 1, "loop"):
            Runserver().get_application({})  # a fresh import of the module, as the server's first
            log.info("rollout engine: transformers")
    finally:
        if before[0] is not None:
            sys.modules["rftweb.asgi"] = rftweb.asgi = before[0]
        root.handlers[:], root.level = before[1], before[2]
    assert messages(tmp_path) == ["rollout engine: transformers"]


def test_a_duty_log_stays_bounded_and_keeps_its_newest_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "MAX_FILE_BYTES", 4000)
    with DutyLog(tmp_path, 1, "loop"):
        for i in range(500):
            log.info("line %s %s", i, "x" * 40)
        log.info("y" * 50_000)  # one huge line is cut, not kept whole
    files = sorted((tmp_path / "logs").iterdir())
    assert [path.name for path in files] == ["loop.jsonl", "loop.jsonl.1"]
    assert all(path.stat().st_size <= 4000 + logs.MAX_MESSAGE_CHARS + 500 for path in files)
    shown = messages(tmp_path)
    assert shown[0].startswith("y" * logs.MAX_MESSAGE_CHARS) and shown[0].endswith("characters cut]")
    assert shown[1].startswith("line 499 ")  # then the newest first
    assert not any(text.startswith("line 0 ") for text in shown)  # the oldest went with the rotation
    assert len(shown) < 200


def test_a_read_shows_errors_then_warnings_then_the_newest_lines_and_folds_a_traceback(tmp_path):
    with DutyLog(tmp_path, 1, "trainer"):
        log.info("first")
        log.warning("a warning")
        try:
            raise RuntimeError("CUDA out of memory")
        except RuntimeError:
            log.exception("run 1 (trainer) failed")
        log.info("last")
        log.debug("below the root's level: never made")
    found = logs.read(tmp_path)
    assert [line["message"] for line in found["lines"]] == ["run 1 (trainer) failed", "a warning", "last", "first"]
    failed = found["lines"][0]
    assert failed["level"] == "ERROR" and "RuntimeError: CUDA out of memory" in failed["traceback"]
    assert "traceback" not in found["lines"][1]
    assert found["counts"] == {"INFO": 2, "WARNING": 1, "ERROR": 1}
    assert messages(tmp_path, level="warning") == ["run 1 (trainer) failed", "a warning"]
    assert messages(tmp_path, level="error") == ["run 1 (trainer) failed"]
    assert messages(tmp_path, limit=2) == ["run 1 (trainer) failed", "a warning"]
    with pytest.raises(ValueError, match="unknown log level 'loud': one of debug, info, warning, error"):
        logs.read(tmp_path, level="loud")


def test_a_line_cut_short_by_a_dying_worker_is_skipped(tmp_path):
    with DutyLog(tmp_path, 1, "loop"):
        log.info("whole")
    with open(tmp_path / "logs" / "loop.jsonl", "a") as file:
        file.write('{"time": 1, "level": "INFO", "mess')
    assert messages(tmp_path) == ["whole"]


def test_no_secret_reaches_a_line(tmp_path, settings):
    run_secret = "s3cr3t-of-the-run-4f9a"
    settings.DATABASES["default"] = {**settings.DATABASES["default"], "PASSWORD": "db-pass-123"}
    with DutyLog(tmp_path, 1, "loop", secrets=[run_secret]):
        log.info("joining with secret %s", run_secret)
        log.info("signing key %s", settings.SECRET_KEY)
        log.warning("connect failed: password=hunter22 user=bob; api_key: 'AKIA1234'")
        log.warning('{"token": "tok-abcdef", "step": 3}')
        log.info("header Authorization: Bearer eyJhbGciOi.x.y")
        log.info("redis://:redispass@cache:6379/0 and postgres://app:db-pass-123@db/rftweb")
        try:
            raise ValueError(f"rank 1 sent {run_secret}")
        except ValueError:
            log.exception("handshake failed")
    written = (tmp_path / "logs" / "loop.jsonl").read_text()
    for secret in (run_secret, settings.SECRET_KEY, "hunter22", "AKIA1234", "tok-abcdef", "eyJhbGciOi", "redispass",
                   "db-pass-123"):
        assert secret not in written, secret
    lines = [json.loads(text) for text in written.splitlines()]
    assert lines[0]["message"] == "joining with secret [redacted]"
    assert lines[2]["message"] == "connect failed: password=[redacted] user=bob; api_key: '[redacted]'"
    assert lines[3]["message"] == '{"token": "[redacted]", "step": 3}'
    assert "ValueError: rank 1 sent [redacted]" in lines[-1]["traceback"]


def test_server_paths_are_cut_as_in_the_run_error(tmp_path):
    with DutyLog(tmp_path, 1, "loop", clean=failures.without_server_paths):
        log.warning("could not read %s", settings.BASE_DIR / "workers" / "rft" / "loop.py")
    assert messages(tmp_path) == ["could not read <rftweb>/workers/rft/loop.py"]


# ---- the page's JSON ----------------------------------------------------------------------------


@pytest.fixture
def logged_run(make_run):
    run = make_run("logged", status=Run.Status.RUNNING)
    with DutyLog(supervision.run_dir(run), run.pk, "loop"):
        log.info("explorer step 1")
        log.error("reward fn raised")
    return run


def test_the_run_logs_json_answers_errors_first(researcher_client, logged_run):
    response = researcher_client.get(reverse("run-logs", args=[logged_run.pk]))
    assert response.status_code == 200 and response["Cache-Control"].startswith("max-age=0")
    body = response.json()
    assert [line["message"] for line in body["lines"]] == ["reward fn raised", "explorer step 1"]
    assert body["active"] is True and body["status"] == "running" and body["duties"] == ["loop"]
    warned = researcher_client.get(reverse("run-logs", args=[logged_run.pk]), {"level": "warning"}).json()
    assert [line["message"] for line in warned["lines"]] == ["reward fn raised"]


@pytest.mark.parametrize("query, error", [
    ({"level": "verbose"}, "unknown log level 'verbose': one of debug, info, warning, error"),
    ({"limit": "0"}, "limit must be a whole number from 1 to 2000"),
    ({"limit": "lots"}, "limit must be a whole number from 1 to 2000"),
])
def test_the_run_logs_json_refuses_a_bad_query_naming_it(researcher_client, logged_run, query, error):
    response = researcher_client.get(reverse("run-logs", args=[logged_run.pk]), query)
    assert response.status_code == 400 and response.json() == {"error": error}


def test_a_run_that_never_logged_has_no_lines(researcher_client, make_run):
    body = researcher_client.get(reverse("run-logs", args=[make_run("quiet").pk])).json()
    assert body["lines"] == [] and body["counts"] == {} and body["active"] is True
