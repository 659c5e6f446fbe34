"""A trainer step with nothing to train on (workers/rft/trainer.py, Trainer.waits_for_data): 100 of
them ended a run "completed", model v100, having trained nothing. Where the explorer's steps bring
the data (rollouts) the step counts, skipped, and the run says at its end how many were; sft and
dpo on data that comes when it comes (people's edits and comparisons, other runs, imports) wait
for it, saying so, and count no step. The headless CLI refuses a trainer no data could reach."""
import json
import logging

import pytest

from workers.rft.__main__ import main
from workers.rft.experience import PreferencePair
from workers.rft.loop import Loop
from workers.rft.memory import InMemoryMetrics, memory_stores

from .conftest import make_config
from .test_trainer import experience, make_trainer

pytestmark = pytest.mark.usefixtures("data_dir")

DPO = {"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [7]},
       "trainer": {"total_steps": 2, "batch_size": 2, "micro_batch_size": 4}}


def pairs(tokenizer, n=2) -> list[PreferencePair]:
    return [PreferencePair(tokenizer(f"What is {i} + 1?")["input_ids"], tokenizer(str(i + 1))["input_ids"],
                           tokenizer(f"{i + 2}, I think")["input_ids"]) for i in range(n)]


def test_a_step_of_an_algorithm_on_rollouts_with_none_counts_as_skipped(tiny_path, tokenizer):
    """Its explorer waits for the weights the step publishes: a trainer that waited would wait for itself."""
    trainer = make_trainer(tiny_path, tokenizer, [])
    assert not trainer.waits_for_data
    assert trainer.train_step()["skipped"] == 1 and trainer.step == 1


def test_sft_with_no_expert_data_yet_takes_no_step_until_some_comes(tiny_path, tokenizer):
    metrics = InMemoryMetrics()
    trainer = make_trainer(tiny_path, tokenizer, [], metrics, algorithm={"name": "sft"}, mode="train",
                           buffer={"expert_taskset": "x"})
    assert trainer.waits_for_data
    assert trainer.train_step() is None and trainer.step == 0 and metrics.points == {}
    trainer.buffer.write([experience(tokenizer, 2, 3, source="human_edit")])  # an annotator's edit
    out = trainer.train_step()
    assert (trainer.step, out["expert_experiences"]) == (1, 1) and "skipped" not in out
    assert list(metrics.points) == [("trainer", 1)]


def test_expert_iteration_counts_a_step_before_anything_was_promoted(tiny_path, tokenizer):
    """promote_to_expert's copies come with explorer steps, as rollouts do: the step counts."""
    trainer = make_trainer(tiny_path, tokenizer, [], algorithm={"name": "sft"},
                           explorer={"pipeline": ["promote_to_expert"]})
    assert not trainer.waits_for_data
    assert trainer.train_step()["skipped"] == 1 and trainer.step == 1


def test_a_dpo_loop_waits_for_pairs_saying_so_then_trains_on_them(tmp_path, tokenizer):
    """The pairs come while the trainer waits (here the third time it looks; on the web app, an
    annotator's comparison): no trainer point until then, and the duty line said what it waited for."""
    config = make_config(**DPO)
    stores = memory_stores(config)
    loop = Loop(config, stores, tmp_path)
    said, looks = [], []
    plain = loop.activity.doing
    loop.activity.doing = lambda role, what: (said.append((role, what)), plain(role, what))

    def wait():
        looks.append(loop.trainer.step)
        if len(looks) == 3:
            stores.buffer.add_pairs(pairs(tokenizer))

    assert loop.run(wait=wait) == "completed"
    assert looks == [0, 0, 0]
    assert [step for role, step in stores.metrics.points if role == "trainer"] == [1, 2]
    assert stores.metrics.points[("trainer", 1)]["pairs"] == 2
    trainer = [what for role, what in said if role == "trainer"]
    trainer = [what for i, what in enumerate(trainer) if not i or what != trainer[i - 1]]  # said again: no change
    # The step that finds the pairs says so as it trains (it said "waiting" until its end).
    assert trainer[:4] == ["training step 1", "waiting for data: nothing to train on yet from annotators' "
                           "comparisons on run 7", "training step 1", "training step 2"]
    assert loop.skipped_steps == 0


