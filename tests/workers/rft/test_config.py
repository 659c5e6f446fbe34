"""The run config: good configs round-trip; every kind of mistake is reported under its key, all at once."""
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.rft.config import ConfigError, ConfigIssue, RunConfig, load_config

FULL = """
mode: both
seed: 3
model: {path: tiny, ref_path: null, critic_path: null, max_prompt_tokens: 128, dtype: float32, device: cpu}
algorithm:
  name: ppo
  repeat_times: 4
  advantage_fn: null
  policy_loss: null
  clip_range: 0.2
  clip_range_low: 0.1
  clip_range_high: 0.28
  loss_agg_mode: seq-mean-token-mean
  entropy_coef: 0.01
  drop_zero_std_groups: false  # ppo compares no groups: true is refused
  epsilon: 1e-6
  kl: {fn: low_var_kl, coef: 0.001}
  gae: {gamma: 0.99, lam: 0.95}
  value_clip: 0.5
  dpo: {beta: 0.1}
  mix: {mu: 0.1, expert_data_ratio: 0.25}
explorer:
  engine: transformers
  batch_size: 8
  temperature: 0.7
  top_p: 0.9
  max_new_tokens: 64
  workflow: single_turn
  reward_fn: {exact_match: 1.0, format: {weight: 0.1, think: true}}
  system_prompt: Think step by step.
  use_chat_template: false
  pipeline: [dedupe, {name: reward_filter, min: 0.01}]
  eval_interval: 5
trainer:
  lr: 3e-6
  critic_lr: 1e-5
  batch_size: 32
  micro_batch_size: 4
  total_steps: 10
  save_interval: 5
  grad_clip: 1.0
  weight_decay: 0.01
  warmup_steps: 2
  update_epochs: 2
buffer:
  taskset: countdown
  expert_taskset: null
  eval_taskset: arithmetic
  max_staleness: 2
  task_pipeline: [priority]
  task_selector: {name: difficulty_based, target_reward: 0.6, lamb: 0.05, tau: 0.1, do_sample: false, retire_after: 3}
synchronizer: {method: memory, interval: 2, offset: 1}
"""


def errors(data) -> dict[str, str]:
    """key -> message for a config that must fail."""
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(data) if isinstance(data, dict) else load_config(data)
    return {issue.key: issue.message for issue in caught.value.errors}


def test_defaults_are_valid_and_round_trip():
    config = load_config("")
    assert config == RunConfig() == RunConfig.from_dict(config.to_dict())
    assert config.algorithm.name == "grpo" and config.algorithm.repeat_times == 8


def test_full_config_round_trips_through_yaml_json_and_files(tmp_path):
    config = load_config(FULL)
    data = config.to_dict()
    assert data["algorithm"]["kl"] == {"fn": "low_var_kl", "coef": 0.001}
    assert data["trainer"]["lr"] == 3e-6 and data["algorithm"]["epsilon"] == 1e-6  # YAML '3e-6' read as a float
    assert data["explorer"]["reward_fn"] == {"exact_match": 1.0, "format": {"weight": 0.1, "think": True}}
    assert RunConfig.from_dict(data) == config
    assert load_config(json.dumps(data)) == config
    path = tmp_path / "run.yaml"
    path.write_text(FULL)
    assert load_config(path) == config == load_config(path.read_text())


def test_resolved_defaults():
    config = load_config(FULL)
    assert (config.algorithm.clip_low, config.algorithm.clip_high) == (0.1, 0.28)
    assert config.train_batch_size == 32
    config = RunConfig.from_dict({"algorithm": {"repeat_times": 4}, "explorer": {"batch_size": 3}})
    assert (config.algorithm.clip_low, config.algorithm.clip_high) == (0.2, 0.2)
    assert config.train_batch_size == 12  # 3 tasks · 4 rollouts


