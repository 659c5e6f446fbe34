"""Config choices that validated and then did nothing or the wrong thing, refused naming the key
(workers/rft/config_rules.py): keys nothing reads in their combination, multi-turn budgets that end
every episode after one turn, filters that change what the group advantage compares, and a trainer
no data could ever reach (data_issues, which a launch applies: the web app's and the CLI's)."""
import pytest

from workers.rft.config import ConfigError, RunConfig
from workers.rft.config_rules import data_issues, data_sources, unread_keys, waiting_for_data
from workers.rft.engines import SamplingParams
from workers.rft.experience import Experience, Task
from workers.rft.pipelines import (
    EXPERIENCE_OPERATORS,
    PipelineContext,
    build_operators,
    group_advantage,
    run_experience_operators,
)
from workers.rft.sampling import pair_use_limit

from .test_multi_turn import ScriptedEngine, flow

EXPERT = {"buffer": {"expert_taskset": "gold"}}
FROZENLAKE = {"workflow": "multi_turn", "workflow_args": {"env": "frozenlake"}}


def config(*parts: dict) -> dict:
    """The parts merged a section deep."""
    data = {}
    for part in parts:
        for section, values in part.items():
            data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return data


def refusal(data) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(data)
    return {issue.key: issue.message for issue in caught.value.errors}


