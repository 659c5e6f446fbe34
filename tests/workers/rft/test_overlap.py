"""The overlapped loop (offset >= 1): the explorer in a background thread beside the trainer."""
import threading
import time

import pytest
import torch

from workers.rft.loop import Loop
from workers.rft.memory import memory_stores

from .conftest import make_config

pytestmark = pytest.mark.usefixtures("data_dir")

STEPS = 4


def offset_one_config(method="memory"):
    return make_config(synchronizer={"method": method, "offset": 1}, trainer={"total_steps": STEPS})


def parity_reward(response, task):
    """Rewards that differ within a group (the tiny model never answers right): every step trains."""
    return float(len(response) % 2), {}


def build(config, work_dir, reward=parity_reward):
    stores = memory_stores(config)
    loop = Loop(config, stores, work_dir)
    loop.workflow.reward_fn = reward
    return loop, stores


def explorer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "rft-explorer"]


@pytest.fixture
def one_torch_thread():
    """The same intra-op thread count in every thread of both loops, so floating point agrees."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_overlapped_run_trains_exactly_as_the_sequential_one(tmp_path, one_torch_thread):
    config = offset_one_config()
    results = {}
    for overlap in (False, True):
        loop, stores = build(config, tmp_path / f"overlap-{overlap}")
        assert loop.run(overlap=overlap) == "completed"
        assert torch.get_num_threads() == 1  # restored
        results[overlap] = (
            [
                (step, v["loss"], v["reward_mean"])
                for (role, step), v in sorted(stores.metrics.points.items())
                if role == "trainer"
            ],
            stores.metrics.series("explorer", "model_version"),
            [(e.explorer_step, e.response_ids) for e in stores.buffer.all()],
            loop.trainer.policy.state_dict(),
        )
    (seq_metrics, seq_versions, seq_rollouts, seq_weights), (metrics, versions, rollouts, weights) = results.values()
    assert len(metrics) == STEPS and any(loss != 0 for _, loss, _ in metrics)
    assert metrics == seq_metrics
    assert versions == seq_versions
    assert rollouts == seq_rollouts
    assert all(torch.equal(weights[name], seq_weights[name]) for name in seq_weights)


def test_the_explorer_runs_beside_the_trainer_one_version_behind(tmp_path):
    loop, stores = build(offset_one_config(), tmp_path)
    spans = []  # (role, thread, start, end)

    def timed(role, step):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                spans.append((role, threading.current_thread().name, start, time.perf_counter()))

        return wrapper

    loop.explorer.explore_step = timed("explorer", loop.explorer.explore_step)
    loop.trainer.train_step = timed("trainer", loop.trainer.train_step)
    assert loop.run() == "completed"

    explored = [(start, end) for role, thread, start, end in spans if role == "explorer" and thread == "rft-explorer"]
    trained = [(start, end) for role, thread, start, end in spans if role == "trainer" and thread == "MainThread"]
    assert len(explored) == STEPS + 1 and len(trained) == STEPS  # every step on its side, as many as sequentially
    assert any(e_start < t_end and t_start < e_end for e_start, e_end in explored for t_start, t_end in trained)
    # Explorer step t (logged as step t + 1) used exactly the version the rules promise it.
    versions = stores.metrics.series("explorer", "model_version")
    assert versions == [(t + 1, loop.sync.required_version(t)) for t in range(STEPS + 1)]
    assert [v for _, v in stores.metrics.series("trainer", "staleness")] == [0, 1, 1, 1]
    assert not explorer_threads()


def test_an_error_in_the_explorer_thread_reaches_the_caller(tmp_path):
    before = set(threading.enumerate())
    loop, _ = build(offset_one_config(), tmp_path)

    def breaks_at_step_2(response, task):
        if loop.explorer.step == 2:
            raise ValueError("reward fn broke")
        return parity_reward(response, task)

    loop.workflow.reward_fn = breaks_at_step_2
    with pytest.raises(RuntimeError, match="every task failed; the first: task .*: ValueError: reward fn broke"):
        loop.run()
    assert loop.trainer.step < STEPS  # the trainer stopped waiting for the step that failed
    assert set(threading.enumerate()) <= before


def test_an_error_in_the_trainer_stops_the_explorer_thread(tmp_path):
    before = set(threading.enumerate())
    loop, _ = build(offset_one_config(), tmp_path)
    train_step = loop.trainer.train_step

    def breaks_at_step_2(**kwargs):
        if loop.trainer.step == 2:
            raise ValueError("optimizer broke")
        return train_step(**kwargs)

    loop.trainer.train_step = breaks_at_step_2
    with pytest.raises(ValueError, match="optimizer broke"):
        loop.run()
    assert set(threading.enumerate()) <= before


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_a_stopped_overlapped_run_resumes_as_if_uninterrupted(method, tmp_path, one_torch_thread):
    config = offset_one_config(method)
    straight, straight_stores = build(config, tmp_path / "straight")
    assert straight.run(overlap=False) == "completed"

    first, stores = build(config, tmp_path / "resumed")
    assert first.run(should_stop=lambda: first.trainer.step >= 2) == "stopped"
    assert first.trainer.step == 2 and not explorer_threads()
    assert first.explorer.step == 3  # as the sequential loop: every step needing version 1 or older
    checkpoint = tmp_path / "resumed" / "checkpoints" / "step_2"
    assert stores.checkpoints.records[-1] == (2, 2, str(checkpoint))

    second = Loop(config, stores, tmp_path / "resumed")
    second.workflow.reward_fn = parity_reward
    second.resume(checkpoint)
    assert second.run() == "completed"
    losses = [v for _, v in stores.metrics.series("trainer", "loss")]
    assert losses == [v for _, v in straight_stores.metrics.series("trainer", "loss")]
    assert [e.response_ids for e in stores.buffer.all()] == [e.response_ids for e in straight_stores.buffer.all()]


def test_the_loop_says_what_each_part_does_as_it_starts(tmp_path):
    """What the run page's duty line shows (workers/rft/activity.py): each phase as it starts,
    explorer and trainer side by side; `now()` is the latest of each."""
    loop, _ = build(offset_one_config(), tmp_path)
    said = []
    plain = loop.activity.doing
    loop.activity.doing = lambda role, what: (said.append((role, what)), plain(role, what))
    assert loop.run() == "completed"
    trainer = [what for role, what in said if role == "trainer"]
    explorer = [what for role, what in said if role == "explorer"]
    assert [what for what in trainer if what.startswith("training")] == [f"training step {s}" for s in (1, 2, 3, 4)]
    assert trainer[-1] == f"saving a checkpoint at step {STEPS}"
    assert explorer[0] == "rolling out step 1 with v0"
    assert "rolling out step 3 with v1" in explorer  # offset 1: step 3 waits for the trainer's v1
    now = loop.activity.now()
    assert [part["role"] for part in now] == ["explorer", "trainer"]
    assert now[1]["what"] == f"saving a checkpoint at step {STEPS}" and now[1]["since"] <= time.time()
