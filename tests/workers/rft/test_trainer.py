import pytest
import torch

from workers.rft.algorithms import POLICY_LOSSES
from workers.rft.experience import Experience, PreferencePair
from workers.rft.logprobs import response_logits, token_logprobs
from workers.rft.memory import InMemoryBuffer, InMemoryMetrics
from workers.rft.micro_batches import collate
from workers.rft.models import load_critic, load_policy, load_reference
from workers.rft.sampling import TrainBatch
from workers.rft.trainer import Trainer
from workers.rft.trainer_checkpoints import UnsafeCheckpoint

from .conftest import make_config

CPU = torch.device("cpu")


def experience(tokenizer, a, b, answer=None, source="rollout", advantage=None, step=0, index=0, version=0):
    prompt = tokenizer(f"What is {a} + {b}?")["input_ids"]
    response = tokenizer(str(a + b if answer is None else answer))["input_ids"] + [tokenizer.eos_token_id]
    return Experience(
        task_id=a * 10 + b, group_id=f"{step}-{a * 10 + b}", rollout_index=index, prompt_ids=prompt,
        response_ids=response, action_mask=[1] * len(response), source=source, reward=float(answer is None),
        advantage=advantage, explorer_step=step, model_version=version,
    )


def rollouts(tokenizer, n=8):
    """Groups of two: the right answer (advantage +1) and a wrong one (-1), of different lengths."""
    batch = []
    for i in range(n // 2):
        a, b = i % 10, (3 * i) % 10
        batch.append(experience(tokenizer, a, b, advantage=1.0, index=0))
        batch.append(experience(tokenizer, a, b, answer=a + b + 11, advantage=-1.0, index=1))
    return batch


def make_trainer(tiny_path, tokenizer, experiences, metrics=None, reference=None, critic=None, **sections):
    buffer = InMemoryBuffer()
    buffer.write(experiences)
    config = make_config(**sections)
    torch.manual_seed(0)
    return Trainer(config, load_policy(tiny_path, CPU), tokenizer, buffer, metrics, reference=reference, critic=critic)


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def response_logprob(model, tokenizer, exp):
    mb = collate([exp], tokenizer.pad_token_id, CPU)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids).logits
    width_t = mb.response_ids.shape[1]
    logp = torch.log_softmax(logits[:, -width_t - 1 : -1], -1).gather(-1, mb.response_ids[..., None])[..., 0]
    return (logp * mb.mask).sum().item()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_full_batch_step(tiny_path, tokenizer, agg):
    batch = rollouts(tokenizer)
    algorithm = {"loss_agg_mode": agg}
    whole = make_trainer(tiny_path, tokenizer, batch, algorithm=algorithm,
                         trainer={"micro_batch_size": 8, "batch_size": 8})
    parts = make_trainer(tiny_path, tokenizer, batch, algorithm=algorithm,
                         trainer={"micro_batch_size": 3, "batch_size": 8})
    a, b = whole.train_step(), parts.train_step()
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for (name, x), y in zip(whole.policy.named_parameters(), parts.policy.parameters()):
        torch.testing.assert_close(x.grad, y.grad, atol=1e-7, rtol=1e-4, msg=name)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_token_mean_metrics_do_not_change_with_the_micro_batch(tiny_path, tokenizer, agg):
    """clip_frac and the ratio's metrics are means over tokens under any loss_agg_mode; weighed by
    sequences under seq-mean-token-mean, clip_frac read 0.58, 0.55 and 0.50 at micro-batches of 8, 3 and 1."""
    batch = rollouts(tokenizer)
    for i, row in enumerate(batch):  # the engine's log-probs, away from the policy's: ratios far from 1
        generator = torch.Generator().manual_seed(i)
        row.logprobs = (-0.5 - 3 * torch.rand(len(row.response_ids), generator=generator)).tolist()
    steps = [make_trainer(tiny_path, tokenizer, batch, algorithm={"loss_agg_mode": agg},
                          trainer={"micro_batch_size": size, "batch_size": 8}).train_step() for size in (8, 3, 1)]
    assert 0 < steps[0]["clip_frac"] < 1
    for key in ("clip_frac", "clip_frac_lower", "approx_kl", "ratio_mean", "loss"):
        assert [step[key] for step in steps] == pytest.approx([steps[0][key]] * 3, rel=1e-5), key


