"""rft_run / rft_status / rft_stop: the same config file as the headless engine."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.runs.models import Run
from tests.support import taskset_with_a_task

CONFIG = """
model: {path: tiny}
algorithm: {name: grpo, repeat_times: 2}
trainer: {lr: 1e-4, total_steps: 3}
buffer: {taskset: arith}
"""


@pytest.fixture
def config_file(tmp_path, researcher, worker_queue):
    taskset_with_a_task("arith")
    path = tmp_path / "my-run.yaml"
    path.write_text(CONFIG)
    return path


def test_rft_run_launches_from_a_yaml_file(config_file, capsys):
    call_command("rft_run", str(config_file), "--owner", "res")
    run = Run.objects.get()
    assert run.name == "my-run" and run.config["trainer"]["lr"] == 1e-4 and run.status == "queued"
    assert f"launched run {run.pk}" in capsys.readouterr().out


def test_rft_run_names_the_bad_key_and_creates_nothing(config_file):
    config_file.write_text(CONFIG.replace("total_steps: 3", "total_step: 3"))
    with pytest.raises(CommandError, match=r"trainer.total_step: unknown key; did you mean 'total_steps'\?"):
        call_command("rft_run", str(config_file), "--owner", "res")
    assert not Run.objects.exists()


def test_rft_run_refuses_unknown_owner_and_missing_file(config_file, tmp_path):
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("rft_run", str(config_file), "--owner", "nobody")
    with pytest.raises(CommandError, match="no such file"):
        call_command("rft_run", str(tmp_path / "missing.yaml"), "--owner", "res")


def test_rft_status_and_stop(config_file, capsys):
    call_command("rft_run", str(config_file), "--owner", "res")
    run = Run.objects.get()
    capsys.readouterr()
    call_command("rft_status")
    assert f"run {run.pk} 'my-run': queued  trainer 0/3" in capsys.readouterr().out
    call_command("rft_stop", str(run.pk))
    run.refresh_from_db()
    assert run.status == "stopped"  # never started: stops at once
    with pytest.raises(CommandError, match="is already stopped"):
        call_command("rft_stop", str(run.pk))
    with pytest.raises(CommandError, match="no run with id 999"):
        call_command("rft_status", "999")


@pytest.mark.parametrize("jobs_round", ["looked at", "failed"])
def test_embedded_rft_run_leaves_its_run_to_the_demo_server_which_starts_it(
        transactional_db, tmp_path, researcher, settings, monkeypatch, capsys, caplog, jobs_round):
    """Embedded, a task runs on a thread of the process that sends it: rft_run's died with the
    command, and its run stayed queued for ever. The command now starts nothing; the demo server's
    watchdog round (demo.pick_up) starts the queued run on a thread of its own, even when its look
    at the jobs nobody runs fails first (it had ended the round). (Transactional: a launch sends its
    task once it commits, inside the command.)"""
    from types import SimpleNamespace

    from django.db import OperationalError

    from apps.core import jobs
    from apps.runs.management.commands import demo
    from rftweb import celery

    if jobs_round == "failed":
        def database_busy():
            raise OperationalError("database is locked")

        monkeypatch.setattr(jobs, "rerun_orphaned", database_busy)

    settings.RFTWEB_EMBEDDED = True
    threads = []
    thread = lambda target, daemon, name: threads.append(name) or SimpleNamespace(start=lambda: None)  # noqa: E731
    monkeypatch.setattr(celery, "threading", SimpleNamespace(Thread=thread))  # enqueue's threads, recorded
    taskset_with_a_task("arith")
    path = tmp_path / "my-run.yaml"
    path.write_text(CONFIG)
    call_command("rft_run", str(path), "--owner", "res")
    run = Run.objects.get()
    assert run.status == "queued" and threads == []
    assert "the demo server (make demo) starts it within 30 s" in capsys.readouterr().out
    demo.pick_up()
    run.refresh_from_db()
    assert run.status == "starting" and threads == [f"workers.tasks.serve_duty({run.pk}, 'loop')"]
    assert ("the jobs nobody runs were not looked at" in caplog.text) == (jobs_round == "failed")