def test_a_pair_trains_in_at_most_max_pair_uses_steps_then_the_trainer_waits_for_new_ones(tmp_path, tokenizer):
    """Least used first alone cycled a handful of pairs through every step (the DPO preset: its first
    pair in all 100). With algorithm.dpo.max_pair_uses 1 each pair trains once: a step takes the
    pairs not yet used, however few, and with none waits for new ones, the duty line saying why."""
    config = make_config(**{**DPO, "algorithm": {"name": "dpo", "dpo": {"max_pair_uses": 1}},
                            "trainer": {**DPO["trainer"], "total_steps": 3}})
    stores = memory_stores(config)
    given = pairs(tokenizer, 4)
    stores.buffer.add_pairs(given[:2])
    loop = Loop(config, stores, tmp_path)
    said, looks = [], []
    plain = loop.activity.doing
    loop.activity.doing = lambda role, what: (said.append((role, what)), plain(role, what))

    def wait():
        looks.append(loop.trainer.step)
        if len(looks) in (2, 4):  # an annotator's next comparison
            stores.buffer.add_pairs([given[len(looks) // 2 + 1]])

    assert loop.run(wait=wait) == "completed"
    assert looks == [1, 1, 2, 2]
    assert [stores.metrics.points[("trainer", step)]["pairs"] for step in (1, 2, 3)] == [2, 1, 1]
    assert stores.buffer._pair_uses == [1, 1, 1, 1]
    assert ("trainer", "waiting for data: every pair so far has trained in 1 step (algorithm.dpo.max_pair_uses), "
            "the most it may; new ones come from annotators' comparisons on run 7") in said

    unlimited = make_config(**{**DPO, "trainer": {**DPO["trainer"], "total_steps": 3}})  # mode train: passes
    stores = memory_stores(unlimited)
    stores.buffer.add_pairs(given[:2])
    assert Loop(unlimited, stores, tmp_path / "unlimited").run(wait=lambda: pytest.fail("no wait")) == "completed"
    assert stores.buffer._pair_uses == [3, 3]


def test_a_stop_while_the_trainer_waits_ends_the_run_with_no_checkpoint_of_nothing(tmp_path):
    config = make_config(**DPO)
    stores = memory_stores(config)
    loop = Loop(config, stores, tmp_path)
    assert loop.run(should_stop=lambda: True, wait=lambda: pytest.fail("a stop needs no wait")) == "stopped"
    assert loop.trainer.step == 0 and stores.metrics.points == {}
    assert not list(tmp_path.glob("checkpoints/step_*"))


def test_a_run_whose_every_step_found_nothing_says_so_when_it_ends(tmp_path, caplog):
    """Every group's rewards equal and dropped (drop_zero_std_groups): both steps skipped. The warning
    reaches the run page's Logs panel (apps/runs/logs.py keeps WARNING lines first); the count
    survives a resume (the checkpoint's extra)."""
    config = make_config(algorithm={"drop_zero_std_groups": True}, trainer={"total_steps": 2, "save_interval": 1})
    stores = memory_stores(config)
    loop = Loop(config, stores, tmp_path)
    loop.workflow.reward_fn = lambda response, task: (0.0, {})
    with caplog.at_level(logging.WARNING, logger="workers.rft.loop"):
        assert loop.run() == "completed"
    assert [point.get("skipped") for (role, _), point in sorted(stores.metrics.points.items())
            if role == "trainer"] == [1, 1]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "workers.rft.loop"]
    assert warning.startswith("trained nothing: all 2 trainer steps found nothing to train on: the rollouts of the "
                              "explorer steps they train on were all filtered out")
    saved = json.loads((tmp_path / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert saved["extra"]["skipped_steps"] == 2
    again = Loop(config, memory_stores(config), tmp_path / "again")
    again.resume(tmp_path / "checkpoints" / "step_1")
    assert again.skipped_steps == 1


CLI_REFUSED = {
    "dpo": ({"algorithm": {"name": "dpo"}}, "algorithm.name: 'dpo' trains on preference pairs, and a headless run "
                                            "has none"),
    "sft, mode train": ({"mode": "train", "algorithm": {"name": "sft"}},
                        "buffer.expert_taskset: required by algorithm 'sft' in a headless run"),
    "sft, mode both": ({"algorithm": {"name": "sft"}}, "buffer.expert_taskset: required by algorithm 'sft'"),
    "grpo, mode train": ({"mode": "train"}, "mode: 'train' rolls nothing out"),
    "source runs": ({"mode": "train", "algorithm": {"name": "sft"}, "feedback": {"source_runs": [3]}},
                    "feedback.source_runs names runs of the web app"),
}


@pytest.mark.parametrize("patch, said", CLI_REFUSED.values(), ids=CLI_REFUSED.keys())
def test_the_headless_cli_refuses_a_trainer_no_data_could_reach(tmp_path, capsys, patch, said):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(make_config(**patch).to_dict()))
    assert main(["run", str(path), "--work-dir", str(tmp_path / "work")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "work").exists()

