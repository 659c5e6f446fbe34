"""Stop after step k, resume from the checkpoint: steps k+1... match an uninterrupted run."""
import pytest

from workers.rft.loop import Loop
from workers.rft.memory import memory_stores

from .conftest import make_config

pytestmark = pytest.mark.usefixtures("data_dir")

TOTAL, STOP_AT = 4, 2


def config(method, offset):
    return make_config(
        algorithm={"name": "mix", "repeat_times": 2, "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
        explorer={"batch_size": 3, "max_new_tokens": 3, "use_chat_template": False},
        trainer={"lr": 3e-3, "total_steps": TOTAL, "micro_batch_size": 4},
        buffer={"expert_taskset": "arithmetic:n=30,max_operand=9,ops=+"},
        synchronizer={"method": method, "offset": offset},
    )


def trainer_losses(stores) -> list[float]:
    return [v for _, v in stores.metrics.series("trainer", "loss")]


@pytest.mark.parametrize("method,offset", [("memory", 0), ("checkpoint", 1)])
def test_resumed_run_matches_an_uninterrupted_one(method, offset, tmp_path):
    cfg = config(method, offset)
    straight = memory_stores(cfg)
    assert Loop(cfg, straight, tmp_path / "straight").run() == "completed"

    # The stores outlive the worker, as Postgres does; the loop (models, optimizer) does not.
    stores = memory_stores(cfg)
    first = Loop(cfg, stores, tmp_path / "resumed")
    stop = lambda: first.trainer.step >= STOP_AT  # noqa: E731, F821 - called in run(), before the del below
    assert first.run(should_stop=stop) == "stopped"
    checkpoint = tmp_path / "resumed" / "checkpoints" / f"step_{STOP_AT}"
    assert stores.checkpoints.records[-1] == (STOP_AT, STOP_AT, str(checkpoint))
    del first

    second = Loop(cfg, stores, tmp_path / "resumed")
    second.resume(checkpoint)
    assert second.trainer.step == STOP_AT
    assert second.run() == "completed"

    expected = trainer_losses(straight)
    assert len(expected) == TOTAL and trainer_losses(stores) == expected  # bitwise: same seeds, same data
    assert [e.response_ids for e in stores.buffer.all()] == [e.response_ids for e in straight.buffer.all()]


def test_a_run_whose_checkpoints_were_deleted_starts_over_on_its_own_versions(tmp_path):
    """Resumed with no checkpoint left (a curator deleted them), the trainer starts at step 0: the
    versions its first life published are not its own. Kept, an explorer of a split run rolled out
    on the old life's newest one ("rolling out step 6 with v5" beside trainer step 0)."""
    cfg = config("checkpoint", 1)
    stores = memory_stores(cfg)
    first = Loop(cfg, stores, tmp_path / "resumed")
    stop = lambda: first.trainer.step >= STOP_AT  # noqa: E731, F821 - called in run(), before the del below
    assert first.run(should_stop=stop) == "stopped"
    del first
    stores.checkpoints.records.clear()  # the curator's delete

    second = Loop(cfg, stores, tmp_path / "resumed")
    assert second.sync.latest_version() == STOP_AT  # the first life's
    second.start_over()
    assert second.sync.latest_version() == 0 and second.trainer.step == 0
    assert second.run() == "completed"
    assert [step for (role, step) in stores.metrics.points if role == "trainer"] == list(range(1, TOTAL + 1))
