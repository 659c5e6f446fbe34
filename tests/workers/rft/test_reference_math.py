"""The RL math against the reference implementations (verl, TRL, Trinity-RFT), each re-implemented below in
fp64 from its source (the comment names the repository, file and function), on random inputs and the edge
cases: groups of one, groups of equal rewards, rows with nothing kept, one kept token, environment tokens
inside a response (mask 1,1,0,0,1,1). Values agree to 1e-9; where the reference stops gradients (GSPO, CISPO,
sft_is, sft_phi), so do the gradients d loss / d logprobs.

verl is commit b178a3c (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py); TRL's GRPO is
trl/trainer/grpo_trainer.py at the mirrored HEAD, its DPO sigmoid loss v0.28.0 (the last release whose
'sigmoid' loss reads label_smoothing); Trinity-RFT is modelscope/Trinity-RFT under trinity/algorithm/.
verl's and Trinity's masked means divide by count + 1e-8: the inputs are of moderate size so that this
shifts nothing by 1e-9, except in verl's seq-mean-token-mean (AGG_RTOL).
"""
import math
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

from workers.rft.algorithms import (
    EXPERT,
    PAIRS,
    POLICY_LOSSES,
    USUAL,
    LossInputs,
    aggregate,
    compute_gae,
    discounted_returns,
    entropy_from_logits,
    grpo,
    last_token_rewards,
    opmd,
    reinforce_plus_plus_baseline,
    rloo,
    value_loss,
    whiten,
)
from workers.rft.algorithms.correction import rollout_correction_weights
from workers.rft.algorithms.kl import KL_FNS
from workers.rft.config import AlgorithmConfig

F64 = torch.float64
CASES = [(0, (6, 8)), (1, (10, 10)), (2, (16, 12))]  # seed, (rows, tokens); even rows, so DPO can pair them


# verl's seq-mean-token-mean divides each row's sum by its count + 1e-8: its values are off by up to 1e-8 relative
# (a one-token row's gradient 0.1 by 1e-9), so that mode is compared to 1e-8 relative as well
AGG_RTOL = {"seq-mean-token-mean": 1e-8}


def close(actual, expected, atol=1e-9, rtol=0.0):
    actual = torch.as_tensor(actual).detach().to(F64)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=F64).detach(), rtol=rtol, atol=atol)


def algo_config(**fields) -> AlgorithmConfig:
    """The default AlgorithmConfig with `fields` replaced; a dict replaces fields of a nested config."""
    base = AlgorithmConfig()
    for key, value in fields.items():
        if isinstance(value, dict):
            fields[key] = getattr(base, key).model_copy(update=value)
    return base.model_copy(update=fields)


# ---- inputs -------------------------------------------------------------------------------------

def make_mask(gen, rows, length, interior=True):
    """[B, T] 0/1: random lengths (padding after the end), random environment tokens inside (interior), and the
    edge rows: row 0 is 1,1,0,0,1,1,0.. (a second turn after environment tokens), row 1 keeps nothing, row 2 one
    token."""
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).to(F64)
    if interior:
        mask *= (torch.rand(rows, length, generator=gen) > 0.2).to(F64)
        mask[0] = torch.tensor([1, 1, 0, 0, 1, 1] + [0] * (length - 6), dtype=F64)
    else:
        mask[0] = 1.0
    mask[1] = 0.0
    mask[2] = torch.tensor([1] + [0] * (length - 1), dtype=F64)
    return mask