def test_a_stored_dr_grpo_config_launches_again_with_its_keys_changed():
    """Launching again starts from the stored config. The scale Dr. GRPO fills in was stored with it:
    changing loss_agg_mode was then refused over a key the user never set, and a new max_new_tokens
    kept the old scale."""
    stored = RunConfig.from_dict(
        {"algorithm": {"loss_agg_mode": "seq-mean-token-sum-norm"}, "explorer": {"max_new_tokens": 32}}
    ).to_dict()
    assert stored["algorithm"]["loss_scale_factor"] is None
    longer = RunConfig.from_dict({**stored, "explorer": {**stored["explorer"], "max_new_tokens": 256}})
    assert longer.trained_algorithm().loss_scale_factor == 256
    other = RunConfig.from_dict({**stored, "algorithm": {**stored["algorithm"], "loss_agg_mode": "token-mean"}})
    assert other.trained_algorithm().loss_scale_factor is None


def test_ints_are_accepted_for_floats():
    config = RunConfig.from_dict({"trainer": {"lr": 1}})
    assert config.trainer.lr == 1.0 and isinstance(config.trainer.lr, float)


def test_unknown_keys_suggest_the_closest():
    assert errors({"algorithm": {"clip_rang": 0.3, "kl": {"fnn": "k3"}}}) == {
        "algorithm.clip_rang": "unknown key; did you mean 'clip_range'?",
        "algorithm.kl.fnn": "unknown key; did you mean 'fn'?",
    }
    message = errors({"zzz": 1})["zzz"]
    assert message.startswith("unknown key; known keys: mode, seed, model, algorithm")


