"""Rollouts with plain transformers: one batch of left-padded prompts and a sampling loop of our
own, so the logprobs, stop tokens and random seed are exactly what the trainer expects.

Each distinct prompt is prefilled once (a dynamic cache), then copied n times into a static,
preallocated key/value cache that every decode step reads and writes in place. On CUDA the decode
step's forward is captured once in a CUDA graph per (rows, cache length) and replayed: one launch
instead of a few hundred small kernels a token (SmolLM2-135M decoding 128 rows on an H100 took 48 ms
a step in eager mode, bound by launches and Python, issue #25). Sampling stays outside the graph, so
a seeded torch.Generator draws exactly the stream it draws in eager mode, and stop tokens are
checked on the host only every few steps. Weights are updated in place, so a graph survives them.
"""
from pathlib import Path

import torch
from transformers import StaticCache

from ..models import copy_weights, read_weights, stop_token_ids
from .base import Completion, RolloutEngine, SamplingParams

# Cache lengths round up to this: a run's prompt widths vary a little from step to step, and each
# distinct (rows, length) costs a graph capture and its own cache on the GPU.
LENGTH_BUCKET = 64
# How often the CUDA loop asks the host whether every row has stopped (each ask waits for the GPU);
# at most this many steps run after the last row stopped. On CPU every step: asking is free there.
CUDA_STOP_CHECK = 16


class TransformersEngine(RolloutEngine):
    def __init__(self, model, tokenizer):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id
        self.model_version = 0
        self._decoders: dict[tuple[int, int], StaticDecoder] = {}  # CUDA: (rows, length) -> its graph

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
        """Rows are the prompts, each repeated params.n times in a row."""
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
        next_logits = out.logits[:, -1].float().repeat_interleave(n, dim=0)
        rows, steps = len(prompts) * n, params.max_new_tokens
        decoder = self._decoder(rows, width + steps)
        decoder.start(out.past_key_values, attention_mask.repeat_interleave(n, dim=0),
                      position_ids[:, -1].repeat_interleave(n, dim=0), n)
        del out
        check = CUDA_STOP_CHECK if device.type == "cuda" else 1
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        stopped = torch.zeros_like(finished)
        tokens = torch.full((rows, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((rows, steps), device=device)
        for t in range(steps):
            token, logprob = sample_token(next_logits, params.temperature, params.top_p, generator)
            token = torch.where(finished, self.pad_id, token)
            tokens[:, t], logprobs[:, t] = token, logprob
            stopped |= ~finished & torch.isin(token, stop_ids)
            finished |= stopped
            if t == steps - 1 or ((t + 1) % check == 0 and finished.all()):
                break
            next_logits = decoder.step(token)

        tokens, logprobs = tokens[:, : t + 1].tolist(), logprobs[:, : t + 1].tolist()
        lengths = _response_lengths(tokens, self.stop_ids, self.pad_id)
        return (
            [row[:n] for row, n in zip(tokens, lengths)],
            [row[:n] for row, n in zip(logprobs, lengths)],
            stopped.tolist(),
        )

    def _decoder(self, rows: int, length: int) -> "StaticDecoder":
        """A static cache for `rows` rows of at least `length` tokens; on CUDA kept with its graph
        (on CPU, with no graph to reuse, exactly `length`: every step attends over all of it)."""
        if self.device.type != "cuda":
            return StaticDecoder(self.model, rows, length, graph=False)
        key = (rows, -(-length // LENGTH_BUCKET) * LENGTH_BUCKET)
        if key not in self._decoders:
            self._decoders[key] = StaticDecoder(self.model, *key, graph=True)
        return self._decoders[key]

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        copy_weights(self.model, state_dict)  # in place: captured graphs read the new weights
        self.model_version = version

    def load_checkpoint(self, path: Path, version: int) -> None:
        self.load_state_dict(read_weights(path), version)


class StaticDecoder:
    """One decode step over a static cache: input buffers updated in place, then the model's
    forward, eager or as a replayed CUDA graph (which reads and writes these same buffers)."""

    def __init__(self, model, rows: int, length: int, graph: bool):
        config = model.config.get_text_config()
        param = next(model.parameters())
        self.model = model
        self.cache = StaticCache(config=config, max_cache_len=length)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(rows, config.num_key_value_heads, head_dim, param.dtype, param.device)
        self.token = torch.zeros((rows, 1), dtype=torch.long, device=param.device)
        self.position = torch.zeros((rows, 1), dtype=torch.long, device=param.device)
        # Which cache slots each row attends to ([rows, 1, query 1, length], True: attend; SDPA's and
        # gqa_eager's form): a 4D mask goes to the attention as it is, so transformers builds none
        # (and syncs nowhere) in the step.
        self.mask = torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=param.device)
        self.graph = self._capture() if graph else None

    def start(self, prefill, attention_mask: torch.Tensor, positions: torch.Tensor, n: int) -> None:
        """Take the prompts' cache (one row per prompt, repeated n times here) and their mask."""
        width = attention_mask.shape[1]
        for layer, prompt in zip(self.cache.layers, prefill.layers):
            layer.keys[:, :, :width] = prompt.keys.repeat_interleave(n, dim=0)
            layer.values[:, :, :width] = prompt.values.repeat_interleave(n, dim=0)
            layer.cumulative_length.fill_(width)  # where StaticLayer.update writes the next token
        self.mask.zero_()
        self.mask[:, 0, 0, :width] = attention_mask.bool()
        self.position.copy_(positions[:, None])
        self.slot = width

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed `token` [rows]; the float logits [rows, V] of the next one."""
        self.token.copy_(token[:, None])
        self.position += 1
        self.mask[:, 0, 0, self.slot] = True  # the new token's own slot
        self.slot += 1
        if self.graph is None:
            return self._forward()
        self.graph.replay()
        return self.logits

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.token, attention_mask=self.mask, position_ids=self.position,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Record the step once. Warm-up runs on a side stream first (as torch.cuda.graphs asks);
        what they write to the cache and mask, start() overwrites. Captured thread-locally: at
        offset 1 the trainer's thread keeps launching work meanwhile."""
        self.mask[:, 0, 0, 0] = True  # a row that attends to nothing would be NaN in the warm-up
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits = self._forward()
        return graph


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