def make_groups(gen, rows, binary):
    """Rewards [B] and group ids, interleaved: random groups, a group of one, a group of 3 equal rewards (0.1 is not
    exact in binary, so a float mean and std of that group carry rounding)."""
    if binary:
        rewards = torch.randint(0, 2, (rows,), generator=gen).to(F64)
    else:
        rewards = torch.randn(rows, generator=gen, dtype=F64)
    ids = [f"task{int(i)}" for i in torch.randint(0, max(2, rows // 3), (rows,), generator=gen)]
    ids[0], ids[1:4] = "alone", ["flat"] * 3
    rewards[1:4] = 0.1
    order = torch.randperm(rows, generator=gen)
    return rewards[order], [ids[i] for i in order]


def make_rollouts(gen, rows, length, token_advantages=False, scale=1.0):
    """mask, old log-probs, new log-probs and advantages of a USUAL micro-batch. The log-ratios are mostly small
    (some inside the clip range, some outside); on kept tokens a few are ±1.5 (+1.5: past clip_ratio_c = 3 for the
    dual clip) and one is +25 (past verl's clamp of the log-ratio at 20). Advantages: N(0, scale²), row 3's exactly 0
    (a group of equal rewards)."""
    mask = make_mask(gen, rows, length)
    old = -3 * torch.rand(rows, length, generator=gen, dtype=F64) - 0.01
    shift = torch.zeros(rows * length, dtype=F64)
    kept = mask.flatten().nonzero().squeeze(1)
    picked = kept[torch.randperm(len(kept), generator=gen)]
    shift[picked[0]], shift[picked[1:7]], shift[picked[7:10]] = 25.0, 1.5, -1.5
    new = old + 0.25 * torch.randn(rows, length, generator=gen, dtype=F64) + shift.view(rows, length)
    shape = (rows, length) if token_advantages else (rows,)
    advantages = scale * torch.randn(shape, generator=gen, dtype=F64)
    advantages[3] = 0.0
    return mask, old, new, advantages


def token_level(advantages, mask):
    return advantages[:, None].expand_as(mask) if advantages.dim() == 1 else advantages


def loss_and_grad(fn, logprobs):
    """fn(x) -> loss or (loss, metrics): the loss, d loss / d x, and the metrics ({} if none)."""
    x = logprobs.detach().clone().requires_grad_(True)
    out = fn(x)
    loss, metrics = out if isinstance(out, tuple) else (out, {})
    (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
    return loss.detach(), torch.zeros_like(x) if grad is None else grad, metrics


def ours(name, logprobs, inputs, algo):
    return loss_and_grad(lambda x: POLICY_LOSSES.get(name)(x, inputs, algo), logprobs)


# ---- the references, fp64 -----------------------------------------------------------------------

def ref_masked_mean(values, mask, dim=None):
    # verl torch_functional.py masked_mean (= masked_sum / (count + 1e-8)); Trinity trinity/algorithm/utils.py
    # masked_mean is the same
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(dim=dim) / (mask.sum(dim=dim) + 1e-8)


def ref_masked_whiten(values, mask):
    # verl torch_functional.py masked_var (unbiased) and masked_whiten (shift_mean=True)
    mean = ref_masked_mean(values, mask)
    variance = ref_masked_mean((values - mean) ** 2, mask)
    mask_sum = mask.sum()
    assert mask_sum > 1, "verl raises here"
    variance = variance * mask_sum / (mask_sum - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def ref_agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None):
    # verl core_algos.py agg_loss with dp_size=1 and no global batch info
    if loss_agg_mode == "token-mean":
        return (torch.where(loss_mask.bool(), loss_mat, 0.0) * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).to(F64)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).to(F64)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    assert loss_agg_mode == "seq-mean-token-sum-norm"
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    return torch.sum(seq_losses) / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)


def ref_grpo(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    # verl core_algos.py compute_grpo_outcome_advantage (Trinity grpo_advantage.py GRPOAdvantageFn is the same);
    # the per-rollout scalar, before verl multiplies it into the response mask
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(group)), torch.std(torch.stack(group))
    if norm_adv_by_std_in_grpo:
        return torch.stack([(scores[i] - id2mean[g]) / (id2std[g] + epsilon) for i, g in enumerate(index)])
    return torch.stack([scores[i] - id2mean[g] for i, g in enumerate(index)])


def ref_rloo(scores, index):
    # verl core_algos.py compute_rloo_outcome_advantage (a group of one keeps its score)
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    out = scores.clone()
    for i, g in enumerate(index):
        n = len(id2score[g])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - torch.mean(torch.stack(id2score[g])) * n / (n - 1)
    return out


def ref_reinforce_plus_plus_baseline(token_level_rewards, response_mask, index):
    # verl core_algos.py compute_reinforce_plus_plus_baseline_outcome_advantage
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean = {g: torch.mean(torch.stack(s)) if len(s) > 1 else torch.tensor(0.0, dtype=F64)
               for g, s in id2score.items()}
    scores = torch.stack([scores[i] - id2mean[g] for i, g in enumerate(index)])
    scores = scores.unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
    return ref_masked_whiten(scores, response_mask) * response_mask


def ref_opmd_advantage(scores, index, opmd_baseline="mean", tau=1.0):
    # Trinity trinity/algorithm/advantage_fn/opmd_advantage.py OPMDAdvantageFn (Trinity takes the baseline in
    # float32: torch.tensor(id2score[idx]); here in fp64); a group of one has baseline 0
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2baseline = {}
    for idx, group in id2score.items():
        rewards = torch.stack(group)
        if len(group) == 1:
            id2baseline[idx] = torch.tensor(0.0, dtype=F64)
        elif opmd_baseline == "mean":
            id2baseline[idx] = torch.mean(rewards)
        else:  # logavgexp(x) = logsumexp(x) - log(len(x))
            id2baseline[idx] = tau * (torch.logsumexp(rewards / tau, dim=-1) - math.log(len(group)))
    return torch.stack([scores[i] - id2baseline[g] for i, g in enumerate(index)])


def ref_gae(token_level_rewards, values, response_mask, gamma, lam):
    # verl core_algos.py compute_gae_advantage_return, before its last step: advantages = masked_whiten(advantages,
    # response_mask); values and TD errors of masked (observation) tokens are skipped
    nextvalues, lastgaelam, advantages_reversed = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def ref_reinforce_plus_plus_returns(token_level_rewards, response_mask, gamma):
    # verl core_algos.py compute_reinforce_plus_plus_outcome_advantage: returns (its advantages are
    # masked_whiten(returns, response_mask) * response_mask). The running return is reset after every masked token
    running_return, returns = 0, torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    return returns


def ref_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_ratio_low, clip_ratio_high,
                clip_ratio_c=3.0, rollout_is_weights=None):
    # verl core_algos.py compute_policy_loss_vanilla -> (pg_loss, metrics). Trinity's
    # PPOPolicyLossFn (ppo_policy_loss.py) is the same. clip_ratio_c None (rftweb: no dual clip) skips the dual clip
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = ref_masked_mean(torch.gt(pg_losses2, pg_losses1).to(F64), response_mask)
    pg_losses, pg_clipfrac_lower = clip_pg_losses1, torch.tensor(0.0, dtype=F64)
    if clip_ratio_c is not None:
        pg_losses3 = -advantages * clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_clipfrac_lower = ref_masked_mean(
            torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).to(F64), response_mask
        )
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = ref_agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"pg_clipfrac": pg_clipfrac.item(), "pg_clipfrac_lower": pg_clipfrac_lower.item()}