@pytest.mark.parametrize("data, key, message", [
    ({"seed": "1"}, "seed", "expected an integer, got a string"),
    ({"trainer": {"batch_size": True}}, "trainer.batch_size", "expected an integer, got a boolean"),
    ({"trainer": {"micro_batch_size": 2.5}}, "trainer.micro_batch_size", "expected an integer, got a number"),
    ({"explorer": {"use_chat_template": "yes"}}, "explorer.use_chat_template", "expected a boolean, got a string"),
    ({"algorithm": {"kl": {"coef": "x"}}}, "algorithm.kl.coef", "expected a number, got a string"),
    ({"explorer": {"pipeline": "dedupe"}}, "explorer.pipeline", "expected a list, got a string"),
    ({"explorer": {"reward_fn": 3}}, "explorer.reward_fn", "expected a string or a mapping, got an integer"),
    ({"algorithm": {"mix": 3}}, "algorithm.mix", "expected a mapping, got an integer"),
    ({"model": {"path": None}}, "model.path", "must not be null"),
    ({"model": {"path": "  "}}, "model.path", "must not be empty"),
    ({"model": {"path": "\x1c"}}, "model.path", "must not be empty"),  # blank to str.strip(), not to a regex's \\S
    ({"trainer": {"lr": float("nan")}}, "trainer.lr", "must be a finite number"),
    ({"trainer": {"lr": 0}}, "trainer.lr", "must be > 0, got 0.0"),
    ({"seed": -1}, "seed", "must be >= 0, got -1"),
    ({"algorithm": {"clip_range_low": 1.5}}, "algorithm.clip_range_low", "must be <= 1, got 1.5"),
    ({"algorithm": {"gae": {"lam": 1.1}}}, "algorithm.gae.lam", "must be <= 1, got 1.1"),
    ({"explorer": {"top_p": 0}}, "explorer.top_p", "must be > 0, got 0.0"),
    ({"buffer": {"max_staleness": -1}}, "buffer.max_staleness", "must be >= 0, got -1"),
    ({"mode": "serve"}, "mode", "'serve' is not one of: both, explore, train, bench"),
    ({"synchronizer": {"method": "ray"}}, "synchronizer.method", "'ray' is not one of: memory, checkpoint, nccl"),
    ({"explorer": {"workflow": "singleturn"}}, "explorer.workflow",
     "'singleturn' is not one of: multi_turn, single_turn, tool_calling; did you mean 'single_turn'?"),
    ({"algorithm": {"kl": {"fn": "k4"}}}, "algorithm.kl.fn", "'k4' is not one of: k1, k2, k3, low_var_kl, none"),
    ({"algorithm": {"loss_agg_mode": "token_mean"}}, "algorithm.loss_agg_mode",
     "'token_mean' is not one of: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm; "
     "did you mean 'token-mean'?"),
    ({"explorer": {"reward_fn": {"exact_match": 1, "nope": 2}}}, "explorer.reward_fn.nope",
     "unknown reward fn; known: countdown, exact_match, format, llm_judge, numeric, reward_model"),
    ({"explorer": {"reward_fn": "exact_mach"}}, "explorer.reward_fn.exact_mach",
     "unknown reward fn; did you mean 'exact_match'?"),
    ({"explorer": {"reward_fn": {"numeric": {"tol": 0.1}}}}, "explorer.reward_fn.numeric.tol",
     "unknown key; known keys: weight, tolerance"),
    ({"explorer": {"reward_fn": {"numeric": {"tolerance": -1}}}}, "explorer.reward_fn.numeric.tolerance",
     "must be >= 0, got -1.0"),
    ({"explorer": {"reward_fn": {"format": "heavy"}}}, "explorer.reward_fn.format.weight",
     "expected a number, got a string"),
    ({"explorer": {"reward_fn": {"format": {"weight": None, "think": True}}}}, "explorer.reward_fn.format.weight",
     "must not be null"),
    ({"explorer": {"reward_fn": {"format": 10**400}}}, "explorer.reward_fn.format.weight", "must be a finite number"),
    ({"trainer": {"lr": 10**400}}, "trainer.lr", "must be a finite number"),
    ({"explorer": {"reward_fn": {}}}, "explorer.reward_fn",
     "expected a reward fn name or a non-empty mapping {name: weight}"),
    ({"explorer": {"reward_fn": "llm_judge"}}, "explorer.reward_fn.llm_judge.model", "required"),
    ({"buffer": {"task_pipeline": ["ok", {"min": 1}]}}, "buffer.task_pipeline",
     "item 1: expected an operator name or a mapping with a 'name'"),
    # buffer.task_selector: a registered selector and the params it declares (task_selectors.py)
    ({"buffer": {"task_selector": "difficulty"}}, "buffer.task_selector",
     "unknown task selector 'difficulty'; did you mean 'difficulty_based'?"),
    ({"buffer": {"task_selector": {"name": "curriculum"}}}, "buffer.task_selector.name",
     "unknown task selector 'curriculum'; known: default, difficulty_based, sequential"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "target": 0.5}}}, "buffer.task_selector.target",
     "unknown key; did you mean 'target_reward'?"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "m": 16}}}, "buffer.task_selector.m",
     "unknown key; known keys: target_reward, lamb, tau, do_sample, retire_after"),
    ({"buffer": {"task_selector": {"name": "sequential", "tau": 1.0}}}, "buffer.task_selector.tau",
     "unknown key; known keys: none"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "target_reward": 1.5}}},
     "buffer.task_selector.target_reward", "must be <= 1, got 1.5"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "lamb": 1}}}, "buffer.task_selector.lamb",
     "must be < 1, got 1.0"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "do_sample": "yes"}}},
     "buffer.task_selector.do_sample", "expected a boolean, got a string"),
    ({"buffer": {"task_selector": {"name": "difficulty_based", "retire_after": 2.0}}},
     "buffer.task_selector.retire_after", "expected an integer, got a number"),
    ({"buffer": {"task_selector": {"tau": 0}}}, "buffer.task_selector",
     "expected a task selector's name or a mapping with a 'name' (e.g. {name: difficulty_based})"),
    ({"buffer": {"task_selector": ["default"]}}, "buffer.task_selector", "expected a string or a mapping, got a list"),
    ({"buffer": {"task_selector": " "}}, "buffer.task_selector", "must not be empty"),
])
def test_field_errors(data, key, message):
    assert errors(data) == {key: message}


