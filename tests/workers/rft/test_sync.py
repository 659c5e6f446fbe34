"""Weights reach the explorer: memory and checkpoint synchronisers, interval and offset."""
import pytest
import torch

from workers.rft.loop import Loop
from workers.rft.memory import memory_stores
from workers.rft.synchronizer import Synchronizer

from .conftest import make_config

pytestmark = pytest.mark.usefixtures("data_dir")


def small_config(**sections):
    base = {
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 3, "use_chat_template": False},
        "trainer": {"lr": 1e-2, "total_steps": 4},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return make_config(**base)


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_after_a_step_and_a_sync_the_explorer_holds_the_trainers_weights(method, tmp_path):
    # MIX: the SFT half moves the weights even when every rollout of the random model scores 0.
    config = small_config(
        synchronizer={"method": method}, algorithm={"name": "mix"}, buffer={"expert_taskset": "arithmetic:n=20"}
    )
    loop = Loop(config, memory_stores(config), tmp_path)
    explorer_model, trainer_model = loop.explorer.engine.model, loop.trainer.policy
    initial = {k: v.clone() for k, v in explorer_model.state_dict().items()}
    loop.explore()
    loop.train()
    assert not same_weights(explorer_model, trainer_model)  # trained, not yet synced
    loop.explore()  # pulls version 1 first
    assert loop.explorer.engine.model_version == 1
    assert same_weights(explorer_model, trainer_model)
    assert any(not torch.equal(initial[k], v) for k, v in explorer_model.state_dict().items())
    if method == "checkpoint":
        assert (tmp_path / "versions" / "v1" / "model.safetensors").exists()


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
@pytest.mark.parametrize("interval,offset", [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_explorer_uses_the_version_the_rules_promise(method, interval, offset, tmp_path):
    config = small_config(
        synchronizer={"method": method, "interval": interval, "offset": offset}, trainer={"total_steps": 4}
    )
    stores = memory_stores(config)
    Loop(config, stores, tmp_path).run()
    versions = {}
    for exp in stores.buffer.all():
        versions.setdefault(exp.explorer_step, set()).add(exp.model_version)
    expected = {t: {max(0, t - offset) // interval} for t in versions}
    assert versions == expected
    # Every trainer batch came from the explorer step it was promised: staleness = offset steps.
    staleness = [v for _, v in stores.metrics.series("trainer", "staleness")]
    assert len(staleness) == 4 and max(staleness) <= offset + interval - 1
    if offset == 1 and interval == 1:
        assert staleness[1:] == [1, 1, 1]  # exactly one version behind, after the first step
    if method == "checkpoint":
        versions = sorted(p.name for p in (tmp_path / "versions").iterdir())
        assert versions == [f"v{n}" for n in range(1, 4 // interval + 1)]


@pytest.mark.parametrize("offset", [0, 1])
def test_a_loop_that_trains_between_generates_frees_the_engines_idle_caches_first(offset, tmp_path):
    """At offset 0 each trainer step runs in the memory the engine's kept caches hold
    (transformers_engine.KEPT_CACHE_SHARE: 27 GB at SmolLM2-1.7B's reference shape): the loop asks
    the engine to give them back before each. From offset 1 the explorer runs beside the trainer
    and needs them at the same time: nothing to give back."""
    config = small_config(synchronizer={"offset": offset}, trainer={"total_steps": 3})
    loop = Loop(config, memory_stores(config), tmp_path)
    engine, asked = loop.explorer.engine, []
    free = engine.free_idle_caches

    def free_and_note():
        asked.append((loop.explorer.step, loop.trainer.step))
        free()

    engine.free_idle_caches = free_and_note
    assert loop.run() == "completed"
    assert asked == ([(1, 0), (2, 1), (3, 2)] if offset == 0 else [])  # after each explorer step, before training


def test_required_versions():
    sync = Synchronizer("memory", interval=2, offset=1)
    assert [sync.required_version(t) for t in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    assert [sync.is_publish_step(s) for s in (1, 2, 3, 4)] == [False, True, False, True]


def test_memory_sync_cannot_serve_a_version_it_does_not_hold(tiny_model, tokenizer):
    from workers.rft.engines import TransformersEngine

    sync = Synchronizer("memory")
    sync.publish(tiny_model, trainer_step=2)
    with pytest.raises(RuntimeError):
        sync.pull(TransformersEngine(tiny_model, tokenizer), 1)


def test_cli_runs_a_config_headless(tmp_path, capsys):
    from workers.rft.__main__ import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {path: tiny}\nalgorithm: {name: grpo, repeat_times: 2}\n"
        "explorer: {batch_size: 2, max_new_tokens: 3}\ntrainer: {total_steps: 2}\n"
        "buffer: {taskset: 'arithmetic:n=20'}\n"
    )
    assert main(["run", str(config), "--work-dir", str(tmp_path / "work")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[:4]] == [["explorer", "step", "1"], ["trainer", "step", "1"],
                                                        ["explorer", "step", "2"], ["trainer", "step", "2"]]
    assert "reward_mean=" in lines[0] and "grad_norm=" in lines[1] and lines[-1].startswith("completed")
    assert (tmp_path / "work" / "checkpoints" / "step_2" / "trainer_state.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: {nme: grpo}\n")
    assert main(["run", str(bad)]) == 2
    assert "algorithm.nme: unknown key; did you mean 'name'?" in capsys.readouterr().err


def test_checkpoint_versions_are_directories_and_newer_ones_can_be_discarded(tiny_model, tmp_path):
    sync = Synchronizer("checkpoint", directory=tmp_path)
    assert sync.latest_version() == 0
    for step in (1, 2, 3):
        assert sync.publish(tiny_model, trainer_step=step) == step
    assert sync.latest_version() == 3 and (tmp_path / "v2" / "config.json").exists()
    sync.discard_after(1)  # a trainer resumed from step 1 publishes 2 and 3 again
    assert sync.latest_version() == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


@pytest.mark.parametrize("name", ["tiny_grpo", "tiny_mix_arithmetic", "tiny_mix_arithmetic_ddp", "smollm2_grpo"])
def test_example_configs_are_valid(name):
    from pathlib import Path

    from workers.rft.config import load_config
    from workers.rft.memory import load_tasks

    config = load_config(Path(__file__).parents[3] / "workers" / "rft" / "examples" / f"{name}.yaml")
    for spec in filter(None, (config.buffer.taskset, config.buffer.expert_taskset, config.buffer.eval_taskset)):
        assert load_tasks(spec)


def test_each_step_says_what_its_sync_cost_and_how_long_each_side_waited(tmp_path):
    """sync_seconds: the trainer's publish inside its step, the explorer's load before its step;
    idle_share: the share of the time since the side's last step spent waiting (none on the
    first). In the sequential loop each side waits while the other works."""
    config = small_config(synchronizer={"method": "checkpoint"})
    stores = memory_stores(config)
    Loop(config, stores, tmp_path).run(overlap=False)
    trainer = [stores.metrics.points[("trainer", step)] for step in range(1, 5)]
    explorer = [stores.metrics.points[("explorer", step)] for step in range(1, 5)]
    assert all(point["sync_seconds"] > 0 for point in trainer)  # a version directory written every step
    # Step 0 uses the weights the explorer started with (nothing to load); the others load a version.
    assert explorer[0]["sync_seconds"] < 0.001 < min(point["sync_seconds"] for point in explorer[1:])
    assert "idle_share" not in trainer[0] and "idle_share" not in explorer[0]
    assert all(0 < point["idle_share"] < 1 for point in trainer[1:] + explorer[1:])


def test_a_split_trainer_waits_for_rollouts_as_fresh_as_max_staleness_asks(tmp_path):
    """The trainer in a loop of its own (checkpoint sync) and a slower explorer: with
    buffer.max_staleness 0 each trainer step waits for rollouts of the newest version, as the single
    loop does. It waited only for the step before, so steps 2-4 found nothing fresh and were skipped."""
    import threading
    import time

    config = small_config(synchronizer={"method": "checkpoint", "offset": 1}, buffer={"max_staleness": 0})
    stores = memory_stores(config)
    trainer = Loop(config, stores, tmp_path, components=("trainer",))
    explorer = Loop(config, stores, tmp_path, components=("explorer",))
    finished = threading.Event()

    def explore_slowly():
        explorer.run_explorer(finished.is_set, wait=lambda: time.sleep(0.2))

    threads = [threading.Thread(target=explore_slowly), threading.Thread(target=lambda: trainer.run_trainer(
        lambda: False, explored_steps=lambda: explorer.explorer.step, wait=lambda: time.sleep(0.01)))]
    for thread in threads:
        thread.start()
    threads[1].join(timeout=300)
    finished.set()
    threads[0].join(timeout=60)
    steps = [stores.metrics.points[("trainer", step)] for step in range(1, 5)]
    assert [point.get("skipped", 0) for point in steps] == [0, 0, 0, 0]
    assert all(point["staleness_max"] <= 0 for point in steps)


@pytest.mark.parametrize("evaluates_ends", [True, False])
def test_a_split_runs_first_explorer_evaluates_the_start_and_the_final_version(evaluates_ends, tmp_path):
    """Trainer and explorer in loops of their own (checkpoint sync, as two workers hold them): the
    first explorer evaluates what a single loop's `run` does at the ends, the starting weights
    before step 0 and, once the trainer is done, its last version; the others only at the interval."""
    import threading
    import time

    total = 3
    config = small_config(synchronizer={"method": "checkpoint"}, trainer={"total_steps": total},
                          explorer={"eval_interval": 10},
                          buffer={"eval_taskset": "arithmetic:n=20,max_operand=9,ops=+,split=eval"})
    stores = memory_stores(config)
    trainer = Loop(config, stores, tmp_path, components=("trainer",))
    explorer = Loop(config, stores, tmp_path, components=("explorer",))
    finished = threading.Event()
    threads = [
        threading.Thread(target=lambda: trainer.run_trainer(
            lambda: False, explored_steps=lambda: explorer.explorer.step, wait=lambda: time.sleep(0.02))),
        threading.Thread(target=lambda: explorer.run_explorer(
            finished.is_set, wait=lambda: time.sleep(0.02), trained=lambda: trainer.trainer.step >= total,
            evaluates_ends=evaluates_ends)),
    ]
    for thread in threads:
        thread.start()
    threads[0].join(timeout=300)
    deadline = time.monotonic() + (120 if evaluates_ends else 1)  # the final eval, after the trainer's last step
    while ("eval", total) not in stores.metrics.points and time.monotonic() < deadline:
        time.sleep(0.05)
    finished.set()
    threads[1].join(timeout=60)
    evals = {step: point["model_version"] for (role, step), point in stores.metrics.points.items() if role == "eval"}
    assert evals == ({0: 0, total: trainer.final_version()} if evaluates_ends else {})
    assert trainer.final_version() == total and explorer.explorer.engine.model_version == (total if evaluates_ends
                                                                                           else total - 1)
