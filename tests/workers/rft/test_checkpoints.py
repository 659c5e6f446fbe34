"""When the loop saves checkpoints (every trainer.save_interval steps, every trainer.save_interval_s
seconds, at a step the run can resume from) and how many it keeps (trainer.keep_checkpoints)."""
import pytest

from workers.rft.loop import Loop
from workers.rft.memory import memory_stores

from .conftest import make_config

pytestmark = pytest.mark.usefixtures("data_dir")


def build(tmp_path, seconds_per_step=100.0, **trainer):
    """A loop whose clock says each trainer step took `seconds_per_step`."""
    config = make_config(trainer={"total_steps": 5, "save_interval": 0, "save_interval_s": 0, **trainer})
    return build_from(config, tmp_path, seconds_per_step)


def build_from(config, tmp_path, seconds_per_step=100.0, stores=None):
    stores = stores or memory_stores(config)
    trained = lambda: sum(role == "trainer" for role, _ in stores.metrics.points)  # noqa: E731
    return Loop(config, stores, tmp_path, clock=lambda: seconds_per_step * trained()), stores


def saved_steps(tmp_path) -> list[int]:
    return sorted(int(path.name.removeprefix("step_")) for path in (tmp_path / "checkpoints").iterdir())


def recorded_steps(stores) -> list[int]:
    return [step for _, step, _ in stores.checkpoints.records]


def test_every_save_interval_steps_and_at_the_end_keeping_the_newest(tmp_path):
    loop, stores = build(tmp_path, save_interval=2, keep_checkpoints=2)
    assert loop.run() == "completed"
    assert saved_steps(tmp_path) == [4, 5]  # 2, 4 and the end (5); step 2 pruned
    assert recorded_steps(stores) == [4, 5]  # its record went with it: no listed checkpoint without files


def test_a_checkpoint_the_store_keeps_is_not_deleted_and_is_asked_about_again(tmp_path):
    """The web app's store keeps one that another run loads a model from (apps.runs.store)."""
    loop, stores = build(tmp_path, save_interval=1, keep_checkpoints=2)
    forget, asked = stores.checkpoints.forget, []

    def keep_step_1(checkpoints):
        asked.append(sorted(checkpoints))
        return forget({step: path for step, path in checkpoints.items() if step != 1})

    stores.checkpoints.forget = keep_step_1
    assert loop.run() == "completed"
    assert saved_steps(tmp_path) == [1, 4, 5] and recorded_steps(stores) == [1, 4, 5]
    assert asked == [[1], [1, 2], [1, 3]]


def test_every_save_interval_s_seconds(tmp_path):
    loop, stores = build(tmp_path, save_interval_s=250, total_steps=7)
    assert loop.run() == "completed"
    assert recorded_steps(stores) == [3, 6, 7]  # 300 s after the start, 300 s after step 3, the end


def test_time_and_steps_together_count_from_the_last_checkpoint(tmp_path):
    loop, stores = build(tmp_path, save_interval=4, save_interval_s=250, total_steps=9, keep_checkpoints=10)
    assert loop.run() == "completed"
    # 3 by time; 4 is a multiple of save_interval; 7 by time (300 s after 4); 8 by steps; 9 the end
    assert recorded_steps(stores) == [3, 4, 7, 8, 9]


def test_memory_sync_saves_only_at_sync_steps_so_that_every_checkpoint_resumes(tmp_path):
    config = make_config(
        trainer={"total_steps": 8, "save_interval": 0, "save_interval_s": 250},
        synchronizer={"method": "memory", "interval": 2},
    )
    first, stores = build_from(config, tmp_path)
    # Due by time at step 3, saved at the next sync step (4); a stop at step 5 saves nothing.
    assert first.run(should_stop=lambda: first.trainer.step >= 5) == "stopped"
    assert recorded_steps(stores) == [4]
    second, _ = build_from(config, tmp_path, stores=stores)  # the stores outlive the worker, as Postgres does
    second.resume(stores.checkpoints.records[-1][2])
    assert second.trainer.step == 4
    assert second.run() == "completed"
    assert recorded_steps(stores) == [4, 8]  # 7 was due by time (300 s after 4): not a sync step


def test_a_resumed_loop_deletes_what_lost_steps_and_killed_saves_left(tmp_path):
    loop, stores = build(tmp_path, save_interval=1, total_steps=2)
    stray = [tmp_path / "checkpoints" / name for name in ("step_7", ".step_2.0a1b2c")]
    for path in stray:
        path.mkdir(parents=True)
    assert loop.run() == "completed"
    assert saved_steps(tmp_path) == [1, 2] and not any(path.exists() for path in stray)