REFUSED = {
    # nothing samples expert data: the loop seeds it only for sft, mix, dpo; dpo samples pairs
    "expert taskset, grpo": (config(EXPERT), "buffer.expert_taskset", ["algorithm 'grpo'", "sft, mix and mix_chord"]),
    "expert taskset, dpo": (config({"mode": "train", "algorithm": {"name": "dpo"}}, EXPERT), "buffer.expert_taskset",
                            ["algorithm 'dpo'", "dpo on preference pairs"]),
    "expert share 0, mix": (config({"algorithm": {"name": "mix", "mix": {"expert_data_ratio": 0}}}, EXPERT),
                            "algorithm.mix.expert_data_ratio", ["0 puts no expert data", "set it above 0"]),
    "expert share 0, mix_chord": (
        config({"algorithm": {"name": "mix_chord", "mix": {"expert_data_ratio": 0}}}, EXPERT),
        "algorithm.mix.expert_data_ratio", ["policy loss 'mix_chord'"]),
    "promote, grpo": (config({"explorer": {"pipeline": ["promote_to_expert"]}}), "explorer.pipeline[0]",
                      ["promote_to_expert", "algorithm 'grpo' trains on none"]),
    "promote, dpo": (config({"algorithm": {"name": "dpo"}, "explorer": {"pipeline": [
        "drop_empty", {"name": "promote_to_expert", "min_reward": 0.5}]}}), "explorer.pipeline[1]", ["'dpo'"]),
    "source runs, grpo": (config({"feedback": {"source_runs": [7]}}), "feedback.source_runs",
                          ["algorithm 'grpo'", "human edits (expert data) and preference pairs"]),
    "source runs, mix without edits": (
        config({"algorithm": {"name": "mix"}, "feedback": {"source_runs": [7], "edits_as_expert": False}}, EXPERT),
        "feedback.source_runs", ["feedback.edits_as_expert false"]),
    "edits as expert, grpo": (config({"feedback": {"edits_as_expert": False}}), "feedback.edits_as_expert",
                              ["algorithm 'grpo'"]),
    "edits as expert, dpo": (config({"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {
        "edits_as_expert": False}}), "feedback.edits_as_expert", ["algorithm 'dpo'"]),
    "pair uses, grpo": (config({"algorithm": {"dpo": {"max_pair_uses": 2}}}), "algorithm.dpo.max_pair_uses",
                        ["policy loss 'ppo'", "how often dpo trains on one preference pair"]),
    "staleness, sft": (config({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"max_staleness": 0}}),
                       "buffer.max_staleness", ["algorithm 'sft'", "trains on none"]),
    "staleness, explore": (config({"mode": "explore", "buffer": {"max_staleness": 1}}), "buffer.max_staleness",
                           ["mode 'explore'", "runs no trainer"]),
    "rated only, sft": (config({"mode": "train", "algorithm": {"name": "sft"}, "feedback": {"rated_only": True}}),
                        "feedback.rated_only", ["algorithm 'sft'"]),
    "rated only, dpo": (config({"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {"rated_only": True}}),
                        "feedback.rated_only", ["algorithm 'dpo'"]),
    "pipeline, train": (config({"mode": "train", "algorithm": {"name": "sft"}, "explorer": {"pipeline": ["dedupe"]}}),
                        "explorer.pipeline", ["mode 'train'", "rolls nothing out"]),
    "task pipeline, train": (config({"mode": "train", "algorithm": {"name": "sft"},
                                     "buffer": {"task_pipeline": ["priority"]}}),
                             "buffer.task_pipeline", ["mode 'train'"]),
    "task selector, bench": (config({"mode": "bench", "buffer": {"eval_taskset": "x",
                                                                 "task_selector": "difficulty_based"}}),
                             "buffer.task_selector", ["mode 'bench'", "only evaluates"]),
    # task_selectors.Sequential draws in taskset order: the priority operator would change nothing
    "priority, sequential": (config({"buffer": {"task_selector": "sequential", "task_pipeline": [
        "filter_length", {"name": "priority", "difficulty": -1}]}}), "buffer.task_pipeline[1]",
        ["'priority' has no effect with buffer.task_selector 'sequential'"]),
    # EnvironmentWorkflow scores an episode by the environment's return
    "reward fn, multi_turn": (config({"explorer": {**FROZENLAKE, "reward_fn": {"exact_match": 1, "format": 0.2}}}),
                              "explorer.reward_fn", ["workflow 'multi_turn'", "environment's return"]),
    "countdown, multi_turn": (config({"explorer": {**FROZENLAKE, "reward_fn": "countdown"}}), "explorer.reward_fn",
                              ["has no effect"]),
    "judge, multi_turn": (config({"explorer": {**FROZENLAKE, "reward_fn": {"llm_judge": {"model": "tiny"}}}}),
                          "explorer.reward_fn", ["has no effect"]),
    # MultiTurnWorkflow.advance: a turn needs room for a whole max_new_tokens after the last
    "one turn of 1024 new tokens": (config({"explorer": {**FROZENLAKE, "max_new_tokens": 1024}}),
                                    "explorer.max_new_tokens",
                                    ["explorer.workflow_args.max_tokens (1,024)", "model.max_prompt_tokens (256)",
                                     "explorer.max_new_tokens (1,024) is 2,304"]),
    "max_tokens below the prompt": (
        config({"explorer": {"workflow": "multi_turn", "workflow_args": {"env": "frozenlake", "max_tokens": 64}}}),
        "explorer.workflow_args.max_tokens", ["(64)", "is 320"]),
    "tools, 512 new tokens": (config({"explorer": {"workflow": "tool_calling", "max_new_tokens": 512}}),
                              "explorer.max_new_tokens", ["is 1,280"]),
    # a filter before the group advantage changes the groups it compares
    "dedupe, grpo": (config({"explorer": {"pipeline": ["dedupe"]}}), "explorer.pipeline[0]",
                     ["advantage fn 'grpo'", "group of one", "advantage 1.0"]),
    "reward filter, rloo": (config({"algorithm": {"name": "rloo"}, "explorer": {"pipeline": [
        "drop_empty", {"name": "reward_filter", "min": 0.5}]}}), "explorer.pipeline[1]",
        ["advantage fn 'rloo'", "0, 0, 0"]),
    "reward filter, mix": (config({"algorithm": {"name": "mix"}, "explorer": {"pipeline": [
        {"name": "reward_filter", "max": 0.9}]}}, EXPERT), "explorer.pipeline[0]", ["advantage fn 'grpo'"]),
}


@pytest.mark.parametrize("data, key, words", REFUSED.values(), ids=REFUSED.keys())
def test_a_choice_that_would_do_nothing_or_harm_is_refused_naming_its_key(data, key, words):
    found = refusal(data)
    assert list(found) == [key] and all(word in found[key] for word in words), found


@pytest.mark.parametrize("data", [
    config({"algorithm": {"name": "sft"}}, EXPERT),
    config({"algorithm": {"name": "mix"}}, EXPERT),
    config({"algorithm": {"name": "rloo", "policy_loss": "mix"}}, EXPERT),  # the mix loss reads expert data
    config({"algorithm": {"name": "mix", "mix": {"expert_data_ratio": 0.01}}}, EXPERT),
    config({"algorithm": {"name": "sft"}, "explorer": {"pipeline": ["promote_to_expert"]}}),  # expert iteration
    config({"algorithm": {"name": "mix"}, "explorer": {"pipeline": ["promote_to_expert"]}}, EXPERT),
    config({"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [7]}}),  # their pairs
    config({"mode": "train", "algorithm": {"name": "dpo", "dpo": {"max_pair_uses": 3}}, "feedback": {
        "source_runs": [7]}}),
    config({"mode": "train", "algorithm": {"name": "sft"}, "feedback": {"source_runs": [7]}}),  # their edits
    config({"algorithm": {"name": "mix"}, "feedback": {"edits_as_expert": False}}, EXPERT),
    config({"buffer": {"max_staleness": 0}, "feedback": {"rated_only": True}}),
    config({"explorer": {"pipeline": ["drop_empty"]}, "buffer": {"task_pipeline": ["priority"]}, "mode": "explore"}),
    # difficulty_based breaks ties by priority; the default selector says "default" as well as leaving it out
    config({"buffer": {"task_selector": {"name": "difficulty_based"}, "task_pipeline": ["priority"]}}),
    config({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"task_selector": {"name": "default"}}}, EXPERT),
    config({"explorer": {**FROZENLAKE, "reward_fn": "exact_match"}}),  # the default, written out
    config({"explorer": {"workflow": "tool_calling", "reward_fn": "countdown"}}),  # tools score the final answer
    # the budget at its edge: 256 + 2 x 384 = 1,024
    config({"explorer": {**FROZENLAKE, "max_new_tokens": 384}}),
    # one turn: nothing to make room for
    config({"explorer": {"workflow": "multi_turn", "workflow_args": {"env": "frozenlake", "max_turns": 1,
                                                                     "max_tokens": 64}}}),
    # advantage fns that compare no groups: a filter changes nothing they compare
    config({"algorithm": {"name": "ppo"}, "explorer": {"pipeline": ["dedupe", {"name": "reward_filter", "min": 0.5}]}}),
    config({"algorithm": {"name": "reinforce_plus_plus"}, "explorer": {"pipeline": ["dedupe"]}}),
    # filters of what is not a comparison: no reward, empty or cut-off answers
    config({"explorer": {"pipeline": [{"name": "reward_filter"}, "drop_empty", "drop_truncated"]}}),
])
def test_the_same_keys_are_accepted_where_they_are_read(data):
    RunConfig.from_dict(data)


@pytest.mark.parametrize("data, keys", [
    (config({"mode": "explore", "trainer": {"lr": 0.5, "update_epochs": 5, "warmup_steps": 3}}),
     ["trainer.lr", "trainer.update_epochs", "trainer.warmup_steps"]),
    (config({"mode": "explore", "synchronizer": {"interval": 5, "offset": 2}}),
     ["synchronizer.interval", "synchronizer.offset"]),
    (config({"mode": "explore", "feedback": {"reward_mode": "override", "rated_only": True}}),
     ["feedback.reward_mode", "feedback.rated_only"]),
    (config({"mode": "bench", "buffer": {"eval_taskset": "x"}, "trainer": {"lr": 0.3, "update_epochs": 4,
                                                                             "grad_clip": 0.01}}),
     ["trainer.lr", "trainer.update_epochs", "trainer.grad_clip"]),
    (config({"mode": "bench", "buffer": {"eval_taskset": "x"}, "model": {"ref_path": "tiny"},
             "trainer": {"activation_checkpointing": True, "keep_checkpoints": 1}}),
     ["model.ref_path", "trainer.activation_checkpointing", "trainer.keep_checkpoints"]),
])
def test_training_keys_set_for_a_mode_that_trains_nothing_are_refused(data, keys):
    """Accepted, they did nothing: modes explore and bench build no trainer (loop.py)."""
    found = refusal(data)
    assert sorted(found) == sorted(keys), found
    mode = data["mode"]
    assert all(f"mode '{mode}'" in found[key] for key in keys), found
    assert found[keys[0]] == f"has no effect with mode '{mode}': only a trainer reads it, and mode '{mode}' runs none"


@pytest.mark.parametrize("data", [
    RunConfig(mode="explore").to_dict(),  # every default written out ("Launch again" copies a whole config)
    RunConfig(mode="bench", buffer={"eval_taskset": "x"}).to_dict(),
    # what those modes read: the explorer's step count, a feedback rubric for the annotators
    config({"mode": "explore", "trainer": {"total_steps": 7}, "feedback": {"rubric": "Is it right?",
                                                                           "scale_max": 3}}),
    # a flag only recorded, the row left ready (feedback.services.flag reads it whatever the mode)
    config({"mode": "explore", "feedback": {"exclude_flagged": False}}),
    config({"mode": "bench", "buffer": {"eval_taskset": "x"}, "synchronizer": {"method": "checkpoint"}}),
    config({"trainer": {"lr": 0.5, "update_epochs": 5}, "synchronizer": {"interval": 5, "offset": 2}}),  # mode both
])
def test_a_mode_that_trains_nothing_accepts_what_it_reads_and_the_defaults(data):
    RunConfig.from_dict(data)


def test_unread_keys_name_what_the_launch_form_and_sweeps_put_back():
    """Keys a swept value or a hidden field leaves unread (config_keys.reset_unread), with what
    their rule reads: a sweep resets one only when it swept one of those."""
    data = config({"algorithm": {"name": "mix", "mix": {"mu": 0.5}}}, EXPERT,
                  {"feedback": {"source_runs": [7], "rated_only": True, "rating_wait_s": 5}})
    RunConfig.from_dict(data)
    data["algorithm"]["name"] = "sft"
    unread = unread_keys(RunConfig.model_validate(data))
    assert {"algorithm.mix.mu", "feedback.rated_only"} <= set(unread)
    assert "buffer.expert_taskset" not in unread and "feedback.source_runs" not in unread  # sft reads them
    assert "algorithm.name" in unread["feedback.rated_only"]
    data["algorithm"]["name"] = "grpo"
    unread = unread_keys(RunConfig.model_validate(data))
    assert {"buffer.expert_taskset", "feedback.source_runs"} <= set(unread) and "feedback.rated_only" not in unread


def test_a_token_budget_of_one_turn_ends_every_episode_after_it(tokenizer):
    """The refused budget, played: with max_new_tokens equal to max_tokens no episode takes a second
    turn, however short its replies (MultiTurnWorkflow.advance keeps room for a whole reply)."""
    engine = ScriptedEngine(tokenizer, lambda call, row, text: "left")  # four tokens, never the goal
    for max_new_tokens, turns, finish in ((1024, 1, "max_tokens"), (8, 10, "max_turns")):
        (exp,) = flow(engine, tokenizer, env="frozenlake", max_turns=10).run_batch(
            [Task(id=0, prompt="")], SamplingParams(max_new_tokens=max_new_tokens), 0)
        assert (exp.metadata["episode"]["turns"], exp.metadata["episode"]["finish"]) == (turns, finish)
    assert "explorer.max_new_tokens" in refusal(config({"explorer": {**FROZENLAKE, "max_new_tokens": 1024}}))
    RunConfig.from_dict(config({"explorer": {**FROZENLAKE, "max_new_tokens": 8}}))


def advantages(rows: list[tuple[float, int]], pipeline: list) -> list[float]:
    """The pipeline, then the group advantage the explorer appends (explorer.py: grpo as configured
    by default), on one task's group of rollouts (reward, answer token)."""
    group = [Experience(0, "g", i, [1], [answer], [1], reward=reward, logprobs=None)
             for i, (reward, answer) in enumerate(rows)]
    params = {"fn": "grpo", "drop_zero_std": False, "epsilon": 1e-6, "std_normalize": True, "std_unbiased": True}
    ops = build_operators(EXPERIENCE_OPERATORS, pipeline) + [("advantage", group_advantage, params)]
    out, _ = run_experience_operators(ops, group, PipelineContext())
    return [round(e.advantage, 3) for e in out]


def test_why_a_filter_before_the_group_advantage_is_refused():
    """The figures the refusals quote. Four identical correct answers carry no signal; dedupe makes
    them a group of one, which keeps its reward as its advantage (verl, Trinity-RFT: a single
    response's advantage is its score) and trains as strongly as a unique success. A reward filter
    leaves the survivors compared among themselves: the wrong answer's signal is gone."""
    assert advantages([(1.0, 7)] * 4, []) == [0.0] * 4
    assert advantages([(1.0, 7)] * 4, ["dedupe"]) == [1.0]
    assert advantages([(1.0, 7)] * 3 + [(0.0, 8)], []) == [0.5, 0.5, 0.5, -1.5]
    assert advantages([(1.0, 7)] * 3 + [(0.0, 8)], [{"name": "reward_filter", "min": 0.5}]) == [0.0] * 3


# ---- a trainer no data could reach (data_issues) -----------------------------------------------------
# Each ran 100 steps of {"skipped": 1} and ended "completed" at model v100, having trained nothing.
STARVED = {  # config: (the key named on the web app, on the headless CLI)
    "dpo, mode train": (config({"mode": "train", "algorithm": {"name": "dpo"}}), "feedback.source_runs",
                        "algorithm.name"),
    "sft, mode train": (config({"mode": "train", "algorithm": {"name": "sft"}}), "buffer.expert_taskset",
                        "buffer.expert_taskset"),
    "grpo, mode train": (config({"mode": "train"}), "mode", "mode"),
    "mix, mode train": (config({"mode": "train", "algorithm": {"name": "mix"}}, EXPERT), "mode", "mode"),
    "sft, both, no edits": (config({"algorithm": {"name": "sft"}, "feedback": {"edits_as_expert": False}}),
                            "buffer.expert_taskset", "buffer.expert_taskset"),
}


@pytest.mark.parametrize("data, web_key, cli_key", STARVED.values(), ids=STARVED.keys())
def test_a_trainer_no_data_could_reach_is_refused_at_launch_naming_what_to_give_it(data, web_key, cli_key):
    parsed = RunConfig.from_dict(data)  # the schema takes it: code may hand the engine's stores data
    assert data_sources(parsed, web=True) == []
    (web,) = data_issues(parsed, web=True)
    (cli,) = data_issues(parsed, web=False)
    assert (web.key, cli.key) == (web_key, cli_key)


def test_the_refusals_say_what_would_feed_the_trainer():
    dpo = RunConfig.from_dict(config({"mode": "train", "algorithm": {"name": "dpo"}}))
    (web,) = data_issues(dpo, web=True)
    assert "buffer.expert_dataset" in web.message and "in mode 'both' annotators compare" in web.message
    (cli,) = data_issues(dpo, web=False)
    assert "a headless run has none" in cli.message
    sft = RunConfig.from_dict(config({"mode": "train", "algorithm": {"name": "sft"}}))
    (web,) = data_issues(sft, web=True)
    assert "buffer.expert_dataset, or feedback.source_runs" in web.message and "annotators' edits" in web.message
    (cli,) = data_issues(sft, web=False)
    assert "promote_to_expert" in cli.message


FED = {  # config: (what feeds it on the web app, headless; None: refused there)
    "sft on a taskset": (config({"mode": "train", "algorithm": {"name": "sft"}}, EXPERT),
                         ["the answers of taskset 'gold'"], ["the answers of taskset 'gold'"]),
    "sft on other runs' edits": (config({"mode": "train", "algorithm": {"name": "sft"},
                                         "feedback": {"source_runs": [7, 9]}}), ["human edits on run 7, 9"], None),
    "sft on imports": (config({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_dataset": "x"}}),
                       ["the imported expert data 'x'"], None),
    "sft, annotators' edits": (config({"algorithm": {"name": "sft"}}),
                               ["annotators' edits of this run's answers (Annotate, e)"], None),
    "sft, expert iteration": (config({"algorithm": {"name": "sft"}, "explorer": {"pipeline": ["promote_to_expert"]},
                                      "feedback": {"edits_as_expert": False}}),
                              ["the rollouts promote_to_expert copies"], ["the rollouts promote_to_expert copies"]),
    "dpo on other runs' pairs": (config({"mode": "train", "algorithm": {"name": "dpo"},
                                         "feedback": {"source_runs": [7]}}),
                                 ["annotators' comparisons on run 7"], None),
    "dpo on imports": (config({"mode": "train", "algorithm": {"name": "dpo"}, "buffer": {"expert_dataset": "p"}}),
                       ["the imported preference pairs 'p'"], None),
    "dpo, annotators' comparisons": (config({"algorithm": {"name": "dpo"}}),
                                     ["annotators' comparisons of this run's answers (Annotate, c)"], None),
    "grpo": (config({}), ["its explorer's rollouts"], ["its explorer's rollouts"]),
    "explore only": (config({"mode": "explore"}), [], []),  # no trainer: nothing to feed
}


@pytest.mark.parametrize("data, web, headless", FED.values(), ids=FED.keys())
def test_a_trainer_something_could_reach_launches_and_says_what(data, web, headless):
    """What annotators judge while a mode 'both' run trains reaches its trainer (the web app's
    buffer samples the run's own human edits and comparisons), so there the run waits for them."""
    parsed = RunConfig.from_dict(data)
    assert (data_sources(parsed, web=True), data_issues(parsed, web=True)) == (web, [])
    assert data_sources(parsed, web=False) == (headless or [])
    assert bool(data_issues(parsed, web=False)) == (headless is None)


def test_a_pair_trains_once_in_mode_both_and_in_passes_in_mode_train_unless_the_run_says():
    """sampling.pair_use_limit: mode both's pairs come a few at a time from annotators (least used
    first alone cycled the first of them through every step); mode train's are a fixed set."""
    dpo = {"algorithm": {"name": "dpo"}}
    both, train = RunConfig.from_dict(dpo), RunConfig.from_dict(config(dpo, {"mode": "train", "feedback": {
        "source_runs": [7]}}))
    assert (pair_use_limit(both), pair_use_limit(train)) == (1, None)
    assert pair_use_limit(RunConfig.from_dict(config(dpo, {"algorithm": {"dpo": {"max_pair_uses": 4}}}))) == 4
    assert refusal(config(dpo, {"algorithm": {"dpo": {"max_pair_uses": 0}}})) == {
        "algorithm.dpo.max_pair_uses": "must be >= 1, got 0"}
    assert waiting_for_data(both, trained=False) == ("nothing to train on yet from annotators' comparisons of this "
                                                     "run's answers (Annotate, c)")
    assert waiting_for_data(both, trained=True) == (
        "every pair so far has trained in 1 step (algorithm.dpo.max_pair_uses), the most it may; new ones come "
        "from annotators' comparisons of this run's answers (Annotate, c)")
    assert waiting_for_data(train, trained=True) == "nothing to train on yet from annotators' comparisons on run 7"
