"""The trainer: sample a batch from the buffer (the algorithm's sample strategy), compute the
run's policy loss (its registry entry, algorithms/losses.py) over micro-batches with gradient
accumulation, clip, step, log; save and load exact checkpoints (trainer_checkpoints.py).

A batch has up to three parts: usual rollouts, expert data, preference pairs; every micro-batch
holds rows of one part, and the loss is told which.

Sequences are laid out prompt-left-padded, response-right-padded, so every response starts at the
same column and per-token tensors are [B, T] over response tokens (as algorithms/ expects). Their
log-probs come from logprobs.py: each distinct prompt once, and without the [B, T, V] logits unless
a loss reads them.
Micro-batch losses are weighted by their share of their part's tokens (token-mean) or sequences
(seq-mean modes; pairs for DPO), so accumulating them gives exactly the loss of the whole part at
once; the parts' losses add up (MIX weights them inside its loss).

With trainer.strategy 'ddp' this trainer is one of several ranks (distributed.py): the leader
samples and sends each batch to the followers, every rank computes its share of the micro-batches,
weighted by their units in the whole batch, and the gradients and metrics are summed across ranks.
With 'fsdp' the models are sharded over the ranks too, and every rank runs the same number of
forwards and backwards (stand-in micro-batches weighted 0), since FSDP's collectives run inside them.
"""
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import distributed
from .algorithms import (
    EXPERT,
    PAIRS,
    POLICY_LOSSES,
    TOKEN_MEANS,
    USUAL,
    LossInputs,
    compute_gae,
    discounted_returns,
    entropy_from_logits,
    last_token_rewards,
    reads_entropy,
    resolve,
    rollout_correction_weights,
    value_loss,
    whiten,
)
from .config import FsdpConfig
from .config_rules import promotes_rollouts
from .logprobs import at_least_fp32, chunked_logprobs, response_hidden, response_logits, token_logprobs
from .micro_batches import MicroBatch, collate, pack, pack_pairs
from .models import pick_dtype, trainable_params
from .sampling import SAMPLE_STRATEGIES, TrainBatch, pair_use_limit
from .trainer_checkpoints import TrainerCheckpoints

# The SDPA kernels the trainer's forward may use on CUDA (Trainer._forward_context).
TRAINING_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

def _mismatch(trainer_logprobs, rollout_logprobs, mask) -> tuple[float, float]:
    """(mean |logπ_trainer - logπ_rollout| over the kept tokens, their count): the metric logprob_mismatch."""
    tokens = mask.sum().item()
    return ((trainer_logprobs - rollout_logprobs).abs() * mask).sum().item() / max(tokens, 1), tokens