def ref_gspo(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
             loss_agg_mode="seq-mean-token-mean", rollout_is_weights=None):
    # verl core_algos.py compute_policy_loss_gspo (verl forces loss_agg_mode="seq-mean-token-mean")
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_seq_importance_ratio, max=10.0))
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return ref_agg_loss(pg_losses, response_mask, loss_agg_mode)


def ref_cispo(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, loss_agg_mode,
              rollout_is_weights=None):
    # verl core_algos.py compute_policy_loss_cispo: -sg(clip(ratio)) * A * log_prob
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clipped_ratio_sg = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    pg_losses = -clipped_ratio_sg * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return ref_agg_loss(pg_losses, response_mask, loss_agg_mode)


def ref_opmd_loss(logprob, action_mask, advantages, tau):
    # Trinity trinity/algorithm/policy_loss_fn/opmd_policy_loss.py OPMDPolicyLossFn
    return ref_masked_mean(-advantages * logprob, action_mask) / (1.0 + tau)


def ref_sft(logprob, action_mask):
    # Trinity trinity/algorithm/policy_loss_fn/sft_loss.py SFTLossFn, use_token_level_loss=True
    return ref_masked_mean(-logprob, action_mask)


def ref_sft_is(logprob, action_mask):
    # Trinity trinity/algorithm/policy_loss_fn/chord_policy_loss.py SFTISLossFn, use_token_level_loss=True
    return ref_masked_mean(-logprob * torch.exp(logprob).detach(), action_mask)


def ref_sft_phi(logprob, action_mask):
    # Trinity chord_policy_loss.py SFTPhiLossFn, use_token_level_loss=True, cutoff_prob=1.0; phi(p) = p (1 - p)
    token_prob = torch.exp(logprob)
    return ref_masked_mean(-logprob * (token_prob * (1 - token_prob)).detach(), action_mask)


def ref_mu(global_step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley):
    # Trinity chord_policy_loss.py mu_schedule_function: linear warmup, then cosine decay to the valley
    if global_step < mu_warmup_steps:
        return (global_step / mu_warmup_steps) * mu_peak
    if global_step >= (mu_warmup_steps + mu_decay_steps):
        return mu_valley
    adjusted_step = global_step - mu_warmup_steps
    cosine_decay = 0.5 * (1 + math.cos(math.pi * adjusted_step / mu_decay_steps))
    return (mu_peak - mu_valley) * cosine_decay + mu_valley


def ref_dpo_sigmoid(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, label_smoothing):
    # TRL v0.28.0 trl/trainer/dpo_trainer.py DPOTrainer.dpo_loss, loss_type "sigmoid" (cDPO label smoothing); the
    # trainer takes losses.mean()
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
              - F.logsigmoid(-beta * logits) * label_smoothing)
    return losses.mean()


