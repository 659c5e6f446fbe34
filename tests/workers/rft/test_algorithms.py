"""The RL math against numbers worked out by hand (each literal's derivation is in its comment)."""
import math

import pytest
import torch

from workers.rft.algorithms import (
    ADVANTAGE_FNS,
    ALGORITHMS,
    EXPERT,
    KL_FNS,
    PAIRS,
    POLICY_LOSSES,
    USUAL,
    LossInputs,
    aggregate,
    compute_gae,
    dpo,
    entropy_from_logits,
    grpo,
    mix,
    ppo,
    reinforce_plus_plus_baseline,
    resolve,
    rloo,
    sft,
    value_loss,
    whiten,
    zero_std_mask,
)
from workers.rft.config import AlgorithmConfig, RunConfig
from workers.rft.registry import Registry


def close(actual, expected, tol=1e-5):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=tol)


# ---- registry -----------------------------------------------------------------------------------

def test_registry_rejects_duplicates_and_names_the_known_ones():
    reg = Registry("widget")
    reg.register("b")(len)
    reg.register("a")(abs)
    assert reg.get("a") is abs and "b" in reg and "c" not in reg and {} not in reg
    assert reg.names() == ["a", "b"] == list(reg)
    with pytest.raises(ValueError, match="duplicate widget 'a'"):
        reg.register("a")(min)
    with pytest.raises(KeyError, match="unknown widget 'c'; known: a, b"):
        reg.get("c")


def test_registries_hold_the_contract_names():
    assert ADVANTAGE_FNS.names() == [
        "grpo", "opmd", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo",
    ]
    assert POLICY_LOSSES.names() == [
        "cispo", "dpo", "gspo", "mix", "mix_chord", "opmd", "ppo", "sft", "sft_is", "sft_phi",
    ]
    assert KL_FNS.names() == ["k1", "k2", "k3", "low_var_kl", "none"]
    assert ADVANTAGE_FNS.get("ppo") is compute_gae


# ---- group advantages ---------------------------------------------------------------------------

def test_grpo_unbiased_std():
    # group [1,0,0,0]: mean 0.25, sample var (0.75² + 3·0.25²)/3 = 0.25, std 0.5
    # -> 0.75/0.5 = 1.5 and -0.25/0.5 = -0.5
    adv, metrics = grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]), [7, 7, 7, 7], epsilon=0.0)
    assert close(adv, [1.5, -0.5, -0.5, -0.5])
    assert metrics == {"zero_std_groups": 0, "compared_groups": 1, "zero_variance_groups": 0.0}


def test_grpo_population_std_is_a_setting():
    # population var 0.1875, std 0.4330127 -> 0.75/0.4330127 = √3 = 1.7320508, -1/√3 = -0.5773503
    adv, _ = grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]), [7, 7, 7, 7], epsilon=0.0, std_unbiased=False)
    assert close(adv, [1.7320508, -0.5773503, -0.5773503, -0.5773503])


def test_grpo_groups_are_independent_and_epsilon_applies():
    # group a [1,0] (interleaved with b): mean .5, sample std √0.5 = .7071068 -> ±0.5/(0.7071068 + 0.1) = ±0.6194960
    # group b [3,3]: std 0 -> 0; group c [5]: a group of one, mean 0 and std 1 -> 5/(1 + 0.1) = 4.5454545
    adv, metrics = grpo([1.0, 3.0, 0.0, 3.0, 5.0], ["a", "b", "a", "b", "c"], epsilon=0.1)
    assert close(adv, [0.6194960, 0.0, -0.6194960, 0.0, 4.5454545])
    # a group of one is neither a zero-std group nor compared: it keeps its reward
    assert metrics == {"zero_std_groups": 1, "compared_groups": 2, "zero_variance_groups": 0.5}


def test_grpo_equal_rewards_give_exactly_zero():
    # 0.1 is not exact in binary: a float mean/std could leave ±1e-9 residue; the result must be 0.0
    rewards = torch.full((7,), 0.1)
    adv, metrics = grpo(rewards, [0] * 7)
    assert torch.equal(adv, torch.zeros(7))
    assert metrics == {"zero_std_groups": 1, "compared_groups": 1, "zero_variance_groups": 1.0}
    assert zero_std_mask([0.1, 0.1, 1.0, 0.0, 2.0], ["x", "x", "y", "y", "z"]).tolist() == [
        True, True, False, False, False,
    ]