@pytest.mark.parametrize("mode", ["none", "token_truncate", "sequence_mask"])
def test_rows_without_the_engines_logprobs_change_no_step_by_their_micro_batch(tiny_path, tokenizer, mode):
    """Half the rows carry the engine's log-probs (an edit, another engine): each row is taken as
    its kind, whichever rows share its micro-batch. One row without them used to drop the whole
    micro-batch's log-probs and correction: micro-batch 8 and 1 trained differently (loss 0.17 and
    0.05 in an audit's run), and the correction's metrics were diluted."""
    batch = rollouts(tokenizer)
    for i, row in enumerate(batch):
        generator = torch.Generator().manual_seed(i)
        row.logprobs = None if i % 2 else (-0.5 - torch.rand(len(row.response_ids), generator=generator)).tolist()
    algorithm = {"rollout_correction": {"mode": mode}}
    steps = [make_trainer(tiny_path, tokenizer, batch, algorithm=algorithm,
                          trainer={"micro_batch_size": size, "batch_size": 8}) for size in (8, 1)]
    whole, single = (trainer.train_step() for trainer in steps)
    for key in ("loss", "logprob_mismatch", *(("is_weight_mean", "is_corrected_frac") if mode != "none" else ())):
        assert whole[key] == pytest.approx(single[key], rel=1e-5), key
    for (name, x), y in zip(steps[0].policy.named_parameters(), steps[1].policy.parameters()):
        torch.testing.assert_close(x.grad, y.grad, atol=1e-7, rtol=1e-4, msg=name)
    if mode == "none":
        return
    alone = make_trainer(tiny_path, tokenizer, batch[::2], algorithm=algorithm,
                         trainer={"micro_batch_size": 8, "batch_size": 4}).train_step()
    assert whole["is_weight_mean"] == pytest.approx(alone["is_weight_mean"], rel=1e-5)  # the engine's rows alone


def test_shared_prompts_give_the_logits_and_gradients_of_the_plain_forward(tiny_path, tokenizer):
    # Rollouts of one task share their prompt: the trainer runs each distinct prompt once and
    # continues the rows from its cache. Prompts of different lengths (left padding), responses
    # of different lengths (right padding), and one row whose prompt nobody shares.
    batch = rollouts(tokenizer, n=6) + [experience(tokenizer, 12, 34, answer=7)]
    mb = collate(batch, tokenizer.pad_token_id, CPU)
    assert mb.prompt_rows.tolist() == [0, 2, 4, 6] and mb.row_prompt.tolist() == [0, 0, 1, 1, 2, 2, 3]
    torch.manual_seed(0)
    model = load_policy(tiny_path, CPU)
    params = list(model.parameters())

    def logits_and_grads(shared: bool):
        mb.prompt_rows = mb.prompt_rows if shared else None
        logits = response_logits(model, mb)
        logprobs = token_logprobs(logits, mb.response_ids)
        return logits.detach(), torch.autograd.grad((logprobs * mb.mask).sum(), params)

    shared_logits, shared_grads = logits_and_grads(True)
    plain_logits, plain_grads = logits_and_grads(False)
    real = mb.mask.bool()
    torch.testing.assert_close(shared_logits[real], plain_logits[real], atol=1e-5, rtol=1e-5)
    for (name, _), a, b in zip(model.named_parameters(), shared_grads, plain_grads):
        # Rounding of a sum scales with its terms: on an AVX-512 CPU, 3.6e-6 on one element of
        # embed_tokens' gradient, whose largest is 17.4 (2e-7 of it, fp32's epsilon).
        torch.testing.assert_close(a, b, atol=1e-6 * max(1.0, b.abs().max().item()), rtol=1e-4, msg=name)


def test_grpo_step_changes_weights_towards_positive_advantages(tiny_path, tokenizer):
    batch = rollouts(tokenizer)
    metrics = InMemoryMetrics()
    trainer = make_trainer(tiny_path, tokenizer, batch, metrics,
                           trainer={"micro_batch_size": 4, "batch_size": 8, "lr": 1e-3})
    good, bad = batch[0], batch[1]
    before = weights(trainer.policy)
    good_before = response_logprob(trainer.policy, tokenizer, good)
    bad_before = response_logprob(trainer.policy, tokenizer, bad)
    out = trainer.train_step()
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    assert response_logprob(trainer.policy, tokenizer, good) > good_before
    assert response_logprob(trainer.policy, tokenizer, bad) < bad_before
    # Generation logprobs were missing here, so logπ_old was the policy itself: ratio 1, nothing clipped.
    assert out["ratio_mean"] == pytest.approx(1.0) and out["clip_frac"] == 0.0
    for key in ("loss", "policy_loss", "entropy", "grad_norm", "lr", "response_length", "tokens_per_s", "staleness"):
        assert key in metrics.points[("trainer", 1)]
    assert trainer.buffer.sample(10, sources=["rollout"]) == []  # all consumed