def ref_vllm_is_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_min, clip_max):
    # TRL trl/trainer/grpo_trainer.py _generate_and_score_completions, vllm_importance_sampling_correction
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    if mode in ("sequence_mask", "sequence_truncate"):
        ratio = torch.exp(per_token_logps_diff.sum(dim=-1, keepdim=True))
    else:
        ratio = torch.exp(per_token_logps_diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def ref_kl_penalty(logprob, ref_logprob, kl_penalty):
    # verl core_algos.py kl_penalty_forward
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    assert kl_penalty in ("low_var_kl", "k3")
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def ref_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode):
    # verl core_algos.py compute_value_loss -> (vf_loss, vf_clipfrac); clip_by_value is max(min(x, high), low)
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * ref_agg_loss(torch.max(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    return vf_loss, {"vf_clipfrac": ref_masked_mean(torch.gt(vf_losses2, vf_losses1).to(F64), response_mask).item()}


def ref_entropy(logits):
    # verl torch_functional.py entropy_from_logits
    return torch.logsumexp(logits, dim=-1) - torch.sum(F.softmax(logits, dim=-1) * logits, dim=-1)


# ---- group advantages ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("std_normalize, epsilon", [(True, 1e-6), (True, 0.1), (False, 1e-6)])
def test_grpo_matches_verl(seed, shape, binary, std_normalize, epsilon):
    # std_normalize=False is Dr. GRPO (verl norm_adv_by_std_in_grpo=False); a group of one: mean 0, std 1
    rewards, ids = make_groups(torch.Generator().manual_seed(seed), shape[0], binary)
    adv, _ = grpo(rewards, ids, epsilon=epsilon, std_normalize=std_normalize)
    close(adv, ref_grpo(rewards, ids, epsilon, std_normalize))
    alone = ids.index("alone")
    assert adv[alone].item() == pytest.approx(rewards[alone].item() / (1 + epsilon if std_normalize else 1), abs=1e-12)
    assert all(adv[i].item() == 0.0 for i, g in enumerate(ids) if g == "flat")  # rftweb: exactly 0


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("binary", [True, False])
def test_rloo_matches_verl(seed, shape, binary):
    rewards, ids = make_groups(torch.Generator().manual_seed(seed), shape[0], binary)
    adv, _ = rloo(rewards, ids)
    close(adv, ref_rloo(rewards, ids))


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("binary", [True, False])
def test_reinforce_plus_plus_baseline_then_whiten_matches_verl(seed, shape, binary):
    gen = torch.Generator().manual_seed(seed)
    rewards, ids = make_groups(gen, shape[0], binary)
    mask = make_mask(gen, *shape)
    adv, _ = reinforce_plus_plus_baseline(rewards, ids)
    token_level_rewards = torch.zeros_like(mask)
    token_level_rewards[:, -1] = rewards  # verl sums each row: where the reward sits does not matter
    close(whiten([adv[:, None] * mask], [mask])[0], ref_reinforce_plus_plus_baseline(token_level_rewards, mask, ids))


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("baseline, tau", [("mean", 1.0), ("logavgexp", 1.0), ("logavgexp", 0.3)])
def test_opmd_advantage_matches_trinity(seed, shape, binary, baseline, tau):
    rewards, ids = make_groups(torch.Generator().manual_seed(seed), shape[0], binary)
    adv, _ = opmd(rewards, ids, baseline=baseline, tau=tau)
    close(adv, ref_opmd_advantage(rewards, ids, baseline, tau))


# ---- per-token advantages and returns -----------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (1.0, 0.0)])
def test_gae_matches_verl(seed, shape, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    # a reward on each row's last kept token plus a per-token penalty (verl's KL-in-reward) on every kept token
    token_rewards = (0.1 * torch.randn(shape, generator=gen, dtype=F64)
                     + last_token_rewards(torch.randn(shape[0], generator=gen, dtype=F64), mask)) * mask
    values = torch.randn(shape, generator=gen, dtype=F64)
    advantages, returns = compute_gae(token_rewards, values, mask, gamma, lam)
    ref_advantages, ref_returns = ref_gae(token_rewards, values, mask, gamma, lam)
    close(advantages * mask, ref_advantages * mask)  # verl carries the next kept token's value over masked ones
    assert torch.all(advantages[mask == 0] == 0)
    close(returns * mask, ref_returns * mask)
    close(whiten([advantages], [mask])[0], ref_masked_whiten(ref_advantages, mask) * mask)


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("interior", [False, True], ids=["padding-only", "environment-tokens-inside"])
def test_discounted_returns_match_verl_reinforce_plus_plus(seed, shape, gamma, interior):
    # verl resets the running return at every masked token (written for the padding after EOS); rftweb skips
    # masked tokens as GAE does, so with environment tokens inside a response the model's earlier turns keep their
    # return. Padding only: verl's figures. Environment tokens inside: verl's on the row with them taken out.
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape, interior=interior)
    token_rewards = last_token_rewards(torch.randn(shape[0], generator=gen, dtype=F64), mask)
    returns = discounted_returns(token_rewards, mask, gamma)
    ref_returns = torch.zeros_like(token_rewards)
    for i in range(shape[0]):
        kept = mask[i] > 0
        compact = ref_reinforce_plus_plus_returns(token_rewards[i, kept][None], torch.ones(1, int(kept.sum())), gamma)
        ref_returns[i, kept] = compact[0]
    if not interior:
        ref_returns = ref_reinforce_plus_plus_returns(token_rewards, mask, gamma)
    close(returns * mask, ref_returns * mask)
    close(whiten([returns], [mask])[0], ref_masked_whiten(ref_returns, mask) * mask)


# ---- whitening over micro-batches ---------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_whiten_over_micro_batches_is_verl_masked_whiten_of_the_whole_batch(seed, shape, chunks):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    values = 2.0 + torch.randn(shape, generator=gen, dtype=F64)
    parts = whiten(list(values.tensor_split(chunks)), list(mask.tensor_split(chunks)))
    assert len(parts) == chunks
    close(torch.cat(parts), ref_masked_whiten(values, mask) * mask)
    close(torch.cat(parts), whiten([values], [mask])[0])


@pytest.mark.parametrize("seed, shape", CASES)
def test_whiten_total_sums_the_statistics_over_ranks(seed, shape):
    # two ranks holding the same rows: their sums are twice this rank's, i.e. the batch is these rows twice over
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    values = torch.randn(shape, generator=gen, dtype=F64)
    parts = whiten(list(values.tensor_split(2)), list(mask.tensor_split(2)), total=lambda t: 2 * t)
    expected = ref_masked_whiten(torch.cat([values, values]), torch.cat([mask, mask]))[: shape[0]] * mask
    close(torch.cat(parts), expected)


def test_whiten_with_one_kept_token_or_none_is_zero():
    values = torch.randn(3, 4, dtype=F64)
    one = torch.zeros(3, 4, dtype=F64)
    one[1, 2] = 1.0
    for mask in (one, torch.zeros(3, 4, dtype=F64)):
        (out,) = whiten([values], [mask])
        assert torch.equal(out, torch.zeros_like(values))


@pytest.mark.parametrize("seed, shape", CASES)
def test_last_token_rewards_sit_on_the_last_kept_token(seed, shape):
    # verl's NaiveRewardManager puts the score at valid_response_length - 1 (the response's last token); rftweb's
    # is the last token the model wrote (mask 1), environment tokens inside or after it
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    mask[3] = torch.tensor([0, 0, 1, 1] + [0] * (shape[1] - 4), dtype=F64)  # environment tokens first
    rewards = torch.randn(shape[0], generator=gen, dtype=F64)
    expected = torch.zeros(shape, dtype=F64)
    for i in range(shape[0]):
        kept = mask[i].nonzero()
        if len(kept):
            expected[i, kept.max()] = rewards[i]
    close(last_token_rewards(rewards, mask), expected, atol=0)


# ---- aggregation --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_matches_verl_agg_loss(seed, shape, mode):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    loss_mat = 0.1 * torch.randn(shape, generator=gen, dtype=F64)
    close(aggregate(loss_mat, mask, mode), ref_agg_loss(loss_mat, mask, mode))


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("scale", [None, 7.0])
def test_aggregate_seq_mean_token_sum_norm_is_verl_over_the_non_empty_rows(seed, shape, scale):
    # verl's agg_loss returns sum(seq_losses) / loss_scale_factor, a sum over the micro-batch's rows; rftweb divides
    # by the number of rows that keep a token as well, so the value does not depend on micro_batch_size. verl's
    # default scale is the padded length T (mask.shape[-1]); rftweb's is explorer.max_new_tokens, set by the config
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    loss_mat = torch.randn(shape, generator=gen, dtype=F64)
    scale = scale or shape[1]
    rows = (mask.sum(-1) > 0).sum()
    expected = ref_agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", scale) / rows
    close(aggregate(loss_mat, mask, "seq-mean-token-sum-norm", scale=scale), expected)


# ---- policy losses ------------------------------------------------------------------------------

CLIPS = [  # clip_range, clip_range_low, clip_range_high, clip_ratio_c
    (0.2, None, None, 3.0),
    (0.2, 0.1, 0.28, 3.0),  # DAPO's clip-higher
    (0.2, None, None, None),  # no dual clip
    (0.3, None, None, 1.5),
]



@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("token_advantages, is_weights", [(False, False), (True, False), (False, True)])
def test_ppo_matches_verl_vanilla(seed, shape, mode, clip, token_advantages, is_weights):
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, token_advantages, scale=0.3)
    weights = 0.5 + torch.rand(shape, generator=gen, dtype=F64) if is_weights else None
    clip_range, low, high, clip_ratio_c = clip
    algo = algo_config(clip_range=clip_range, clip_range_low=low, clip_range_high=high, clip_ratio_c=clip_ratio_c,
                       loss_agg_mode=mode)
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, is_weights=weights)
    loss, grad, metrics = ours("ppo", new, inputs, algo)
    low, high, advantages = low or clip_range, high or clip_range, token_level(advantages, mask)
    ref_loss, ref_grad, ref_metrics = loss_and_grad(
        lambda x: ref_vanilla(old, x, advantages, mask, mode, low, high, clip_ratio_c, weights), new
    )
    # without the dual clip a negative advantage times the ratio e^20 (the +25 log-ratio) is ~1e8: 1e-12 relative
    close(loss, ref_loss, rtol=max(1e-12, AGG_RTOL.get(mode, 0.0)))
    close(grad, ref_grad, rtol=AGG_RTOL.get(mode, 0.0))
    assert metrics["clip_frac"] == pytest.approx(ref_metrics["pg_clipfrac"], abs=1e-9)
    if clip_ratio_c is not None:
        assert metrics["clip_frac_lower"] == pytest.approx(ref_metrics["pg_clipfrac_lower"], abs=1e-9)


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_ppo_kl_penalty_and_entropy_bonus_match_verl_actor(seed, shape, mode):
    # verl workers/actor/dp_actor.py update_policy: policy_loss = pg_loss - entropy_coeff * agg_loss(entropy)
    # + kl_loss_coef * agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type)), all with loss_agg_mode
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, scale=0.3)
    ref_logprobs = new + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    logits = 2 * torch.randn(*shape, 7, generator=gen, dtype=F64)
    algo = algo_config(loss_agg_mode=mode, entropy_coef=0.01, kl={"fn": "low_var_kl", "coef": 0.05})
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, ref_logprobs=ref_logprobs,
                        entropy=entropy_from_logits(logits))
    loss, grad, metrics = ours("ppo", new, inputs, algo)

    def reference(x):
        pg_loss, _ = ref_vanilla(old, x, token_level(advantages, mask), mask, mode, 0.2, 0.2)
        entropy = ref_agg_loss(ref_entropy(logits), mask, mode)
        kl = ref_agg_loss(ref_kl_penalty(x, ref_logprobs, "low_var_kl"), mask, mode)
        return pg_loss - 0.01 * entropy + 0.05 * kl, {"entropy": entropy.item(), "kl": kl.item()}

    ref_loss, ref_grad, ref_metrics = loss_and_grad(reference, new)
    rtol = AGG_RTOL.get(mode, 0.0)
    close(loss, ref_loss, rtol=rtol)
    close(grad, ref_grad, rtol=rtol)
    for key in ("entropy", "kl"):  # the terms alone, not scaled down by their coefficients
        assert metrics[key] == pytest.approx(ref_metrics[key], abs=1e-9, rel=rtol), key