@pytest.mark.parametrize("data, key, fragment", [
    ({"algorithm": {"name": "mix"}}, "buffer.expert_taskset", "required by algorithm 'mix'"),
    ({"algorithm": {"policy_loss": "mix"}}, "buffer.expert_taskset", "required by policy loss 'mix'"),
    ({"algorithm": {"name": "dpo"}, "mode": "explore", "synchronizer": {"method": "checkpoint"}}, "mode",
     "algorithm 'dpo' does not train on rollouts"),
    ({"algorithm": {"name": "sft", "advantage_fn": "grpo"}}, "algorithm.advantage_fn", "'sft' uses no advantages"),
    ({"algorithm": {"name": "sft", "policy_loss": "ppo"}}, "algorithm.policy_loss", "cannot replace the 'sft' loss"),
    ({"algorithm": {"policy_loss": "dpo"}}, "algorithm.policy_loss", "'dpo' cannot replace the 'ppo' loss"),
    # sft reads no reward: on an RL algorithm it would imitate the model's own rollouts
    ({"algorithm": {"policy_loss": "sft"}}, "algorithm.policy_loss",
     "'sft' cannot replace the 'ppo' loss of algorithm 'grpo': it reads no reward"),
    ({"algorithm": {"name": "mix", "policy_loss": "ppo"}, "buffer": {"expert_taskset": "gold"}},
     "algorithm.policy_loss",
     "algorithm 'mix' samples expert data, which 'ppo' cannot train on (use algorithm 'grpo')"),
    ({"algorithm": {"name": "sft", "policy_loss": "mix"}, "buffer": {"expert_taskset": "gold"}},
     "algorithm.policy_loss",
     "it trains on rollouts, and algorithm 'sft' collects none"),
    ({"algorithm": {"name": "sft", "kl": {"fn": "k3"}}}, "algorithm.kl.fn",
     "'k3' estimates the KL from the policy's own samples (rollouts), and algorithm 'sft' trains on none"),
    ({"algorithm": {"kl": {"coef": 0.1}}}, "algorithm.kl.coef", "has no effect with algorithm.kl.fn 'none'"),
    ({"algorithm": {"name": "dpo", "entropy_coef": 0.01}}, "algorithm.entropy_coef",
     "the 'dpo' loss has no entropy bonus"),
    ({"algorithm": {"name": "sft"}, "feedback": {"reward_mode": "weight"}}, "feedback.reward_mode",
     "'weight' turns ratings into rewards, and algorithm 'sft' trains on no rewards"),
    ({"mode": "bench", "synchronizer": {"method": "checkpoint"}}, "buffer.eval_taskset", "required by mode 'bench'"),
    ({"explorer": {"eval_interval": 10}}, "buffer.eval_taskset", "required when explorer.eval_interval > 0"),
])
def test_combination_errors(data, key, fragment):
    found = errors(data)
    assert list(found) == [key] and fragment in found[key]


def test_combinations_that_are_fine():
    RunConfig.from_dict({"algorithm": {"name": "sft", "repeat_times": 1}})  # no groups: one rollout is fine
    RunConfig.from_dict({"algorithm": {"name": "ppo", "repeat_times": 1}})
    # A group of one keeps its reward as its advantage (verl, Trinity): REINFORCE on the raw reward.
    RunConfig.from_dict({"algorithm": {"name": "grpo", "repeat_times": 1}})
    RunConfig.from_dict({"algorithm": {"name": "rloo", "repeat_times": 1}})
    RunConfig.from_dict({"algorithm": {"name": "mix"}, "buffer": {"expert_taskset": "gold"}})
    # MIX's loss on any RL algorithm: + SFT on expert data
    for rl in ("grpo", "ppo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opmd"):
        RunConfig.from_dict({"algorithm": {"name": rl, "policy_loss": "mix"}, "buffer": {"expert_taskset": "gold"}})
    RunConfig.from_dict({"algorithm": {"name": "sft", "policy_loss": "sft"}})  # the preset's own loss, named
    RunConfig.from_dict({"algorithm": {"kl": {"fn": "k3"}}})  # coef 0: the KL is logged, not penalised
    RunConfig.from_dict({"mode": "train", "algorithm": {"name": "dpo"}, "synchronizer": {"method": "checkpoint"}})
    RunConfig.from_dict({"synchronizer": {"interval": 2, "offset": 2}})
    RunConfig.from_dict({"synchronizer": {"interval": 1, "offset": 4}, "buffer": {"max_staleness": 2}})  # async