def test_grpo_without_std_normalize_is_mean_centred():
    # [1,0,0,0] - 0.25
    adv, _ = grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]), std_normalize=False)
    assert close(adv, [0.75, -0.25, -0.25, -0.25])


def test_rloo_subtracts_the_mean_of_the_others():
    # [2,4,9]: 2-(4+9)/2 = -4.5, 4-(2+9)/2 = -1.5, 9-(2+4)/2 = 6; [1,0,0]: 1-0 = 1, 0-0.5 = -0.5 twice;
    # [5] alone keeps its reward; [3,3] equal -> 0
    adv, metrics = rloo(
        torch.tensor([2.0, 4.0, 9.0, 1.0, 0.0, 0.0, 5.0, 3.0, 3.0]), [0, 0, 0, 1, 1, 1, 2, 3, 3]
    )
    assert close(adv, [-4.5, -1.5, 6.0, 1.0, -0.5, -0.5, 5.0, 0.0, 0.0])
    assert metrics == {"zero_std_groups": 1, "compared_groups": 3, "zero_variance_groups": 1 / 3}


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_and_the_trainer_whitens():
    # group means .5 and 1 -> [.5, -.5, 0, 0]; [2] alone keeps 2
    adv, metrics = reinforce_plus_plus_baseline(torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0]), [0, 0, 1, 1, 2])
    assert close(adv, [0.5, -0.5, 0.0, 0.0, 2.0])
    assert metrics == {"zero_std_groups": 1, "compared_groups": 2, "zero_variance_groups": 0.5}
    # whitened over tokens: one token each for [.5, -.5, 0, 0]: mean 0, sample var 0.5/3 -> ±0.5/0.4082483 = ±1.2247449
    (white,) = whiten([adv[:4, None]], [torch.ones(4, 1)])
    assert close(white.squeeze(-1), [1.2247449, -1.2247449, 0.0, 0.0])


# ---- GAE --------------------------------------------------------------------------------------------

REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.7]])


def test_gae_by_hand():
    # gamma .9, lam .8 (gamma·lam = .72):
    # t=2: delta = 1 - .7 = .3                     A2 = .3
    # t=1: delta = .9·.7 - .6 = .03                A1 = .03 + .72·.3 = .246
    # t=0: delta = .9·.6 - .5 = .04                A0 = .04 + .72·.246 = .21712
    # returns = A + V = [.71712, .846, 1.0]
    adv, ret = compute_gae(REWARDS, VALUES, torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert close(adv, [[0.21712, 0.246, 0.3]]) and close(ret, [[0.71712, 0.846, 1.0]])


def test_gae_gamma_lam_one_is_return_minus_value():
    # Monte Carlo: A_t = 1 - V_t
    adv, _ = compute_gae(REWARDS, VALUES, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert close(adv, [[0.5, 0.4, 0.3]])


def test_gae_skips_masked_tokens():
    # token 1 is masked (value 9 must be ignored): t=2 as before A2 = .3; t=0 links to t=2:
    # delta = .9·.7 - .5 = .13, A0 = .13 + .72·.3 = .346; returns [.846, 0, 1.0]
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.7]])
    adv, ret = compute_gae(REWARDS, values, mask, gamma=0.9, lam=0.8)
    assert close(adv, [[0.346, 0.0, 0.3]]) and close(ret, [[0.846, 0.0, 1.0]])
    # whitened over kept tokens (the trainer does it over the whole batch): mean .323, sample std
    # √(2·.023²/1) = .0325269 -> ±.023/.0325269 = ±0.7071068 (√½), the masked token 0
    (white,) = whiten([adv], [mask])
    assert close(white, [[0.7071068, 0.0, -0.7071068]], tol=1e-4)


