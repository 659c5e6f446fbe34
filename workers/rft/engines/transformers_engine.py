"""Rollouts with plain transformers: one batch of left-padded prompts, a KV cache, and a sampling
loop of our own so the logprobs, stop tokens and random seed are exactly what the trainer expects."""
from pathlib import Path

import torch

from ..models import copy_weights, read_weights, stop_token_ids
from .base import Completion, RolloutEngine, SamplingParams


class TransformersEngine(RolloutEngine):
    def __init__(self, model, tokenizer):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id
        self.model_version = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        generator = None
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        tokens, logprobs, finished_by_stop = self._sample(prompts, params, generator)
        completions = []
        for ids, lps, stopped in zip(tokens, logprobs, finished_by_stop):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, text, lps, "stop" if stopped else "length"))
        return [completions[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _sample(self, prompts: list[list[int]], params: SamplingParams, generator):
        """Rows are the prompts, each repeated params.n times in a row. Each prompt is prefilled
        once and its key/value cache repeated for its n samples."""
        device, n = self.device, params.n
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[i, width - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Left padding shifts every row; positions count real tokens only.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        stop_ids = torch.tensor(self.stop_ids, device=device)

        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1)
        cache, next_logits = out.past_key_values, out.logits[:, -1].float().repeat_interleave(n, dim=0)
        cache.batch_repeat_interleave(n)
        attention_mask = attention_mask.repeat_interleave(n, dim=0)
        positions = position_ids[:, -1].repeat_interleave(n, dim=0)
        finished = torch.zeros(len(prompts) * n, dtype=torch.bool, device=device)
        stopped = torch.zeros_like(finished)
        tokens, logprobs = [], []
        for _ in range(params.max_new_tokens):
            token, logprob = sample_token(next_logits, params.temperature, params.top_p, generator)
            token = torch.where(finished, self.pad_id, token)
            tokens.append(token)
            logprobs.append(logprob)
            alive = ~finished
            stopped |= alive & torch.isin(token, stop_ids)
            finished |= stopped
            if finished.all():
                break
            attention_mask = torch.cat([attention_mask, alive.long()[:, None]], dim=1)
            positions = positions + 1
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=positions[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, next_logits = out.past_key_values, out.logits[:, -1].float()

        tokens = torch.stack(tokens, dim=1).tolist()
        logprobs = torch.stack(logprobs, dim=1).tolist()
        lengths = _response_lengths(tokens, self.stop_ids, self.pad_id)
        return (
            [row[:n] for row, n in zip(tokens, lengths)],
            [row[:n] for row, n in zip(logprobs, lengths)],
            stopped.tolist(),
        )

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        copy_weights(self.model, state_dict)
        self.model_version = version

    def load_checkpoint(self, path: Path, version: int) -> None:
        self.load_state_dict(read_weights(path), version)


def _response_lengths(tokens: list[list[int]], stop_ids: list[int], pad_id: int) -> list[int]:
    """Each row runs up to and including its first stop token, else to the end."""
    lengths = []
    stops = set(stop_ids)
    for row in tokens:
        length = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        lengths.append(length)
    return lengths


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it with its logprob under softmax(logits / temperature).
    Top-p only narrows what may be drawn, the reported logprob is the untruncated one."""
    if temperature <= 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    token = draw(probs, generator)
    return token, logp.gather(-1, token[:, None])[:, 0]


def draw(probs: torch.Tensor, generator) -> torch.Tensor:
    """One index per row, with the row's probabilities (zeros are never drawn; rows need not sum
    to 1): inverse CDF with one uniform per row, several times faster than torch.multinomial on
    CPU for a large vocabulary."""
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
