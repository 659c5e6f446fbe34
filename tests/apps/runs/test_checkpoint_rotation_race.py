"""keep_checkpoints' rotation and a launch naming the checkpoint it rotates out, at once, on real
threads and connections: the rotation (DjangoCheckpointStore.forget, then the folder's delete, as
Checkpointing.prune_checkpoints does) either sees the new run and keeps the checkpoint, or goes
first and the launch is refused naming it. Before the rotation's check and its delete shared a
lock with the launch (checkpoints.lock_loaded), a launch between the two went through and its run
was left naming a deleted directory."""
import shutil
import threading
import time
from pathlib import Path

import pytest

from apps.runs import deletion, services
from apps.runs.models import Checkpoint, Run
from apps.runs.presets import preset_config
from apps.runs.store import DjangoCheckpointStore
from apps.runs.supervision import run_dir
from workers.rft.config import ConfigError
from workers.rft.models import resolve_model_path

pytestmark = pytest.mark.django_db(transaction=True)

# How long the rotation, paused between its check and its delete, lets a launch go through: the
# launch's transaction took 10-30 ms here once validated; a launch still waiting after this waits on
# the rotation's lock.
LAUNCH_SECONDS = 1.0


@pytest.fixture
def source(curator, tasksets, worker_queue):
    """A running run with recorded checkpoints at steps 6 and 7 (the tiny model's files)."""
    run = Run.objects.create(name="source", owner=curator, status=Run.Status.RUNNING, config={})
    for step in (6, 7):
        directory = run_dir(run) / "checkpoints" / f"step_{step}"
        shutil.copytree(resolve_model_path("tiny"), directory)
        Checkpoint.objects.create(run=run, version=step, step=step, path=str(directory))
    return run


def launch_config(run) -> dict:
    config = preset_config("quick-demo")
    config["model"]["path"] = f"runs/{run_dir(run).name}/checkpoints/step_6"
    return config


def rotate(run, step: int) -> list[int]:
    """What Checkpointing.prune_checkpoints does with the store's answer: forget, then delete."""
    directory = run_dir(run) / "checkpoints" / f"step_{step}"
    gone = DjangoCheckpointStore(run).forget({step: directory})
    for _ in gone:
        shutil.rmtree(directory)
    return gone


def left_naming_a_deleted_directory() -> list[str]:
    return [f"run {run.pk} names {run.config['model']['path']}" for run in Run.objects.exclude(name="source")
            if not Path(run.config["model"]["path"]).is_dir()]


def in_thread(target, outcome: dict, key: str) -> threading.Thread:
    from django.db import connection

    def body():
        try:
            outcome[key] = target()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome[key] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_a_launch_between_the_rotations_check_and_its_delete_is_refused(curator, source, monkeypatch):
    validated, checked, threads, outcome = threading.Event(), threading.Event(), {}, {}
    validate, loaders = services.validate_config, deletion.loaders

    def validate_then_say(config):
        parsed = validate(config)
        validated.set()
        return parsed

    def check_then_let_the_launch_through(targets, exclude=()):
        reasons = loaders(targets, exclude)
        checked.set()  # the launch starts now, after the check
        assert validated.wait(30)
        while "launch" not in threads:  # set by the test's thread just after it started the launch
            time.sleep(0.01)
        threads["launch"].join(LAUNCH_SECONDS)  # before the fix it finished here, its run naming step_6
        return reasons

    monkeypatch.setattr(services, "validate_config", validate_then_say)
    monkeypatch.setattr(deletion, "loaders", check_then_let_the_launch_through)
    rotation = in_thread(lambda: rotate(source, 6), outcome, "rotation")
    assert checked.wait(60)
    threads["launch"] = in_thread(lambda: services.launch_run(curator, "reader", launch_config(source)),
                                  outcome, "launch")
    rotation.join(60)
    threads["launch"].join(60)
    assert outcome["rotation"] == [6]
    assert isinstance(outcome["launch"], ConfigError), outcome["launch"]
    assert ("model.path: checkpoint step_6 of run %d is no longer recorded" % source.pk) in str(outcome["launch"])
    assert left_naming_a_deleted_directory() == []


def test_a_rotation_during_a_launch_keeps_the_checkpoint_the_launch_names(curator, source, monkeypatch):
    created, threads, outcome = threading.Event(), {}, {}
    create = Run.objects.create

    def create_then_wait(**fields):  # inside the launch's transaction, its locks taken
        run = create(**fields)
        created.set()
        while "rotation" not in threads:  # set by the test's thread just after `created`
            time.sleep(0.01)
        threads["rotation"].join(LAUNCH_SECONDS)  # before the fix it finished here, deleting step_6
        return run

    monkeypatch.setattr(Run.objects, "create", create_then_wait)
    launch = in_thread(lambda: services.launch_run(curator, "reader", launch_config(source)), outcome, "launch")
    assert created.wait(60)
    rotation = threads["rotation"] = in_thread(lambda: rotate(source, 6), outcome, "rotation")
    launch.join(60)
    rotation.join(60)
    assert isinstance(outcome["launch"], Run), outcome["launch"]
    assert outcome["rotation"] == []  # the reader seen: kept
    assert (run_dir(source) / "checkpoints" / "step_6").is_dir() and source.checkpoints.filter(step=6).exists()
    assert left_naming_a_deleted_directory() == []
