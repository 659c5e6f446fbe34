"""Token log-probs of a micro-batch's responses under a model.

The plain way materialises the logits of every response position, [B, T, V], in fp32, and autograd
keeps them for the backward: SmolLM2's 49,152-token vocabulary at 128 rows x 256 tokens is 6.4 GB
of logits, plus their bf16 copy and gradient. `response_hidden` stops at the last hidden states
([B, T, H], H = 576), and `chunked_logprobs` applies the output head and logsumexp to a slice of
positions at a time, each slice recomputed in the backward (torch.utils.checkpoint): never more
than CHUNK logits at once, the same numbers up to summation order.

Rollouts of one task share their prompt: the forward runs each distinct prompt once and the rows
that repeat it continue from its key/value cache (gradients flow back through the cache), which
saves (n - 1) / n of the prompt tokens' compute at group size n.
"""
from dataclasses import replace

import torch
from torch.utils.checkpoint import checkpoint

from .algorithms import entropy_from_logits

# Logit elements per chunk: 64 MB in fp32, 341 positions of SmolLM2's vocabulary. Large enough that
# the head's matmul per chunk stays efficient, small enough to vanish beside the activations.
CHUNK = 1 << 24


def _response_states(forward, mb):
    """The states (logits or hidden) at the position before each response token, [B, T, X].
    `forward(input_ids, attention_mask, position_ids, past, keep, cached)` -> (states of the last
    `keep` positions, the cache when `cached`). With shared prompts: one forward over the distinct prompts, its cache
    gathered to the rows, then the responses."""
    width_t = mb.response_ids.shape[1]
    if mb.prompt_rows is None:
        states, _ = forward(mb.input_ids, mb.attention_mask, mb.position_ids, None, width_t + 1, False)
        return states[:, :-1]
    width_p = mb.input_ids.shape[1] - width_t
    rows = mb.prompt_rows
    head, cache = forward(mb.input_ids[rows, :width_p], mb.attention_mask[rows, :width_p],
                          mb.position_ids[rows, :width_p], None, 1, True)
    first = head[mb.row_prompt]  # [B, 1, X]: predicts the first response token
    if width_t == 1:
        return first
    cache.batch_select_indices(mb.row_prompt)
    tail, _ = forward(mb.input_ids[:, width_p:-1], mb.attention_mask[:, :-1], mb.position_ids[:, width_p:-1],
                      cache, width_t - 1, True)
    return torch.cat([first, tail], dim=1)


def _shares_prompts(model, mb) -> bool:
    # Gradient checkpointing drops the cache in training (transformers' GradientCheckpointingLayer).
    return mb.prompt_rows is not None and not (model.training and getattr(model, "is_gradient_checkpointing", False))


def response_logits(model, mb) -> torch.Tensor:
    """[B, T, V]: the logits at the position before each response token, from the model's own
    forward (under fsdp its root module's hooks gather the embeddings and head there)."""
    def forward(input_ids, attention_mask, position_ids, past, keep, cached):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=past, use_cache=cached, logits_to_keep=keep)
        return out.logits, out.past_key_values

    if not _shares_prompts(model, mb):
        mb = _plain(mb)
    return _response_states(forward, mb)


def response_hidden(model, mb) -> tuple[torch.Tensor, torch.nn.Module]:
    """([B, T, H] the last hidden states before each response token, the output head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's LoRA wrapper
    decoder = base.get_decoder()

    def forward(input_ids, attention_mask, position_ids, past, keep, cached):
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=past, use_cache=cached)
        return out.last_hidden_state[:, -keep:], out.past_key_values

    if not _shares_prompts(model, mb):
        mb = _plain(mb)
    return _response_states(forward, mb), base.get_output_embeddings()


def _plain(mb):
    return replace(mb, prompt_rows=None, row_prompt=None)


def at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 logits in fp32 for the softmax; fp64 (the exactness tests) stays fp64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # logsumexp keeps no [B, T, V] output for backward, as log_softmax would.
    return logits.gather(-1, tokens[..., None])[..., 0] - logits.logsumexp(-1)


def chunked_logprobs(hidden: torch.Tensor, head: torch.nn.Module, tokens: torch.Tensor, temperature: float = 1.0,
                     entropy: bool = False, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(token) under softmax(head(hidden) / temperature), [B, T], and with `entropy` the
    softmax's entropy, [B, T], computed `chunk` logit elements at a time; with gradients enabled
    each chunk's logits are recomputed in the backward instead of kept."""
    def piece(h, ids):
        logits = at_least_fp32(head(h))
        if temperature != 1.0:
            logits = logits / temperature
        lp = token_logprobs(logits, ids)
        return (lp, entropy_from_logits(logits)) if entropy else (lp,)

    flat, ids = hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1)
    rows = max(1, chunk // head.weight.shape[0])
    parts = []
    for start in range(0, len(flat), rows):
        args = (flat[start : start + rows], ids[start : start + rows])
        parts.append(checkpoint(piece, *args, use_reentrant=False) if torch.is_grad_enabled() else piece(*args))
    logprobs = torch.cat([p[0] for p in parts]).view(tokens.shape)
    return logprobs, torch.cat([p[1] for p in parts]).view(tokens.shape) if entropy else None
