"""Micro-batches: the rows of one part of a batch (usual rollouts, expert data, preference pairs),
collated on the trainer's device, prompts left-padded and responses right-padded so every response
starts at the same column and per-token tensors are [B, T] over response tokens.

How many rows a micro-batch holds: trainer.micro_batch_size, and with trainer.micro_batch_tokens
also at most that many padded tokens (rows x (longest prompt + longest response)): answers of
varied length, 40 to 1,024 tokens, then make short-answer micro-batches of many rows and long ones
of few, instead of sizing every micro-batch for the longest answer (issue #43). The loss weighs each
micro-batch by its share of its part's tokens or sequences, so how rows are grouped changes a step
only by summation order.
"""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from .algorithms import PAIRS, USUAL
from .experience import Experience


@dataclass
class MicroBatch:
    """Collated experiences, on the trainer's device."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: the action mask, 0 on padding
    old_logprobs: torch.Tensor | None  # [B, T] the behaviour policy's, None when some are missing
    advantages: torch.Tensor | None  # [B] from the explorer's group advantage, or [B, T] from GAE
    rewards: torch.Tensor  # [B]
    returns: torch.Tensor | None = None  # [B, T] critic targets (PPO)
    old_values: torch.Tensor | None = None  # [B, T]
    rollout_logprobs: bool = False  # old_logprobs came from the rollout engine
    # Some rows have the engine's log-probs and some not (engine_rows [B]): engine_logprobs holds
    # them, 0 elsewhere; the trainer computes logπ_old and takes each row as its kind (Trainer._prepare_rollouts).
    engine_rows: torch.Tensor | None = None
    engine_logprobs: torch.Tensor | None = None
    prompt_rows: torch.Tensor | None = None  # [U] the first row of each distinct prompt; None: all distinct
    row_prompt: torch.Tensor | None = None  # [B] each row's index into prompt_rows
    # Measured once, before the update: metric -> (its mean here, the tokens or sequences it covers),
    # averaged over the step by what each micro-batch covers (logprob_mismatch, the correction's).
    measured: dict[str, tuple[float, float]] = field(default_factory=dict)
    ref_logprobs: torch.Tensor | None = None  # [B, T] the reference model's, where a loss reads them
    is_weights: torch.Tensor | None = None  # rollout-correction weights (algorithms/correction.py)
    # fsdp (Trainer._share): a stand-in that keeps this rank's passes in step with the others',
    # weighted 0; and whether a rollout micro-batch runs the policy's no-grad forward for logπ_old
    # although it has them, because another rank's micro-batch of the same round has none.
    padding: bool = False
    policy_pass: bool = False

    @cached_property
    def tokens(self) -> float:
        """The tokens its losses cover, read once (on a GPU each read is a sync)."""
        return self.mask.sum().item()

    def units(self, agg_mode: str, part: str = USUAL) -> float:
        """How much this micro-batch weighs in its part's loss: tokens (token-mean) or sequences
        (seq-mean modes); pairs for DPO, whose loss is a mean over pairs."""
        if part == PAIRS:
            return self.mask.shape[0] / 2
        if agg_mode == "token-mean":
            return self.tokens
        return (self.mask.sum(-1) > 0).sum().item()


def collate(experiences: list[Experience], pad_id: int, device: torch.device) -> MicroBatch:
    width_p = max(len(e.prompt_ids) for e in experiences)
    width_t = max(max(len(e.response_ids) for e in experiences), 1)
    n = len(experiences)
    input_ids = torch.full((n, width_p + width_t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width_p + width_t), dtype=torch.long)
    response_ids = torch.full((n, width_t), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width_t))
    old_logprobs = torch.zeros((n, width_t))
    for i, e in enumerate(experiences):
        p, t = len(e.prompt_ids), len(e.response_ids)
        # as_tensor: a store's numpy arrays are copied once, into the batch (lists are converted).
        input_ids[i, width_p - p : width_p] = torch.as_tensor(e.prompt_ids)
        input_ids[i, width_p : width_p + t] = torch.as_tensor(e.response_ids)
        attention_mask[i, width_p - p : width_p + t] = 1
        response_ids[i, :t] = torch.as_tensor(e.response_ids)
        mask[i, :t] = torch.as_tensor(e.action_mask)
        if e.logprobs is not None:
            old_logprobs[i, :t] = torch.as_tensor(e.logprobs)
    engine_rows = [e.logprobs is not None for e in experiences]
    has_logprobs, partial = all(engine_rows), any(engine_rows) and not all(engine_rows)
    has_advantages = all(e.advantage is not None for e in experiences)
    first_rows, row_prompt, index = [], [], {}  # index: prompt -> its position in first_rows
    for i, e in enumerate(experiences):
        key = tuple(e.prompt_ids.tolist() if isinstance(e.prompt_ids, np.ndarray) else e.prompt_ids)
        if key not in index:
            index[key] = len(first_rows)
            first_rows.append(i)
        row_prompt.append(index[key])
    shared = len(first_rows) < n
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0).to(device),
        response_ids=response_ids.to(device),
        mask=mask.to(device),
        old_logprobs=old_logprobs.to(device) if has_logprobs else None,
        advantages=torch.tensor([e.advantage for e in experiences], device=device) if has_advantages else None,
        rewards=torch.tensor([e.reward or 0.0 for e in experiences], device=device),
        rollout_logprobs=has_logprobs,
        engine_rows=torch.tensor(engine_rows, device=device) if partial else None,
        engine_logprobs=old_logprobs.to(device) if partial else None,
        prompt_rows=torch.tensor(first_rows, device=device) if shared else None,
        row_prompt=torch.tensor(row_prompt, device=device) if shared else None,
    )


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def pack(rows: list[Experience], most_rows: int, most_tokens: int | None = None) -> list[list[Experience]]:
    """Consecutive rows (a group's rollouts stay together, sharing their prompt's forward), at most
    `most_rows` a micro-batch and, with `most_tokens`, at most that many padded tokens as collate
    pads them; a row longer than that alone is a micro-batch of its own."""
    if most_tokens is None:
        return chunks(rows, most_rows)
    out, current, prompt, response = [], [], 0, 0
    for row in rows:
        wider = max(prompt, len(row.prompt_ids)), max(response, len(row.response_ids), 1)
        if current and (len(current) == most_rows or (len(current) + 1) * sum(wider) > most_tokens):
            out.append(current)
            current, wider = [], (len(row.prompt_ids), max(len(row.response_ids), 1))
        current.append(row)
        prompt, response = wider
    return out + [current] if current else out


def pack_pairs(pairs: list, most_rows: int, most_tokens: int | None = None) -> list[list[Experience]]:
    """DPO's micro-batches: each its pairs' chosen rows, then their rejected rows (the layout the
    dpo loss reads). A pair's two rows go together: at most most_rows rows (a pair at least) and,
    with `most_tokens`, at most that many padded tokens, as `pack` does rows (pairs were cut by
    rows alone: four pairs of 300 tokens made one micro-batch of 2,400 under a budget of 600)."""
    groups, current, prompt, response = [], [], 0, 0
    for pair in pairs:
        rows = pair.as_experiences()
        own = max(len(r.prompt_ids) for r in rows), max(1, *(len(r.response_ids) for r in rows))
        wider = max(prompt, own[0]), max(response, own[1])
        full = len(current) == max(1, most_rows // 2)
        if current and (full or (most_tokens is not None and 2 * (len(current) + 1) * sum(wider) > most_tokens)):
            groups.append(current)
            current, wider = [], own
        current.append(rows)
        prompt, response = wider
    groups += [current] if current else []
    return [[*(chosen for chosen, _ in group), *(rejected for _, rejected in group)] for group in groups]