class Trainer(TrainerCheckpoints):
    def __init__(self, config, policy, tokenizer, buffer, metrics=None, reference=None, critic=None, ranks=None):
        self.config = config
        self.spec = resolve(config)
        self.loss_fn = POLICY_LOSSES.get(self.spec.policy_loss)
        self.algo = config.trained_algorithm()
        self.policy = policy.train()
        self.tokenizer = tokenizer
        self.buffer = buffer
        self.metrics = metrics
        self.reference = reference
        self.critic = critic.train() if critic is not None else None
        self.device = next(policy.parameters()).device
        # Master weights stay fp32; the forward runs under autocast in the compute dtype (bf16 on a
        # GPU by default; on CPU only when model.dtype asks for it).
        compute_dtype = pick_dtype(self.device, config.model.dtype)
        self.autocast = compute_dtype if compute_dtype != torch.float32 else None
        trainer = config.trainer
        self.trainable, self.params = trainable_params(policy)
        if trainer.activation_checkpointing:
            # Non-reentrant: each layer recomputed inside backward (under fsdp its weights gathered
            # again by FSDP's hooks), with no input that must require grad (LoRA's frozen embeddings).
            for model in (policy, critic):
                if model is not None:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ranks = ranks  # distributed.Ranks with strategy 'ddp' or 'fsdp'; None: this process alone
        self.sharded = ranks is not None and trainer.strategy == "fsdp"
        if ranks is not None:
            for model in (policy, critic):
                if model is not None:
                    ranks.broadcast_parameters(model)  # before sharding: each rank's shard of the same head
        if self.sharded:
            settings = trainer.fsdp or FsdpConfig()
            for model in (policy, critic):
                if model is not None:
                    distributed.shard(model, ranks, settings, self.device)
            # Sharded too (it runs in the same lockstep): a replica would cost every rank the whole
            # model's memory, which is what fsdp is chosen to save.
            if reference is not None:
                distributed.shard(reference, ranks, settings, self.device)
        # With LoRA only the adapters: the optimizer holds no state for the frozen base. Built on
        # the sharded parameters under fsdp: each rank steps its shard.
        trained = [p for p in policy.parameters() if p.requires_grad]
        # fused: one kernel over all parameters (3.1 s -> 0.2 s per SmolLM2 step on CPU, as TRL's).
        self.optimizer = torch.optim.AdamW(trained, lr=trainer.lr, weight_decay=trainer.weight_decay, fused=True)
        self.critic_optimizer = (
            torch.optim.AdamW(critic.parameters(), lr=trainer.critic_lr, weight_decay=trainer.weight_decay, fused=True)
            if critic is not None
            else None
        )
        # Rollout logprobs were taken under softmax(logits / temperature); ratios must compare like with like.
        self.temperature = config.explorer.temperature or 1.0
        # Token log-probs (and entropies) from hidden states, the head applied chunk by chunk
        # (logprobs.py): the [B, T, V] logits are never whole. Not under fsdp (the root module's
        # forward gathers the head's shards).
        self.chunked = not self.sharded
        self.batch_size = config.train_batch_size
        # A step that finds nothing to train on counts ({"skipped": 1}) where the explorer's steps
        # bring the data (rollouts; promote_to_expert's copies for sft): trainer step s + 1 trains on
        # explorer step s, and the explorer waits in turn for the weights step s + 1 publishes, so a
        # trainer that waited instead would wait for itself. sft and dpo on data that comes whenever
        # it comes (expert data, imported pairs, people's edits and comparisons) wait for it and count
        # no step: counted, 100 steps over an empty buffer ended "completed", model v100, trained on nothing.
        self.waits_for_data = not self.spec.uses_rollouts and not promotes_rollouts(config)
        self.max_pair_uses = pair_use_limit(config)  # dpo: a pair trains in at most this many steps
        self.step = 0
        # For idle_share: the end of the last step, and checkpoint time since (busy, not idle).
        self._last_end: float | None = None
        self._checkpoint_seconds = 0.0

    # -- one step --------------------------------------------------------------------------------

    def train_step(self, current_version: int = 0, publish: Callable[[], object] | None = None,
                   sampled: Callable[[], object] | None = None) -> dict | None:
        """Sample, say so (`sampled`), update, `publish` the new weights (the synchroniser's part in
        this thread: sync_seconds), log. With nothing to train on: None, and no step, where the
        trainer waits for its data (waits_for_data); else the step counts, its metrics saying skipped.
        idle_share: the part of the time since the last step's end spent neither in this step nor
        saving a checkpoint (waiting for rollouts, mostly)."""
        started = time.perf_counter()
        self._set_lr()
        batch = SAMPLE_STRATEGIES.get(self.spec.sample_strategy)(
            self.buffer,
            self.batch_size,
            current_version,
            max_staleness=self.config.buffer.max_staleness,
            uses_rollouts=self.spec.uses_rollouts,
            expert_data_ratio=self.algo.mix.expert_data_ratio,
            max_pair_uses=self.max_pair_uses,
        )
        if not len(batch) and self.waits_for_data:
            return None
        if sampled is not None:
            sampled()
        scatter = None
        if len(batch) and self.ranks is not None:
            sent = time.perf_counter()
            self.ranks.send("step", batch, self.step)  # the batch, as JSON and tensors, to every follower
            scatter = time.perf_counter() - sent
        metrics = self._update(batch) if len(batch) else {"skipped": 1}
        if scatter is not None:
            metrics["scatter_seconds"] = scatter  # what leading the ranks costs a step
        self.buffer.mark_used(consumed=batch.usual, reused=batch.expert)
        self.step += 1
        if publish is not None:
            published = time.perf_counter()
            publish()
            metrics["sync_seconds"] = time.perf_counter() - published
        now = time.perf_counter()
        seconds = now - started
        if self._last_end is not None:
            busy = seconds + self._checkpoint_seconds
            metrics["idle_share"] = max(0.0, 1.0 - busy / max(now - self._last_end, 1e-9))
        self._last_end, self._checkpoint_seconds = now, 0.0
        metrics.update(self._batch_metrics(batch, current_version, seconds))
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["trainable_params"] = self.trainable
        metrics["trainable_share"] = self.trainable / self.params
        if self.metrics is not None:
            self.metrics.log("trainer", self.step, metrics)
        return metrics

    def follow(self) -> None:
        """A follower rank: run the leader's commands (train_step, load_checkpoint, release_ranks)
        until it says stop."""
        while True:
            command, args = self.ranks.receive()
            if command == "stop":
                return
            if command == "step":
                batch, self.step = args
                self._set_lr()
                self._update(batch)
                self.step += 1
            elif command == "load":
                self.load_checkpoint(*args)
            elif command == "gather":
                self.full_state(*args)
            else:
                raise ValueError(f"unknown command from the leader rank: {command!r}")

    def release_ranks(self) -> None:
        """Leader: end the followers' command loops (the run is over)."""
        if self.ranks is not None and self.ranks.is_leader and not self.ranks.failed:
            self.ranks.send("stop")

    def _set_lr(self) -> None:
        warmup = self.config.trainer.warmup_steps
        scale = min(1.0, (self.step + 1) / warmup) if warmup else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.trainer.lr * scale

    def _update(self, batch: TrainBatch) -> dict:
        """update_epochs passes over the batch: the run's policy loss on every micro-batch of each
        part, weighted by the micro-batch's share of its part, gradients accumulated, one step.
        With ranks: each its share of the micro-batches, still weighted by the whole part."""
        agg = self.algo.loss_agg_mode
        parts = self._micro_batches(batch)
        part_units = {part: sum(mb.units(agg, part) for mb in mbs) for part, mbs in parts}
        part_tokens = {part: sum(mb.tokens for mb in mbs) for part, mbs in parts}
        if self.ranks is not None:
            parts = [(part, self._share(mbs)) for part, mbs in parts]
        self._prepare(parts)
        usual = dict(parts).get(USUAL, [])
        for _ in range(self.config.trainer.update_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            metrics = {}
            total_loss = 0.0
            for part, mbs in parts:
                for mb in mbs:
                    share = 0.0 if mb.padding else mb.units(agg, part) / max(part_units[part], 1)
                    token_share = 0.0 if mb.padding else mb.tokens / max(part_tokens[part], 1)
                    loss, mb_metrics = self._loss(mb, part)
                    (share * loss).backward()
                    total_loss += share * loss.item()
                    for key, value in mb_metrics.items():
                        metrics[key] = metrics.get(key, 0.0) + (token_share if key in TOKEN_MEANS else share) * value
            self._sum_gradients(self.policy)
            grad_norm = self._clip(self.policy)
            self.optimizer.step()
            if self.critic is not None and USUAL in part_units:
                metrics.update(self._critic_update(usual, part_units[USUAL]))
        metrics["loss"] = total_loss
        covered = {}  # the measured metrics, weighted by what each covers: summed over ranks as (sum, count)
        for mb in usual:
            for key, (mean, count) in ({} if mb.padding else mb.measured).items():
                metrics[key] = metrics.get(key, 0.0) + mean * count
                covered[f"{key}/covered"] = covered.get(f"{key}/covered", 0.0) + count
        metrics |= covered
        if self.ranks is not None:
            metrics = self.ranks.sum_values(metrics)
        for name in [key for key in metrics if key.endswith("/covered")]:
            count = metrics.pop(name)
            metrics[name.removesuffix("/covered")] /= max(count, 1)
        metrics["grad_norm"] = grad_norm.item()
        return metrics

    def _share(self, mbs: list[MicroBatch]) -> list[MicroBatch]:
        """This rank's micro-batches of a part (every world_size-th). Under fsdp FSDP gathers
        weights inside every forward and reduce-scatters gradients inside every backward, so each
        rank runs ceil(n / world_size), in rounds of one micro-batch per rank: a rank short of one
        runs a stand-in (a copy of the round's first, weighted 0), and a round where some rank
        computes logπ_old has every rank run that forward. (The other way, one reduce-scatter after
        accumulating under set_requires_gradient_sync(False), would hold the whole model's
        unsharded gradients on every rank between backwards: what sharding is chosen to avoid.)"""
        mine = self.ranks.share(mbs)
        if not self.sharded:
            return mine
        world = self.ranks.world_size
        rounds = [mbs[i : i + world] for i in range(0, len(mbs), world)]
        out = []
        for j, round_ in enumerate(rounds):
            mb = mine[j] if j < len(mine) else replace(round_[0], padding=True)
            mb.policy_pass = any(other.old_logprobs is None for other in round_)
            out.append(mb)
        return out

    def _clip(self, model) -> torch.Tensor:
        """Clip the gradients by their norm over all parameters; the norm. (Sharded gradients are
        DTensors: the norm comes back as one, summed over the ranks' shards.)"""
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.trainer.grad_clip)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def _sum_gradients(self, model) -> None:
        """With ddp ranks: each parameter's gradient summed over them (see distributed.py). A
        parameter no rank computed a gradient for keeps none, as in one process, so the optimizer
        skips it there too. (Under fsdp each backward has summed them already.)"""
        if self.ranks is None or self.sharded:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        has_grad = torch.tensor([float(p.grad is not None) for p in params])
        self.ranks.sum_tensors([*grads, has_grad])
        for p, grad, computed in zip(params, grads, has_grad.tolist()):
            p.grad = grad if computed else None

    def _micro_batches(self, batch: TrainBatch) -> list[tuple[str, list[MicroBatch]]]:
        """(part, its micro-batches) for each part the batch has (micro_batches.pack: by rows, and
        by padded tokens with trainer.micro_batch_tokens; pack_pairs for DPO's pairs)."""
        micro, pad_id = self.config.trainer.micro_batch_size, self.tokenizer.pad_token_id
        tokens = self.config.trainer.micro_batch_tokens
        parts = [
            (USUAL, pack(batch.usual, micro, tokens)),
            (EXPERT, pack(batch.expert, micro, tokens)),
            (PAIRS, pack_pairs(batch.pairs, micro, tokens)),
        ]
        out = [(part, [collate(rows, pad_id, self.device) for rows in groups]) for part, groups in parts if groups]
        if self.sharded:
            # One forward per micro-batch on every rank: sharing a prompt's cache takes one or two
            # forwards by the data (response_logits), and FSDP's gathers must match across ranks.
            out = [(part, [replace(mb, prompt_rows=None, row_prompt=None) for mb in mbs]) for part, mbs in out]
        return out

    # -- losses ----------------------------------------------------------------------------------

    def _loss(self, mb: MicroBatch, part: str) -> tuple[torch.Tensor, dict]:
        """The run's policy loss (POLICY_LOSSES[resolve(config).policy_loss]) on one micro-batch."""
        entropy_read = reads_entropy(self.spec.policy_loss, part)
        logprobs, entropy = self._logprobs(self.policy, mb, self._temperature(part), entropy_read)
        if entropy is not None and not self.algo.entropy_coef:
            entropy = entropy.detach()  # a metric only: no backward through it
        if part == USUAL and mb.rollout_logprobs and "logprob_mismatch" not in mb.measured:
            # Before the first optimizer step the trainer holds the weights that generated these
            # rollouts (at staleness 0): any gap is the engines' numerics (vLLM kernels, bf16...).
            mb.measured["logprob_mismatch"] = _mismatch(logprobs.detach(), mb.old_logprobs, mb.mask)
        inputs = LossInputs(
            mask=mb.mask, part=part, old_logprobs=mb.old_logprobs, advantages=mb.advantages,
            ref_logprobs=mb.ref_logprobs, entropy=entropy, is_weights=mb.is_weights, step=self.step,
        )
        loss, metrics = self.loss_fn(logprobs, inputs, self.algo)
        return loss, metrics

    def _temperature(self, part: str) -> float:
        """Rollouts were sampled under softmax(logits / temperature): their log-probs compare like
        with like. Written responses (expert data, preference pairs) are scored as the model is."""
        return self.temperature if part == USUAL else 1.0

    def _logprobs(self, model, mb: MicroBatch, temperature: float = 1.0, entropy: bool = False):
        """(log π of each response token [B, T] under softmax(logits / temperature), with `entropy`
        that softmax's entropy [B, T], else None): chunk by chunk, or from the whole logits in fp32
        (or wider) under fsdp (self.chunked)."""
        with self._forward_context():
            if self.chunked:
                hidden, head = response_hidden(model, mb)
                return chunked_logprobs(hidden, head, mb.response_ids, temperature, entropy)
            logits = at_least_fp32(response_logits(model, mb))
        logits = logits / temperature if temperature != 1.0 else logits
        return token_logprobs(logits, mb.response_ids), entropy_from_logits(logits) if entropy else None

    def _forward_context(self) -> ExitStack:
        """Autocast in the compute dtype over the fp32 weights; on CUDA, SDPA without its cuDNN
        backend: cuDNN builds a graph for every new shape (a few hundred ms each), and a run's
        micro-batches change width every step (on an H100 the first GRPO steps of SmolLM2 took
        2.3-4.7 s against 0.6 s, and a warm step spent 150 ms of host time in cuDNN's backward)."""
        stack = ExitStack()
        if self.autocast:
            stack.enter_context(torch.autocast(self.device.type, self.autocast))
        if self.device.type == "cuda":
            stack.enter_context(sdpa_kernel(TRAINING_ATTENTION))
        return stack

    @torch.no_grad()
    def _prepare(self, parts: list[tuple[str, list[MicroBatch]]]) -> None:
        """What the losses read besides the policy, fixed before any update. Rollouts: logπ_old
        (generation logprobs when every experience has them, they are the behaviour policy's;
        else the current policy's) and advantages (GAE for PPO). The reference's log-probs where
        a loss compares with it: preference pairs, and rollouts under a KL penalty."""
        for part, mbs in parts:
            for mb in mbs:
                if part == USUAL:
                    self._prepare_rollouts(mb)
                if part == PAIRS or (part == USUAL and self.algo.kl.fn != "none"):
                    with self._reference() as reference:
                        mb.ref_logprobs = self._logprobs(reference, mb, self._temperature(part))[0]
        if self.spec.whitens:
            self._whiten(dict(parts).get(USUAL, []))

    def _whiten(self, mbs: list[MicroBatch]) -> None:
        """Advantages whitened over the whole batch's kept tokens, every rank's micro-batches
        counted (verl whitens the batch; per micro-batch, 8 rows against two of 4 moved them by
        up to 0.34). Stand-ins (fsdp padding) weigh 0 and are left out."""
        real = [mb for mb in mbs if not mb.padding]
        token = [mb.advantages if mb.advantages.dim() == 2 else mb.advantages.unsqueeze(-1) * mb.mask for mb in real]
        white = whiten(token, [mb.mask for mb in real], self._sum_over_ranks, self.device)
        for mb, advantages in zip(real, white):
            mb.advantages = advantages
        for mb in mbs:
            if mb.padding:
                mb.advantages = torch.zeros_like(mb.mask)

    def _sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        if self.ranks is None:
            return t
        t = t.clone()
        self.ranks.sum_tensors([t])
        return t

    @contextmanager
    def _reference(self):
        """The reference model; with LoRA and no model.ref_path, the policy with its adapters off
        (the base, in eval mode as a loaded reference is): no second copy of the base in memory."""
        if self.reference is not None:
            yield self.reference
            return
        self.policy.eval()
        try:
            with self.policy.disable_adapter():
                yield self.policy
        finally:
            self.policy.train()

    def _prepare_rollouts(self, mb: MicroBatch) -> None:
        """logπ_old, the rollout correction, and the advantages the trainer computes (GAE with
        the critic's values, REINFORCE++'s returns) from each rollout's reward on the last token
        the model wrote (environment tokens of a multi-turn rollout are not the model's)."""
        if mb.advantages is None and not self.spec.token_advantages:
            raise ValueError("rollouts reached the trainer without advantages: the explorer's pipeline sets them")
        if mb.old_logprobs is None:
            trainer_logprobs = self._logprobs(self.policy, mb, self.temperature)[0]
            if mb.engine_rows is None:
                mb.old_logprobs = trainer_logprobs
            else:  # each row as in a micro-batch of its own kind: the grouping changes no step
                self._with_engine_logprobs(mb, mb.engine_logprobs, trainer_logprobs, mb.engine_rows)
        elif self.algo.rollout_correction.mode != "none":
            self._with_engine_logprobs(mb, mb.old_logprobs, self._logprobs(self.policy, mb, self.temperature)[0])
        elif mb.policy_pass:  # fsdp: another rank computes its logπ_old in this round (Trainer._share)
            self._logprobs(self.policy, mb, self.temperature)
        if self.critic is not None:
            mb.old_values = self._values(mb)
        if self.spec.token_advantages:
            token_rewards = last_token_rewards(mb.rewards, mb.mask)
            if self.spec.advantage_fn == "ppo":
                mb.advantages, mb.returns = compute_gae(
                    token_rewards, mb.old_values, mb.mask, self.algo.gae.gamma, self.algo.gae.lam
                )
            else:
                mb.advantages = discounted_returns(token_rewards, mb.mask, self.algo.gae.gamma)

    def _with_engine_logprobs(self, mb: MicroBatch, engine, trainer, rows=None) -> None:
        """logπ_old and the rollout correction from the engine's log-probs on `rows` (None: all)
        and the trainer's. Without a correction the engine's are logπ_old (the trainer's where a row
        has none); with one, the PPO ratio compares with the trainer's own logπ_old and the engine's
        only weight the tokens, a row without them weighing 1 (it was the whole micro-batch's
        correction that went when one row had none). The mismatch is measured before any update."""
        correction = self.algo.rollout_correction
        mask = mb.mask if rows is None else mb.mask * rows[:, None]
        mb.measured["logprob_mismatch"] = _mismatch(trainer, engine, mask)
        if correction.mode == "none":
            mb.old_logprobs = engine if rows is None else torch.where(rows[:, None], engine, trainer)
            return
        mb.old_logprobs = trainer
        # exp(0) = 1 where the mask is 0: those rows are weighed 1 and left out of the metrics
        mb.is_weights, metrics, count = rollout_correction_weights(
            trainer, engine, mask, correction.mode, correction.clip_min, correction.clip_max
        )
        mb.measured |= {key: (value, count) for key, value in metrics.items()}

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        width_t = mb.response_ids.shape[1]
        with self._forward_context():
            out = self.critic(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids)
        return out.logits[:, -width_t - 1 : -1, 0].float()

    def _critic_update(self, mbs: list[MicroBatch], total: float) -> dict:
        """One critic step on the rollouts' micro-batches (this rank's); `total`: the units of them all."""
        self.critic_optimizer.zero_grad(set_to_none=True)
        metrics = {}
        for mb in mbs:
            share = 0.0 if mb.padding else mb.units(self.algo.loss_agg_mode) / max(total, 1)
            loss, mb_metrics = value_loss(
                self._values(mb), mb.old_values, mb.returns, mb.mask, self.algo.value_clip,
                self.algo.loss_agg_mode, self.algo.loss_scale_factor,
            )
            (share * loss).backward()
            for key, value in mb_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + share * value
        self._sum_gradients(self.critic)
        self._clip(self.critic)
        self.critic_optimizer.step()
        return metrics

    def _batch_metrics(self, batch: TrainBatch, current_version: int, seconds: float) -> dict:
        experiences = batch.usual + batch.expert
        tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in experiences)
        tokens += sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in batch.pairs)
        metrics = {
            "seconds": seconds, "tokens_per_s": tokens / seconds,
            "experiences": len(experiences) + 2 * len(batch.pairs),
        }
        if batch.expert:
            metrics["expert_experiences"] = len(batch.expert)
        if batch.pairs:
            metrics["pairs"] = len(batch.pairs)
        if batch.usual:
            n = len(batch.usual)
            metrics["reward_mean"] = sum(e.reward or 0.0 for e in batch.usual) / n
            metrics["response_length"] = sum(len(e.response_ids) for e in batch.usual) / n
            versions = [e.model_version for e in batch.usual]
            metrics["staleness"] = current_version - sum(versions) / n
            metrics["staleness_max"] = current_version - min(versions)
            metrics["staleness_min"] = current_version - max(versions)
            # The histogram: the share of the batch each number of versions behind.
            lags = [current_version - version for version in versions]
            metrics["staleness_share"] = {str(lag): lags.count(lag) / n for lag in sorted(set(lags))}
        return metrics
