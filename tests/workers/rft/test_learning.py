"""The engine really trains: MIX takes the tiny random model from ~0 to well above it on a
held-out arithmetic split (single-digit addition; held-out prompts never appear in training);
GSPO, CISPO and the rollout correction learn a task as GRPO does."""
import json
from dataclasses import dataclass

import pytest
import torch

from workers.rft.config import RunConfig
from workers.rft.loop import Loop
from workers.rft.memory import memory_stores
from workers.rft.rewards import REWARD_FNS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("data_dir")]

ADDITION = "arithmetic:n=1000,max_operand=9,ops=+"

MIX_ARITHMETIC = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "mix", "repeat_times": 8, "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
    # No chat template: the same task in ~10 tokens instead of ~20 halves the step time.
    "explorer": {"batch_size": 8, "max_new_tokens": 4, "use_chat_template": False, "eval_interval": 25},
    "trainer": {"lr": 1e-3, "micro_batch_size": 64, "total_steps": 150},
    "buffer": {
        "taskset": f"{ADDITION},split=train",
        "expert_taskset": f"{ADDITION},split=train",
        "eval_taskset": f"{ADDITION},split=eval",
    },
}


def test_mix_learns_held_out_addition(tmp_path):
    config = RunConfig.from_dict(MIX_ARITHMETIC)
    stores = memory_stores(config)
    held_out = {t.prompt for t in stores.eval_source.tasks()}
    assert held_out and not held_out & {t.prompt for t in stores.task_source.tasks()}

    assert Loop(config, stores, tmp_path).run() == "completed"

    curve = stores.metrics.series("eval", "exact_match")
    print("held-out exact-match accuracy by explorer step:", curve)
    assert curve[0] == (0, 0.0)
    final = curve[-1][1]
    assert final >= 0.3, curve
    # The rollouts (GRPO's half) got better too, not just the greedy eval.
    rewards = [v for _, v in stores.metrics.series("explorer", "reward_mean")]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.2


# ---- GSPO, CISPO and the rollout correction learn as GRPO does --------------------------------------
#
# The task: arithmetic prompts, rewarded by the share of the response's characters that are digits
# (bench/grpo.py's bench_digits, registered here for these tests only). A random-init model writes
# a few digits by chance (mean reward ~0.02), so every group has rewards to tell apart from the
# first step, and GRPO takes it to ~0.95 within 28 steps of 4 prompts x 8 rollouts.
#
# Settings: GSPO as its paper and verl run it (clip ranges 3e-4 / 4e-4, seq-mean-token-mean).
# CISPO as Trinity-RFT's CISPOPolicyLossFn defaults, after MiniMax-M1 (arXiv 2506.13585): "we did
# not impose a lower bound on the IS weight by setting eps_low to a large value; instead, we only
# tuned eps_high": clip_range_high 0.28, clip_range_low 1.0 (a weight floor of 0). The correction: token_truncate
# at its defaults (clip_max 3, no floor), TRL's vllm_importance_sampling_correction.
#
# One torch thread: on the 2-core machine these were measured on, busy with other work, a run on
# two OpenMP threads took 46 s, on one 4 s, with the same rewards.

DIGIT_SHARE = "test_digit_share"

DIGITS_TASK = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 8},
    "explorer": {"batch_size": 4, "max_new_tokens": 8, "use_chat_template": False, "reward_fn": DIGIT_SHARE},
    "trainer": {"lr": 2e-3, "micro_batch_size": 32, "total_steps": 28},
    "buffer": {"taskset": "arithmetic:n=200"},
}
GSPO = {"policy_loss": "gspo", "clip_range_low": 3e-4, "clip_range_high": 4e-4, "loss_agg_mode": "seq-mean-token-mean"}
CISPO = {"policy_loss": "cispo", "clip_range_low": 1.0, "clip_range_high": 0.28}
CORRECTED = {"rollout_correction": {"mode": "token_truncate"}}
ALGORITHMS = {"gspo": GSPO, "cispo": CISPO, "grpo + token_truncate": CORRECTED}