@pytest.mark.parametrize("seed, shape", CASES[:3])
@pytest.mark.parametrize("name, mu_of", [("mix", lambda step: 0.9),
                                         ("mix_chord", lambda step: ref_mu(step, 5, 10, 0.9, 0.05))])
@pytest.mark.parametrize("step", [0, 5])
def test_the_mixes_add_kl_and_entropy_at_full_coefficients_as_trinitys_actor(seed, shape, name, mu_of, step):
    # Trinity trainer/verl/dp_actor.py update_policy: pg_loss, _ = self.policy_loss_fn(...) (MIXPolicyLossFn or
    # MIXCHORDPolicyLossFn: (1 - mu) * ppo on the usual rows), then policy_loss = pg_loss - entropy_coeff * entropy
    # + kl_loss_coef * kl: the regularisers are not scaled by 1 - mu (they were here, a KL 10x weaker at mu 0.9).
    # rftweb applies both to the rollouts (the policy's own samples) only, as for every RL loss.
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, scale=0.3)
    ref_logprobs = new + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    logits = 2 * torch.randn(*shape, 7, generator=gen, dtype=F64)
    algo = algo_config(name=name, mix={"mu": 0.9}, entropy_coef=0.01, kl={"fn": "k3", "coef": 0.05},
                       chord={"mu_warmup_steps": 5, "mu_decay_steps": 10, "mu_peak": 0.9, "mu_valley": 0.05})
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, ref_logprobs=ref_logprobs,
                        entropy=entropy_from_logits(logits), step=step)
    loss, grad, metrics = ours(name, new, inputs, algo)
    mu = mu_of(step)

    def reference(x):
        pg_loss, _ = ref_vanilla(old, x, token_level(advantages, mask), mask, "token-mean", 0.2, 0.2)
        entropy = ref_agg_loss(ref_entropy(logits), mask, "token-mean")
        kl = ref_agg_loss(ref_kl_penalty(x, ref_logprobs, "k3"), mask, "token-mean")
        return (1 - mu) * pg_loss - 0.01 * entropy + 0.05 * kl, {"kl": kl.item()}

    ref_loss, ref_grad, ref_metrics = loss_and_grad(reference, new)
    close(loss, ref_loss)
    close(grad, ref_grad)
    assert metrics["kl"] == pytest.approx(ref_metrics["kl"], abs=1e-9)


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("low, high, is_weights", [(None, None, False), (3e-4, 4e-4, False), (None, None, True)])
def test_gspo_matches_verl(seed, shape, mode, low, high, is_weights):
    # verl forces seq-mean-token-mean; rftweb aggregates with loss_agg_mode (token-mean: verl's formula, other mode)
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, scale=0.3)
    new[4] = old[4] + 12.0  # a mean log-ratio past verl's clamp at 10
    weights = 0.5 + torch.rand(shape, generator=gen, dtype=F64) if is_weights else None
    algo = algo_config(clip_range=0.2, clip_range_low=low, clip_range_high=high, loss_agg_mode=mode)
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, is_weights=weights)
    loss, grad, _ = ours("gspo", new, inputs, algo)

    ref_loss, ref_grad, _ = loss_and_grad(
        lambda x: ref_gspo(old, x, token_level(advantages, mask), mask, low or 0.2, high or 0.2, mode, weights), new
    )
    close(loss, ref_loss, rtol=max(1e-12, AGG_RTOL.get(mode, 0.0)))  # a negative advantage times e^10 is ~1e3
    close(grad, ref_grad, rtol=AGG_RTOL.get(mode, 0.0))


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("low, high, is_weights", [(None, None, False), (0.2, 4.0, False), (None, None, True)])
def test_cispo_matches_verl(seed, shape, mode, low, high, is_weights):
    # the gradient is -sg(clip(ratio)) * A per kept token, also where the ratio is clipped (PPO's would be 0 there)
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, scale=0.3)
    weights = 0.5 + torch.rand(shape, generator=gen, dtype=F64) if is_weights else None
    algo = algo_config(clip_range=0.2, clip_range_low=low, clip_range_high=high, loss_agg_mode=mode)
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, is_weights=weights)
    loss, grad, _ = ours("cispo", new, inputs, algo)
    ref_loss, ref_grad, _ = loss_and_grad(
        lambda x: ref_cispo(old, x, token_level(advantages, mask), mask, low or 0.2, high or 0.2, mode, weights), new
    )
    close(loss, ref_loss, rtol=AGG_RTOL.get(mode, 0.0))
    close(grad, ref_grad, rtol=AGG_RTOL.get(mode, 0.0))


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("tau", [1.0, 0.3])
@pytest.mark.parametrize("token_advantages", [False, True])
def test_opmd_loss_matches_trinity(seed, shape, tau, token_advantages):
    gen = torch.Generator().manual_seed(seed)
    mask, old, new, advantages = make_rollouts(gen, *shape, token_advantages)
    new = new.clamp(max=0.0)  # log-probs
    algo = algo_config(opmd={"tau": tau})
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages)
    loss, grad, _ = ours("opmd", new, inputs, algo)
    ref_loss, ref_grad, _ = loss_and_grad(lambda x: ref_opmd_loss(x, mask, token_level(advantages, mask), tau), new)
    close(loss, ref_loss)
    close(grad, ref_grad)