# ---- aggregation ------------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # last row empty


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
    ("seq-mean-token-mean", 2.75),  # ((1+2)/2 + 4/1) / 2 sequences with tokens
    ("seq-mean-token-sum", 3.5),  # ((1+2) + 4) / 2
])
def test_aggregation_modes(mode, expected):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)
    assert aggregate(LOSS, torch.zeros(3, 3), mode).item() == 0.0  # nothing kept: 0, not NaN


def test_aggregation_rejects_unknown_mode():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(LOSS, MASK, "mean")


# ---- policy losses ------------------------------------------------------------------------------
# One signature for all: loss_fn(logprobs, LossInputs(...), algorithm config) -> (loss, metrics).

# ratios 1.5, 0.5, 1.1 (and a masked 4th token with a wild ratio that must not count)
OLD = torch.zeros(1, 4)
PPO_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def new_logprobs():
    return torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.1), 5.0]], requires_grad=True)


def algo(**values) -> AlgorithmConfig:
    """The algorithm section as validated, with expert data where its loss mixes it in."""
    mixes = {values.get("name"), values.get("policy_loss")} & {"mix", "mix_chord"}
    return RunConfig.from_dict({"algorithm": values, **({"buffer": {"expert_taskset": "gold"}} if mixes else {})}
                               ).algorithm


def rollouts(advantages, old=OLD, mask=PPO_MASK, **extra) -> LossInputs:
    return LossInputs(mask=mask, part=USUAL, old_logprobs=old, advantages=advantages, **extra)


def test_every_policy_loss_takes_one_signature_and_refuses_parts_it_cannot_train_on():
    import inspect

    for name in POLICY_LOSSES:
        assert list(inspect.signature(POLICY_LOSSES.get(name)).parameters) == ["logprobs", "inputs", "algo"], name
    with pytest.raises(ValueError, match="policy loss 'ppo' trains on usual rows, not on expert rows"):
        ppo(torch.zeros(1, 2), LossInputs(mask=torch.ones(1, 2), part=EXPERT), algo())
    with pytest.raises(ValueError, match="policy loss 'sft' trains on expert rows, not on usual rows"):
        sft(torch.zeros(1, 2), LossInputs(mask=torch.ones(1, 2)), algo(name="sft"))
    with pytest.raises(ValueError, match="policy loss 'dpo' trains on pairs rows"):
        dpo(torch.zeros(2, 2), LossInputs(mask=torch.ones(2, 2), part=EXPERT), algo(name="dpo"))


def test_ppo_positive_advantage():
    # A = 1, clip .2: per token max(-r, -clip(r, .8, 1.2)) = max(-1.5,-1.2), max(-.5,-.8), max(-1.1,-1.1)
    # = [-1.2, -.5, -1.1] -> mean -0.9333333; clipping wins only on token 0 -> clip_frac 1/3
    # approx_kl = mean(r - 1 - ln r) = (.0945349 + .1931472 + .0046898)/3 = .0974573; ratio_mean 3.1/3
    logprobs = new_logprobs()
    loss, metrics = ppo(logprobs, rollouts(torch.tensor([1.0])), algo(clip_range=0.2))
    assert loss.item() == pytest.approx(-0.9333333) and metrics["policy_loss"] == pytest.approx(-0.9333333)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    assert metrics["approx_kl"] == pytest.approx(0.0974573, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.0333333)
    # d/dlogp of -r is -r, /3 tokens; the clipped token 0 and the masked token 3 get no gradient
    loss.backward()
    assert close(logprobs.grad, [[0.0, -0.1666667, -0.3666667, 0.0]])


def test_ppo_negative_advantage_clips_the_other_side():
    # A = -1: max(1.5, 1.2), max(.5, .8), max(1.1, 1.1) = [1.5, .8, 1.1] -> 1.1333333; token 1 clipped
    loss, metrics = ppo(new_logprobs(), rollouts(torch.full((1, 4), -1.0)), algo(clip_range=0.2))
    assert loss.item() == pytest.approx(1.1333333)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)


