"""rft_run / rft_status / rft_stop: the same config file as the headless engine."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.runs.models import Run
from apps.tasksets.models import Taskset

CONFIG = """
model: {path: tiny}
algorithm: {name: grpo, repeat_times: 2}
trainer: {lr: 1e-4, total_steps: 3}
buffer: {taskset: arith}
"""


@pytest.fixture
def config_file(tmp_path, researcher, worker_queue):
    Taskset.objects.create(name="arith")
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