def expert_batch(seed, shape):
    """mask and log-probs of EXPERT rows: probabilities from 0.05 to 1, and a row of near-certain tokens."""
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    logprobs = -3 * torch.rand(shape, generator=gen, dtype=F64)
    logprobs[4] = -1e-3 * torch.rand(shape[1], generator=gen, dtype=F64)
    return mask, logprobs


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("name, reference", [("sft", ref_sft), ("sft_is", ref_sft_is), ("sft_phi", ref_sft_phi)])
def test_sft_losses_match_trinity(seed, shape, name, reference):
    # sft_is and sft_phi weigh each token's -log p by a detached p (sft_is) or p (1 - p) (sft_phi): the gradient is
    # -weight / n per kept token, not the gradient of -p log p or -p (1 - p) log p
    mask, logprobs = expert_batch(seed, shape)
    loss, grad, _ = ours(name, logprobs, LossInputs(mask, part=EXPERT), algo_config())
    ref_loss, ref_grad, _ = loss_and_grad(lambda x: reference(x, mask), logprobs)
    close(loss, ref_loss)
    close(grad, ref_grad)


CHORD = [  # mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley, step
    (0, 0, 0.1, 0.1, 0),  # the defaults: mu_valley from the start
    (0, 0, 0.1, 0.1, 50),
    (5, 10, 0.9, 0.05, 0),  # warmup: 0 -> peak
    (5, 10, 0.9, 0.05, 3),
    (5, 10, 0.9, 0.05, 5),  # decay: peak -> valley (cosine)
    (5, 10, 0.9, 0.05, 9),
    (5, 10, 0.9, 0.05, 14),
    (5, 10, 0.9, 0.05, 15),  # after the decay: valley
    (5, 10, 0.9, 0.05, 1000),
    (0, 8, 0.5, 0.0, 2),  # no warmup
]