def test_ppo_dual_clip_bounds_what_a_negative_advantage_costs():
    # A = -1, one token at ratio 5: max(5, 1.2) = 5, bounded by -A·clip_ratio_c = 3 (verl, Trinity).
    # Its gradient is then 0: the bound is a constant.
    logprobs = torch.tensor([[math.log(5.0)]], requires_grad=True)
    inputs = rollouts(torch.tensor([-1.0]), old=torch.zeros(1, 1), mask=torch.ones(1, 1))
    loss, metrics = ppo(logprobs, inputs, algo())
    assert loss.item() == pytest.approx(3.0) and metrics["clip_frac_lower"] == 1.0
    loss.backward()
    assert logprobs.grad.item() == 0.0
    loss, metrics = ppo(logprobs, inputs, algo(clip_ratio_c=None))  # off: as rftweb before
    assert loss.item() == pytest.approx(5.0) and "clip_frac_lower" not in metrics


def test_ppo_separate_low_and_high_clip():
    # A = 1, low .1, high .3: clip(r, .9, 1.3) = [1.3, .9, 1.1] -> max(-1.5,-1.3), max(-.5,-.9), -1.1
    # = [-1.3, -.5, -1.1] -> -0.9666667
    loss, _ = ppo(new_logprobs(), rollouts(torch.tensor([1.0])), algo(clip_range_low=0.1, clip_range_high=0.3))
    assert loss.item() == pytest.approx(-0.9666667)


def test_ppo_on_policy_has_no_clipping_and_zero_kl():
    inputs = rollouts(torch.tensor([2.0, -1.0]), old=torch.zeros(2, 3), mask=torch.ones(2, 3))
    loss, metrics = ppo(torch.zeros(2, 3), inputs, algo())
    # ratio 1 everywhere: loss = mean of -A over tokens = (-2·3 + 1·3)/6 = -0.5
    assert loss.item() == pytest.approx(-0.5)
    assert metrics == {
        "policy_loss": -0.5, "clip_frac": 0.0, "clip_frac_lower": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0,
    }


def test_ppo_adds_the_kl_penalty_and_the_entropy_bonus():
    # On policy (ratio 1), A = 1 on both tokens: surrogate -1. d = logp - ref = [.5, -1] (the KL
    # cases below): k2 token-mean (.125 + .5)/2 = .3125, times coef .2 = .0625.
    # Uniform logits over 4: entropy ln 4 = 1.3862944 per token, times coef .1 = .1386294.
    # -1 + .0625 - .1386294 = -1.0761294
    logp = torch.tensor([[-1.0, -2.0]])
    inputs = rollouts(torch.tensor([1.0]), old=logp, mask=torch.ones(1, 2), ref_logprobs=torch.tensor([[-1.5, -1.0]]),
                      entropy=entropy_from_logits(torch.zeros(1, 2, 4)))
    loss, metrics = ppo(logp, inputs, algo(kl={"fn": "k2", "coef": 0.2}, entropy_coef=0.1))
    assert loss.item() == pytest.approx(-1.0761294)
    assert metrics["policy_loss"] == pytest.approx(-1.0) and metrics["kl"] == pytest.approx(0.3125)
    assert metrics["entropy"] == pytest.approx(1.3862944)
    # kl.fn none: no penalty, no metric, though reference log-probs are given
    loss, metrics = ppo(logp, inputs, algo(entropy_coef=0.1))
    assert loss.item() == pytest.approx(-1.1386294) and "kl" not in metrics


def test_sft_is_masked_negative_log_likelihood():
    logprobs = -LOSS  # so -logp is LOSS: the aggregation cases above carry over
    expert = LossInputs(mask=MASK, part=EXPERT)
    assert sft(logprobs, expert, algo(name="sft"))[0].item() == pytest.approx(7 / 3)
    loss, metrics = sft(logprobs, expert, algo(name="sft", loss_agg_mode="seq-mean-token-sum"))
    assert loss.item() == pytest.approx(3.5) and metrics == {"sft_loss": pytest.approx(3.5)}


def pair_rows(chosen, rejected, ref_chosen, ref_rejected):
    """Sequence log-probs as one-token rows: chosen rows first, then rejected ones (dpo's layout)."""
    policy = torch.tensor(chosen + rejected)[:, None]
    reference = torch.tensor(ref_chosen + ref_rejected)[:, None]
    return policy, LossInputs(mask=torch.ones_like(policy), part=PAIRS, ref_logprobs=reference)