def test_generation_logprobs_serve_as_old_logprobs(tiny_path, tokenizer):
    batch = rollouts(tokenizer, 2)
    for exp in batch:
        exp.logprobs = [-0.1] * len(exp.response_ids)  # pretend a different behaviour policy
    trainer = make_trainer(tiny_path, tokenizer, batch, trainer={"batch_size": 2})
    assert trainer.train_step()["ratio_mean"] != pytest.approx(1.0)


def test_logprob_mismatch_measures_the_gap_to_the_rollout_engine(tiny_path, tokenizer):
    """Zero when the rollout logprobs are the trainer's own; the mean token gap otherwise."""
    batch = rollouts(tokenizer, 4)
    policy = load_policy(tiny_path, CPU)
    for exp in batch:
        mb = collate([exp], tokenizer.pad_token_id, CPU)
        with torch.no_grad():
            out = policy(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids)
            logits = out.logits
        width_t = mb.response_ids.shape[1]
        own = torch.log_softmax(logits[:, -width_t - 1 : -1], -1).gather(-1, mb.response_ids[..., None])[0, :, 0]
        exp.logprobs = own.tolist()
    same = make_trainer(tiny_path, tokenizer, batch, trainer={"batch_size": 4, "micro_batch_size": 3})
    assert same.train_step()["logprob_mismatch"] == pytest.approx(0.0, abs=1e-5)
    for exp in batch:
        exp.logprobs = [x - 0.25 for x in exp.logprobs]
    shifted = make_trainer(tiny_path, tokenizer, batch, trainer={"batch_size": 4, "micro_batch_size": 3})
    assert shifted.train_step()["logprob_mismatch"] == pytest.approx(0.25, abs=1e-4)
    without = rollouts(tokenizer, 4)  # no rollout logprobs: nothing to compare
    assert "logprob_mismatch" not in make_trainer(tiny_path, tokenizer, without, trainer={"batch_size": 4}).train_step()


def test_bf16_on_cpu_trains_under_autocast_with_fp32_master_weights(tiny_path, tokenizer):
    batch = rollouts(tokenizer, 4)
    trainer = make_trainer(tiny_path, tokenizer, batch, model={"dtype": "bfloat16"},
                           trainer={"batch_size": 4, "lr": 1e-3})
    assert trainer.autocast == torch.bfloat16
    before = weights(trainer.policy)
    metrics = trainer.train_step()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())