@pytest.mark.parametrize("chord", CHORD)
@pytest.mark.parametrize("phi", [True, False])
@pytest.mark.parametrize("seed, shape", CASES[:3])
def test_mix_chord_matches_trinity(chord, phi, seed, shape):
    # Trinity chord_policy_loss.py MIXCHORDPolicyLossFn: (1 - mu) * ppo on the usual rows + mu * sft_phi (or sft,
    # enable_phi_function False) on the expert rows. Trinity also scales each part by n_rows * gradient_accumulation
    # / train_batch_size_part; that batch weighting is not the loss fn's here, which sees one part at a time
    warmup, decay, peak, valley, step = chord
    algo = algo_config(chord={"mu_warmup_steps": warmup, "mu_decay_steps": decay, "mu_peak": peak,
                              "mu_valley": valley, "enable_phi_function": phi})
    mu = ref_mu(step, warmup, decay, peak, valley)
    mask, old, new, advantages = make_rollouts(torch.Generator().manual_seed(seed), *shape, scale=0.3)
    inputs = LossInputs(mask, part=USUAL, old_logprobs=old, advantages=advantages, step=step)
    loss, grad, metrics = ours("mix_chord", new, inputs, algo)
    ref_loss, ref_grad, _ = loss_and_grad(
        lambda x: (1 - mu) * ref_vanilla(old, x, token_level(advantages, mask), mask, "token-mean", 0.2, 0.2)[0], new
    )
    close(loss, ref_loss)
    close(grad, ref_grad)
    assert metrics["mu"] == pytest.approx(mu, abs=1e-12)

    mask, logprobs = expert_batch(seed, shape)
    loss, grad, metrics = ours("mix_chord", logprobs, LossInputs(mask, part=EXPERT, step=step), algo)
    sft = ref_sft_phi if phi else ref_sft
    ref_loss, ref_grad, _ = loss_and_grad(lambda x: mu * sft(x, mask), logprobs)
    close(loss, ref_loss)
    close(grad, ref_grad)
    assert "mu" not in metrics  # logged with the rollouts' part alone: the trainer sums each part's metrics