def test_dpo_by_hand():
    # pair 0: (−1 − −1.5) − (−3 − −2.5) = 1   -> logit .1;  pair 1: (−2 − −2) − (−1 − −1.5) = −.5 -> −.05
    # loss = mean(ln(1 + e^−.1), ln(1 + e^.05)) = mean(.6443967, .7184597) = .6814282
    loss, metrics = dpo(
        *pair_rows([-1.0, -2.0], [-3.0, -1.0], [-1.5, -2.0], [-2.5, -1.5]), algo(name="dpo", dpo={"beta": 0.1})
    )
    assert loss.item() == pytest.approx(0.6814282)
    assert metrics["dpo_acc"] == 0.5 and metrics["dpo_margin"] == pytest.approx(0.025)
    # no preference learned yet: ln 2
    zeros = pair_rows([0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3)
    assert dpo(*zeros, algo(name="dpo", dpo={"beta": 0.5}))[0].item() == pytest.approx(0.6931472)
    # the first case again, as two-token rows: a sequence's log-prob is the sum over its kept
    # tokens ([-.5, -.5] is -1; the masked -9 and -7 do not count)
    policy = torch.tensor([[-0.5, -0.5], [-2.0, -9.0], [-1.0, -2.0], [-1.0, -9.0]])
    inputs = LossInputs(mask=torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), part=PAIRS,
                        ref_logprobs=torch.tensor([[-1.0, -0.5], [-2.0, -7.0], [-2.5, 0.0], [-1.5, 0.0]]))
    assert dpo(policy, inputs, algo(name="dpo", dpo={"beta": 0.1}))[0].item() == pytest.approx(0.6814282)


def test_mix_weights_ppo_on_rollouts_and_sft_on_expert_data():
    # mu .25: the rollouts' part is .75 · ppo (-0.9333333, the case above) = -0.7; the expert part
    # .25 · NLL (7/3, the aggregation case) = 0.5833333; metrics report each term unweighted.
    mixed = algo(name="mix", mix={"mu": 0.25}, clip_range=0.2)
    policy_part, metrics = mix(new_logprobs(), rollouts(torch.tensor([1.0])), mixed)
    assert policy_part.item() == pytest.approx(-0.7) and metrics["policy_loss"] == pytest.approx(-0.9333333)
    expert_part, metrics = mix(-LOSS, LossInputs(mask=MASK, part=EXPERT), mixed)
    assert expert_part.item() == pytest.approx(0.5833333) and metrics == {"sft_loss": pytest.approx(7 / 3)}
    # mu 0: pure policy; mu 1: pure SFT
    pure_policy = mix(new_logprobs(), rollouts(torch.tensor([1.0])), algo(name="mix", mix={"mu": 0.0}))[0]
    assert pure_policy.item() == pytest.approx(-0.9333333)
    pure_sft = mix(-LOSS, LossInputs(mask=MASK, part=EXPERT), algo(name="mix", mix={"mu": 1.0}))[0]
    assert pure_sft.item() == pytest.approx(7 / 3)


# ---- KL, entropy, value loss --------------------------------------------------------------------

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # d = [.5, -1]


@pytest.mark.parametrize("name, expected", [
    ("none", [[0.0, 0.0]]),
    ("k1", [[0.5, -1.0]]),
    ("k2", [[0.125, 0.5]]),  # d²/2
    ("k3", [[0.1065307, 0.7182818]]),  # e^−.5 − 1 + .5 = .6065307 − .5; e^1 − 1 − 1
    ("low_var_kl", [[0.1065307, 0.7182818]]),  # inside the clamp: same as k3
])
def test_kl_estimators(name, expected):
    assert close(KL_FNS.get(name)(LOGP, REF), expected)