def test_sft_lowers_the_loss_on_expert_data(tiny_path, tokenizer):
    expert = [experience(tokenizer, a, b, source="expert") for a in range(4) for b in range(4)]
    trainer = make_trainer(tiny_path, tokenizer, expert, algorithm={"name": "sft"},
                           trainer={"batch_size": 16, "micro_batch_size": 16, "lr": 3e-3})
    losses = [trainer.train_step()["sft_loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]
    assert trainer.buffer.sample(100, sources=["expert"])[0].use_count == 8  # reused, not consumed


def test_mix_batches_blend_expert_data_at_the_configured_ratio(tiny_path, tokenizer):
    expert = [experience(tokenizer, a, 1, source="expert") for a in range(10)]
    trainer = make_trainer(
        tiny_path, tokenizer, rollouts(tokenizer, 6) + expert,
        algorithm={"name": "mix", "mix": {"mu": 0.5, "expert_data_ratio": 0.25}},
        buffer={"expert_taskset": "x"}, trainer={"batch_size": 6},
    )
    out = trainer.train_step()
    assert out["experiences"] == 8 and out["expert_experiences"] == 2
    assert {"policy_loss", "sft_loss", "entropy"} <= out.keys()


def test_a_mix_step_trains_on_rollouts_with_logprobs_and_a_human_edit_without(tiny_path, tokenizer):
    """The edit's "no generation logprobs" is None (a person wrote it); before, an edit stored with
    [] crashed collate. Now [] with tokens is refused where the experience is made."""
    batch = rollouts(tokenizer, 4)
    for exp in batch:
        exp.logprobs = [-0.5] * len(exp.response_ids)
    edit = experience(tokenizer, 2, 3, source="human_edit")
    assert edit.logprobs is None
    trainer = make_trainer(
        tiny_path, tokenizer, batch + [edit], algorithm={"name": "mix", "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
        buffer={"expert_taskset": "x"}, trainer={"batch_size": 4},
    )
    edit_before = response_logprob(trainer.policy, tokenizer, edit)
    out = trainer.train_step()
    assert out["experiences"] == 5 and out["expert_experiences"] == 1
    assert out["sft_loss"] > 0 and out["ratio_mean"] != pytest.approx(1.0)  # the rollouts' own logπ_old
    assert response_logprob(trainer.policy, tokenizer, edit) > edit_before  # imitated
    assert trainer.buffer.sample(10, sources=["human_edit"])[0].use_count == 1
    with pytest.raises(ValueError, match=r"experience logprobs has 0 entries for \d+ response tokens.*None, not \[\]"):
        Experience(**{**vars(edit), "logprobs": []})


def test_the_policy_loss_is_the_one_the_config_names(tiny_path, tokenizer):
    """grpo with policy_loss 'mix' trains with MIX's loss (SFT on expert data beside the rollouts);
    before, the trainer called 'ppo' by a fixed name whatever the config said."""
    expert = [experience(tokenizer, a, 1, source="expert") for a in range(4)]
    trainer = make_trainer(tiny_path, tokenizer, rollouts(tokenizer, 4) + expert, algorithm={"policy_loss": "mix"},
                           buffer={"expert_taskset": "x"}, trainer={"batch_size": 4})
    assert trainer.loss_fn is POLICY_LOSSES.get("mix")
    out = trainer.train_step()
    assert {"policy_loss", "sft_loss"} <= out.keys() and out["expert_experiences"] == 1


def test_staleness_limit_skips_old_rollouts(tiny_path, tokenizer):
    batch = [experience(tokenizer, 1, 2, advantage=1.0, version=v, index=v) for v in range(4)]
    trainer = make_trainer(tiny_path, tokenizer, batch, buffer={"max_staleness": 1}, trainer={"batch_size": 4})
    out = trainer.train_step(current_version=3)
    assert out["experiences"] == 2 and out["staleness"] == pytest.approx(0.5)


def test_warmup_scales_the_learning_rate(tiny_path, tokenizer):
    trainer = make_trainer(tiny_path, tokenizer, rollouts(tokenizer) * 1,
                           trainer={"batch_size": 2, "warmup_steps": 4, "lr": 1e-3})
    assert [trainer.train_step()["lr"] for _ in range(3)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4])


def test_kl_to_the_reference_starts_at_zero(tiny_path, tokenizer):
    reference = load_reference(tiny_path, CPU)
    trainer = make_trainer(tiny_path, tokenizer, rollouts(tokenizer) * 1, reference=reference,
                           algorithm={"kl": {"fn": "k3", "coef": 0.1}}, trainer={"batch_size": 4})
    assert trainer.train_step()["kl"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.train_step()["kl"] > 0


def kept_advantages(trainer) -> list[list[float]]:
    """Each rollout's advantages on its kept tokens, after the trainer's preparation (GAE, whitening)."""
    parts = trainer._micro_batches(TrainBatch(usual=trainer.buffer.all()))
    trainer._prepare(parts)
    rows = []
    for mb in dict(parts)["usual"]:
        advantages = mb.advantages if mb.advantages.dim() == 2 else mb.advantages.unsqueeze(-1).expand_as(mb.mask)
        rows += [a[m > 0].tolist() for a, m in zip(advantages, mb.mask)]
    return rows


@pytest.mark.parametrize("name", ["ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_whitened_advantages_do_not_depend_on_the_micro_batch_size(tiny_path, tokenizer, name):
    # verl whitens over the whole batch; per micro-batch, one of 8 against two of 4 moved GAE's by up to 0.34.
    batch = rollouts(tokenizer)
    for e in batch:
        e.advantage = None if name != "reinforce_plus_plus_baseline" else e.advantage
    found = []
    for micro in (8, 4, 2):
        critic = load_critic(tiny_path, CPU) if name == "ppo" else None
        trainer = make_trainer(tiny_path, tokenizer, batch, critic=critic, algorithm={"name": name, "repeat_times": 2},
                               trainer={"batch_size": 8, "micro_batch_size": micro})
        found.append(kept_advantages(trainer))
    for rows in found[1:]:
        for a, b in zip(found[0], rows):
            assert a == pytest.approx(b, abs=1e-6)
    flat = [a for row in found[0] for a in row]
    assert abs(sum(flat) / len(flat)) < 1e-5  # whitened: mean 0 over the batch's tokens


def test_the_reward_lands_on_the_last_token_the_model_wrote(tiny_path, tokenizer):
    # A multi-turn rollout: the model's reply, an environment turn (mask 0), the model's last reply,
    # then the environment's closing tokens. With gamma = lam = 1 every kept token's return is the
    # reward; on the last row (the old index, action_mask.sum() - 1) it landed on an environment token.
    exp = experience(tokenizer, 2, 3, advantage=None)
    exp.response_ids = exp.response_ids[:2] * 4
    exp.action_mask = [1, 1, 0, 0, 1, 1, 0, 0]
    exp.reward = 1.0
    trainer = make_trainer(tiny_path, tokenizer, [exp], critic=load_critic(tiny_path, CPU),
                           algorithm={"name": "ppo", "repeat_times": 1, "gae": {"gamma": 1.0, "lam": 1.0}},
                           trainer={"batch_size": 1, "micro_batch_size": 1})
    (mb,) = dict(trainer._micro_batches(TrainBatch(usual=[exp])))["usual"]
    trainer._prepare_rollouts(mb)
    assert mb.returns[0].tolist() == pytest.approx([1, 1, 0, 0, 1, 1, 0, 0])


def test_ppo_trains_policy_and_critic(tiny_path, tokenizer):
    batch = rollouts(tokenizer)
    critic = load_critic(tiny_path, CPU)
    before = weights(critic)
    trainer = make_trainer(tiny_path, tokenizer, batch, critic=critic, algorithm={"name": "ppo", "repeat_times": 1},
                           trainer={"batch_size": 8, "micro_batch_size": 4})
    out = trainer.train_step()
    assert "vf_loss" in out and out["policy_loss"] != 0
    assert any(not torch.equal(before[n], p) for n, p in critic.named_parameters())


def test_dpo_raises_the_margin_of_chosen_over_rejected(tiny_path, tokenizer):
    pairs = []
    for exp in rollouts(tokenizer):
        if exp.rollout_index == 0:
            wrong = experience(tokenizer, exp.task_id // 10, exp.task_id % 10, answer=99)
            pairs.append(PreferencePair(exp.prompt_ids, exp.response_ids, wrong.response_ids))
    trainer = make_trainer(tiny_path, tokenizer, [], reference=load_reference(tiny_path, CPU),
                           algorithm={"name": "dpo", "repeat_times": 1, "dpo": {"max_pair_uses": 2}},
                           trainer={"batch_size": 4, "lr": 1e-3})  # the same pairs twice (mode both: once by default)
    trainer.buffer.add_pairs(pairs)
    first = trainer.train_step()
    assert first["dpo_margin"] == pytest.approx(0.0, abs=1e-5) and first["pairs"] == 4
    assert trainer.train_step()["dpo_margin"] > 0


def test_checkpoint_restores_weights_optimizer_and_step(tiny_path, tokenizer, tmp_path):
    def three_steps_of_rollouts():
        batch = []
        for step in range(3):
            batch += [experience(tokenizer, step, b, advantage=(-1.0) ** b, step=step, index=b) for b in range(8)]
        return batch

    trainer = make_trainer(tiny_path, tokenizer, three_steps_of_rollouts(), trainer={"batch_size": 8})
    trainer.train_step()
    path = trainer.save_checkpoint(tmp_path / "ckpt", extra={"explorer_step": 5})
    assert all((path / name).exists() for name in ("model.safetensors", "optimizer.pt", "tokenizer.json"))
    expected = [trainer.train_step()["loss"] for _ in range(2)]

    resumed = make_trainer(tiny_path, tokenizer, three_steps_of_rollouts(), trainer={"batch_size": 8})
    resumed.buffer.mark_used(consumed=resumed.buffer.sample(8, sources=["rollout"]))  # what step 1 took
    assert resumed.load_checkpoint(path) == {"explorer_step": 5} and resumed.step == 1
    assert [resumed.train_step()["loss"] for _ in range(2)] == expected


class Payload:
    """Unpickling this runs `touch <marker>` (what a crafted checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_resumes_the_rng_stream_and_refuses_pickled_code(tiny_path, tokenizer, tmp_path):
    import random

    trainer = make_trainer(tiny_path, tokenizer, rollouts(tokenizer))
    saved = trainer.save_checkpoint(tmp_path / "ckpt")
    expected = (torch.rand(3), random.random())
    trainer.load_checkpoint(saved)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]

    marker = tmp_path / "pwned"
    rng = torch.load(saved / "rng.pt", weights_only=True)
    torch.save({**rng, "python": Payload(marker)}, saved / "rng.pt")
    with pytest.raises(UnsafeCheckpoint, match="rng.pt of checkpoint .* was refused as unsafe") as refused:
        trainer.load_checkpoint(saved)
    assert "weights_only=False" not in str(refused.value)  # never the advice to load it unsafely
    assert not marker.exists()