@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("beta", [0.1, 0.5])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_dpo_matches_trl_sigmoid_loss(seed, shape, beta, label_smoothing):
    # chosen rows first, rejected rows second (pair i: rows i and i + B/2); sequence log-prob = sum over the mask
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    logprobs = -3 * torch.rand(shape, generator=gen, dtype=F64)
    ref_logprobs = logprobs + 0.5 * torch.randn(shape, generator=gen, dtype=F64)
    algo = algo_config(dpo={"beta": beta, "label_smoothing": label_smoothing})
    loss, grad, _ = ours("dpo", logprobs, LossInputs(mask, part=PAIRS, ref_logprobs=ref_logprobs), algo)

    def reference(x):
        chosen, rejected = (x * mask).sum(-1).chunk(2)
        ref_chosen, ref_rejected = (ref_logprobs * mask).sum(-1).chunk(2)
        return ref_dpo_sigmoid(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing)

    ref_loss, ref_grad, _ = loss_and_grad(reference, logprobs)
    close(loss, ref_loss)
    close(grad, ref_grad)


# ---- rollout / training mismatch ----------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 2.0), (0.8, None)])
def test_rollout_correction_weights_match_trl_vllm_importance_sampling(seed, shape, mode, clip_min, clip_max):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    old = -3 * torch.rand(shape, generator=gen, dtype=F64)
    rollout = old + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    weights, *_ = rollout_correction_weights(old, rollout, mask, mode, clip_min=clip_min, clip_max=clip_max)
    expected = ref_vllm_is_ratio(old, rollout, mask, mode, clip_min, clip_max)
    close(torch.broadcast_to(weights, shape) * mask, torch.broadcast_to(expected, shape) * mask)


# ---- KL estimators ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("name, spread", [("k1", 0.5), ("k2", 0.5), ("k3", 0.5), ("low_var_kl", 0.5),
                                          ("low_var_kl", 30.0), ("k3", 30.0)])
def test_kl_fns_match_verl_kl_penalty(seed, shape, name, spread):
    # verl's k3 is low_var_kl (log-ratio clamped to ±20, the estimate to ±10); at spread 0.5 the clamps never bind,
    # at 30 they do. rftweb's k3 is the unclamped estimator exp(-d) - 1 + d (docs/algorithms.md): at 30 it is
    # compared with that formula, and its clamped form is rftweb's low_var_kl.
    gen = torch.Generator().manual_seed(seed)
    logprobs = -3 * torch.rand(shape, generator=gen, dtype=F64)
    ref_logprobs = logprobs + spread * torch.randn(shape, generator=gen, dtype=F64)
    kl, grad, _ = loss_and_grad(lambda x: KL_FNS.get(name)(x, ref_logprobs).sum(), logprobs)

    def reference(x):
        if name == "k3" and spread > 20:
            return (torch.exp(ref_logprobs - x) - 1 + (x - ref_logprobs)).sum()  # Schulman's k3, unclamped
        return ref_kl_penalty(x, ref_logprobs, name).sum()

    ref_kl, ref_grad, _ = loss_and_grad(reference, logprobs)
    close(kl, ref_kl)
    close(grad, ref_grad)


# ---- critic -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, shape", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("clip", [0.2, 0.5])
def test_value_loss_matches_verl(seed, shape, mode, clip):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, *shape)
    old_values, returns = torch.randn(shape, generator=gen, dtype=F64), torch.randn(shape, generator=gen, dtype=F64)
    values = old_values + 0.4 * torch.randn(shape, generator=gen, dtype=F64)
    loss, grad, metrics = loss_and_grad(lambda v: value_loss(v, old_values, returns, mask, clip, mode), values)
    ref_loss, ref_grad, ref_metrics = loss_and_grad(
        lambda v: ref_value_loss(v, returns, old_values, mask, clip, mode), values
    )
    close(loss, ref_loss, rtol=AGG_RTOL.get(mode, 0.0))
    close(grad, ref_grad, rtol=AGG_RTOL.get(mode, 0.0))
    assert metrics["vf_clip_frac"] == pytest.approx(ref_metrics["vf_clipfrac"], abs=1e-9)