def test_low_var_kl_clamps_and_keeps_gradients_finite():
    logp = torch.tensor([[-16.0, 30.0, -200.0]], requires_grad=True)
    kl = KL_FNS.get("low_var_kl")(logp, torch.tensor([[-1.0, 0.0, 0.0]]))
    # d = -15: e^15 - 16 ≈ 3.3e6 -> 10; d = 30 -> clamped to 20: e^-20 + 19 -> 10
    assert close(kl, [[10.0, 10.0, 10.0]])
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_entropy_from_logits():
    # uniform over 4: ln 4 = 1.3862944; p = (.25, .75): .25·ln4 + .75·ln(4/3) = .3465736 + .2157616
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    assert close(entropy_from_logits(logits), [[1.3862944, 0.5623351]])


def test_value_loss_is_clipped_around_old_values():
    # token 0: v 1.0, old .5 -> clipped .7; (1-0)² = 1 vs (.7-0)² = .49 -> 1.0, unclipped wins
    # token 1: v .9, old 0 -> clipped .2; (.9-1)² = .01 vs (.2-1)² = .64 -> .64, clipped wins
    # loss = .5 · mean(1.0, .64) = .41, vf_clip_frac .5
    values = torch.tensor([[1.0, 0.9]], requires_grad=True)
    loss, metrics = value_loss(values, torch.tensor([[0.5, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.ones(1, 2), 0.2)
    assert loss.item() == pytest.approx(0.41) and metrics["vf_clip_frac"] == 0.5
    loss.backward()
    # d/dv of .5·(v - 0)²/2 = v/2 = .5 on token 0; token 1 is clipped: no gradient
    assert close(values.grad, [[0.5, 0.0]])


def test_gradients_flow_through_a_full_policy_step():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    tokens = torch.tensor([[1, 2, 3], [4, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    logprobs = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = logprobs.detach() + 0.05
    adv, _ = grpo(torch.tensor([1.0, 0.0]), [0, 0])
    loss, _ = ppo(logprobs, rollouts(adv, old=old, mask=mask),
                  algo(clip_range_low=0.2, clip_range_high=0.28, loss_agg_mode="seq-mean-token-mean"))
    loss = loss + 0.1 * aggregate(KL_FNS.get("low_var_kl")(logprobs, old - 0.1), mask, "token-mean")
    loss = loss - 0.01 * aggregate(entropy_from_logits(logits), mask, "token-mean")
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0].abs().sum() > 0 and logits.grad[1, 0].abs().sum() > 0
    assert torch.equal(logits.grad[1, 1:], torch.zeros(2, 5))  # masked positions: no term reaches them


# ---- presets ------------------------------------------------------------------------------------

def test_presets():
    assert ALGORITHMS["grpo"].advantage_fn == "grpo" and ALGORITHMS["grpo"].policy_loss == "ppo"
    assert ALGORITHMS["ppo"].needs_critic and ALGORITHMS["dpo"].needs_reference
    assert not ALGORITHMS["sft"].uses_rollouts and ALGORITHMS["sft"].uses_expert
    assert ALGORITHMS["mix"].sample_strategy == "mix" and ALGORITHMS["mix"].uses_rollouts
    assert ALGORITHMS["dpo"].sample_strategy == "pairs"


def test_resolve_applies_overrides():
    spec = resolve(RunConfig())
    assert (spec.advantage_fn, spec.policy_loss) == ("grpo", "ppo")
    assert not spec.needs_reference and not spec.needs_critic
    assert resolve(RunConfig.from_dict({"algorithm": {"kl": {"fn": "k3", "coef": 0.01}}})).needs_reference
    spec = resolve(RunConfig.from_dict({"algorithm": {"advantage_fn": "ppo"}}))
    assert spec.advantage_fn == "ppo" and spec.needs_critic
    spec = resolve(RunConfig.from_dict({"algorithm": {"policy_loss": "mix"}, "buffer": {"expert_taskset": "gold"}}))
    assert (spec.policy_loss, spec.sample_strategy, spec.uses_expert) == ("mix", "mix", True)
    dpo_run = {"mode": "train", "algorithm": {"name": "dpo"}, "synchronizer": {"method": "checkpoint"}}
    spec = resolve(RunConfig.from_dict(dpo_run))
    assert spec.needs_reference and not spec.uses_rollouts and spec.advantage_fn is None