@pytest.fixture(scope="module")
def digit_share():
    def digit_share(response: str, task) -> float:
        """Share of the response's characters that are digits."""
        return sum(c.isdigit() for c in response) / max(len(response), 1)

    digit_share.rules = {}  # what reward_fn() would set: no parameters
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(REWARD_FNS._entries, DIGIT_SHARE, digit_share)
        yield DIGIT_SHARE


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def merged(base: dict, patch: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in patch.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass
class Learned:
    first: float  # mean reward over the first quarter of the explorer steps
    last: float  # ... over the last quarter
    trainer: dict  # each trainer metric's mean over the run

    def __str__(self) -> str:
        return f"{self.first:.3f} -> {self.last:.3f}"


def learn(tmp_path, name: str, *patches: dict) -> Learned:
    data = DIGITS_TASK
    for patch in patches:
        data = merged(data, patch)
    config = RunConfig.from_dict(data)
    stores = memory_stores(config)
    assert Loop(config, stores, tmp_path / name.replace(" ", "_")).run() == "completed"
    rewards = [v for _, v in stores.metrics.series("explorer", "reward_mean")]
    quarter = len(rewards) // 4
    points = [m for (role, _), m in stores.metrics.points.items() if role == "trainer"]
    numbers = {key for key, value in points[-1].items() if isinstance(value, float | int)}
    trainer = {key: sum(m[key] for m in points) / len(points) for key in numbers if all(key in m for m in points)}
    return Learned(sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter, trainer)


# The noise band: GRPO's last quarter over 6 seeds (0-5) was 0.88 0.97 0.94 0.96 0.97 0.97 (mean
# 0.95, sd 0.036; the widest gap between two seeds 0.095). 0.15 is ~4 sd: any run within it of GRPO's
# is within seed noise of it; the test checks GRPO's own seeds 0 and 1 fall within it too.
ON_POLICY_BAND = 0.15


def test_gspo_cispo_and_the_correction_learn_as_grpo_does(tmp_path, digit_share, one_thread):
    """On-policy, as a run goes by default (synchronizer.offset 0, one update epoch): every update
    starts at ratio 1, so GSPO's clip, CISPO's weight clip and the correction's truncation (weights
    1 ± 1e-6 on CPU) do not bind, and each must reduce to GRPO's gradient (GSPO's up to its
    seq-mean-token-mean). Measured over seeds 0-5: CISPO and token_truncate repeat GRPO's reward
    curve to 2 decimals, GSPO's last quarter is within 0.03 of GRPO's. A sign, a stop-gradient or a
    weight gone wrong would show here."""
    runs = {"grpo": learn(tmp_path, "grpo"), "grpo seed 1": learn(tmp_path, "grpo seed 1", {"seed": 1})}
    runs |= {name: learn(tmp_path, name, {"algorithm": algorithm}) for name, algorithm in ALGORITHMS.items()}
    print("\nmean reward, first -> last quarter of 28 steps:", {name: str(run) for name, run in runs.items()})
    grpo = runs["grpo"].last
    for name, run in runs.items():
        assert run.last >= run.first + 0.5, f"{name} did not learn: {run}"
        assert abs(run.last - grpo) <= ON_POLICY_BAND, f"{name}: {run}, grpo {runs['grpo']}"
    assert runs["grpo + token_truncate"].trainer["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)


# Off-policy (synchronizer.offset 1: each step's rollouts come from the weights one update old),
# where the three differ from GRPO by design. Over seeds 0-5, last quarter of 32 steps:
#   grpo  0.76 0.61 0.66 0.63 0.69 0.66 (mean 0.67, sd 0.05; ppo's clip 0.2 bites on ~9% of tokens)
#   cispo 0.99 0.99 1.00 0.95 0.98 0.98 (every token keeps its gradient, its weight clipped)
#   grpo + token_truncate 1.00 0.99 1.00 0.96 0.99 0.98 (the trainer's own logπ_old: the ppo ratio
#         starts at 1, the staleness goes into weights truncated at 3)
#   gspo  0.44 0.41 0.49 0.35 0.37 0.29 (mean 0.39: one update moves a sequence's ratio by ~0.1,
#         far past 1 ± 4e-4, so ~65% of the tokens are clipped, their gradient 0)
# So here CISPO and the correction learn at least as GRPO does (not worse by more than the band),
# and GSPO with its paper's clip ranges learns, more slowly: those ranges fit the per-update policy
# change of a large model at lr ~1e-6, not of a tiny one at 2e-3.
OFF_POLICY_BAND = 0.15  # ~3 sd of GRPO's last quarter here; the widest gap between two seeds 0.15


def test_off_policy_cispo_and_the_correction_learn_at_least_as_grpo_does(tmp_path, digit_share, one_thread):
    stale = {"synchronizer": {"offset": 1}, "trainer": {"total_steps": 32}}
    runs = {"grpo": learn(tmp_path, "grpo", stale)}
    runs |= {name: learn(tmp_path, name, stale, {"algorithm": algorithm}) for name, algorithm in ALGORITHMS.items()}
    print("\nmean reward, first -> last quarter of 33 steps, staleness 1:", {n: str(r) for n, r in runs.items()})
    for name, run in runs.items():
        assert run.trainer["staleness"] > 0.9  # every step but the first trains on one-update-old rollouts
        assert run.last >= run.first + 0.15, f"{name} did not learn: {run}"
    for name in ("cispo", "grpo + token_truncate"):
        assert runs[name].last >= runs["grpo"].last - OFF_POLICY_BAND, f"{name}: {runs[name]}, grpo {runs['grpo']}"
    assert runs["gspo"].trainer["clip_frac"] > 0.3  # why it learns more slowly (grpo's: ~0.09)
    assert runs["grpo + token_truncate"].trainer["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