@pytest.mark.parametrize("data", [
    {"algorithm": {"name": "mix", "mix": {"mu": 0.5, "expert_data_ratio": 0.5}}, "buffer": {"expert_taskset": "g"}},
    {"algorithm": {"policy_loss": "mix", "mix": {"mu": 0.5}}, "buffer": {"expert_taskset": "g"}},  # grpo + mix loss
    {"algorithm": {"name": "mix_chord", "mix": {"expert_data_ratio": 0.5}}, "buffer": {"expert_taskset": "g"}},
    {"mode": "train", "algorithm": {"name": "dpo", "dpo": {"beta": 0.5}}},
    {"algorithm": {"name": "ppo", "gae": {"gamma": 0.9, "lam": 0.9}}},
    {"algorithm": {"name": "reinforce_plus_plus", "gae": {"gamma": 0.9}}},
    {"algorithm": {"policy_loss": "gspo", "clip_range_low": 3e-4, "clip_range_high": 4e-4}},
    {"algorithm": {"name": "opmd", "policy_loss": "cispo", "clip_range": 0.3}},
    {"algorithm": {"epsilon": 1e-4}},
])
def test_an_algorithm_key_is_accepted_where_it_is_read(data):
    """The counterpart of the option matrix's refusals: each key where its loss or advantage fn reads it."""
    RunConfig.from_dict(data)


def test_every_number_is_bounded_above():
    """A value past any sense (weight_decay 1e300) is refused at launch, not met as NaNs mid-run."""
    from workers.rft.config_issues import leaf_types, section_of

    def unbounded(model, prefix=""):
        for name, field in model.model_fields.items():
            section = section_of(field.annotation)
            if section is not None:
                yield from unbounded(section, f"{prefix}{name}.")
            elif {int, float} & set(leaf_types(field.annotation)) and bool not in leaf_types(field.annotation):
                if not any(hasattr(m, "le") or hasattr(m, "lt") for m in field.metadata):
                    yield prefix + name

    assert list(unbounded(RunConfig)) == []


def test_many_errors_are_reported_together():
    text = """
mode: explore
algorithm: {name: grpoo, repeat_times: 1, clip_rang: 0.3, kl: {fn: k4}}
trainer: {lr: -1, total_steps: zero}
synchronizer: {interval: 0, offset: 3}
"""
    with pytest.raises(ConfigError) as caught:
        load_config(text)
    found = {issue.key: issue.message for issue in caught.value.errors}
    assert list(found) == [
        "algorithm.clip_rang", "algorithm.name", "algorithm.kl.fn", "trainer.lr", "trainer.total_steps",
        "synchronizer.interval", "synchronizer.offset",  # mode explore reads no offset: config_rules.TRAINER_ONLY
    ]
    # the grpo rule on repeat_times is skipped: algorithm.name is wrong, so the rule cannot know it applies
    assert found["algorithm.name"].endswith("did you mean 'grpo'?")
    assert str(caught.value).splitlines()[0] == "algorithm.clip_rang: unknown key; did you mean 'clip_range'?"
    assert len(str(caught.value).splitlines()) == 7


def test_documents_that_are_not_configs():
    assert list(errors("[1, 2")) == ["<config>"] and "not valid YAML" in errors("[1, 2")["<config>"]
    assert errors("- 1\n- 2\n") == {"<config>": "expected a mapping, got a list"}
    assert ConfigError([ConfigIssue("a.b", "bad")]).errors == [ConfigIssue("a.b", "bad")]
    with pytest.raises(FileNotFoundError):
        load_config(Path("/nonexistent/run.yaml"))


@pytest.mark.parametrize("trainer, mode, key, message", [
    ({"num_processes": 2}, "both", "trainer.num_processes",
     "strategy 'single' trains in one process, got 2: set trainer.strategy 'ddp' or 'fsdp'"),
    ({"num_nodes": 2}, "both", "trainer.num_nodes",
     "strategy 'single' trains on one machine, got 2: set trainer.strategy 'ddp' or 'fsdp'"),
    ({"strategy": "ddp"}, "both", "trainer.strategy",
     "'ddp' with one rank is 'single': set trainer.num_processes (ranks per node) above 1"),
    ({"strategy": "ddp", "num_processes": 2}, "explore", "trainer.strategy",
     "mode 'explore' runs no trainer to spread over ranks"),
    ({"strategy": "fsdp"}, "both", "trainer.strategy",
     "'fsdp' with one rank is 'single': set trainer.num_processes (ranks per node) above 1"),
    ({"fsdp": {}}, "both", "trainer.fsdp",
     "has no effect with trainer.strategy 'single': its settings are FSDP's (trainer.strategy 'fsdp')"),
    ({"strategy": "ddp", "num_processes": 2, "fsdp": {"cpu_offload": True}}, "both", "trainer.fsdp",
     "has no effect with trainer.strategy 'ddp': its settings are FSDP's (trainer.strategy 'fsdp')"),
    ({"strategy": "fsdp", "num_processes": 2, "fsdp": {"cpu_offload": "yes"}}, "both", "trainer.fsdp.cpu_offload",
     "expected a boolean, got a string"),
    ({"strategy": "deepspeed"}, "both", "trainer.strategy", "'deepspeed' is not one of: single, ddp, fsdp"),
    ({"num_processes": 0}, "both", "trainer.num_processes", "must be >= 1, got 0"),
    ({"collective_timeout_s": 0}, "both", "trainer.collective_timeout_s", "must be > 0, got 0.0"),
])
def test_trainer_strategy_combinations_are_refused_with_the_key(trainer, mode, key, message):
    assert errors({"mode": mode, "trainer": trainer}) == {key: message}


def test_ddp_on_two_nodes_of_one_process_is_accepted():
    config = RunConfig.from_dict({"trainer": {"strategy": "ddp", "num_nodes": 2}})
    assert (config.trainer.strategy, config.trainer.num_processes, config.trainer.num_nodes) == ("ddp", 1, 2)


def test_fsdp_takes_its_settings_and_defaults_without_them():
    config = RunConfig.from_dict({"trainer": {"strategy": "fsdp", "num_processes": 2}})
    assert (config.trainer.strategy, config.trainer.fsdp) == ("fsdp", None)
    config = RunConfig.from_dict({"trainer": {"strategy": "fsdp", "num_processes": 2, "fsdp": {
        "reshard_after_forward": False}}})
    fsdp = config.trainer.fsdp
    assert (fsdp.reshard_after_forward, fsdp.cpu_offload) == (False, False)
    assert RunConfig.from_dict(config.to_dict()) == config


def test_activation_checkpointing_is_the_trainers_and_a_stored_config_with_it_under_fsdp_reads_the_same():
    """It moved from trainer.fsdp to trainer (every strategy, issue #43); a run stored before resumes."""
    assert RunConfig.from_dict({"trainer": {"activation_checkpointing": True}}).trainer.activation_checkpointing
    stored = {"trainer": {"strategy": "fsdp", "num_processes": 2, "fsdp": {"activation_checkpointing": True,
                                                                          "cpu_offload": True}}}
    config = RunConfig.from_dict(stored)
    assert config.trainer.activation_checkpointing and config.trainer.fsdp.cpu_offload
    assert "activation_checkpointing" not in config.to_dict()["trainer"]["fsdp"]


def test_the_docs_table_of_keys_is_current():
    """docs/config.md is made from the schema: `python -m workers.rft.config_docs` rewrites it."""
    from workers.rft.config_docs import DOC, render

    assert DOC.read_text() == render(), "docs/config.md is stale: run python -m workers.rft.config_docs"


BAD_VALUES = [None, "", " ", "x", 0, -1, 1.5, 10**400, True, [], {}, [1], {"a": 1}]


def leaf_keys(config: dict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def nested(key: str, value) -> dict:
    *sections, name = key.split(".")
    config = {name: value}
    for section in reversed(sections):
        config = {section: config}
    return config


@pytest.mark.parametrize("key", list(leaf_keys(RunConfig().to_dict())))
def test_every_refusal_is_in_our_words(key):
    """pydantic checks every key: a value it refuses is named at that key in our words, never in
    pydantic's own ("Input should be ...")."""
    refused = 0
    for value in BAD_VALUES:
        config = nested(key, value)
        try:
            RunConfig.model_validate(config)
        except ValidationError:
            refused += 1
            with pytest.raises(ConfigError) as err:
                RunConfig.from_dict(config)
            said = {issue.key: issue.message for issue in err.value.errors}
            assert key in said or any(k.startswith(key + ".") for k in said), (value, said)
            assert not any("Input should" in message or "[type=" in message for message in said.values()), said
    assert refused >= 6, key  # most of the values are wrong for any key
