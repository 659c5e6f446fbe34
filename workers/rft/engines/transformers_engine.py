"""Rollouts with plain transformers: one batch of left-padded prompts and a sampling loop of our
own, so the logprobs, stop tokens and random seed are exactly what the trainer expects.

Each distinct prompt is prefilled once (a dynamic cache), then copied n times into a static,
preallocated key/value cache. One decode step samples a token from the last logits, records it,
and feeds it through the model; every tensor it reads and writes is preallocated and its step
counter lives on the device, so on CUDA the whole step is captured once in a CUDA graph per
(rows, cache length, sampling) and replayed: one launch instead of a few hundred small kernels and
no host round trip a token (SmolLM2-135M decoding 128 rows on an H100: 48 ms a step in eager mode,
bound by launches and Python, issue #25; 8.8 ms with only the forward captured; 5.0 ms with the
sampling captured too and grouped-query attention). The random numbers are drawn up front, one
per row and step, so a seeded run samples the same tokens captured or eager. Stop tokens are
checked on the host only every few steps. Weights are updated in place, so a graph survives them.
"""
from collections import OrderedDict
from pathlib import Path

import torch
from transformers import StaticCache

from ..attention import NAME as GQA_ATTENTION
from ..models import copy_weights, read_weights, stop_token_ids
from ..stopping import check as check_stop
from .base import Completion, RolloutEngine, SamplingParams

# Cache lengths round up to this: a run's prompt widths vary a little from step to step, and each
# distinct (rows, length) costs a graph capture and its own cache on the GPU.
LENGTH_BUCKET = 64
# Captured decoders kept (least recently used goes first): each holds a cache of rows x length
# slots per layer (SmolLM2-135M, 128 rows x 320 slots: 0.9 GB in bf16).
MAX_DECODERS = 4
# How often the CUDA loop asks the host whether every row has stopped (each ask waits for the GPU);
# at most this many steps run after the last row stopped. On CPU every step: asking is free there.
CUDA_STOP_CHECK = 16


class TransformersEngine(RolloutEngine):
    def __init__(self, model, tokenizer):
        # One query a row reads each key/value head once as two batched matmuls (attention.py);
        # SDPA under a padding mask copies K and V out to every query head first, 3x the cache's
        # bytes a step for SmolLM2's 9 query / 3 key-value heads (H100, 128 rows: 25,560 tokens/s
        # against 14,835, bench/README "The decode loop alone").
        if model.config._attn_implementation != GQA_ATTENTION:
            model.set_attn_implementation(GQA_ATTENTION)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id
        self.model_version = 0
        self._decoders: OrderedDict[tuple, StaticDecoder] = OrderedDict()  # CUDA: captured, by key

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        tokens, logprobs, finished_by_stop = self._sample(prompts, params)
        completions = []
        for ids, lps, stopped in zip(tokens, logprobs, finished_by_stop):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, text, lps, "stop" if stopped else "length"))
        return [completions[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _sample(self, prompts: list[list[int]], params: SamplingParams):
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
        rows, steps = len(prompts) * n, params.max_new_tokens
        uniforms = None
        if params.temperature > 0:
            generator = None if params.seed is None else torch.Generator(device).manual_seed(params.seed)
            uniforms = torch.rand((steps, rows), generator=generator, device=device)

        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1)
        decoder = self._decoder(rows, width + steps, params.temperature, params.top_p)
        decoder.start(out.past_key_values, out.logits[:, -1], attention_mask, position_ids[:, -1], n, uniforms)
        del out
        check = CUDA_STOP_CHECK if device.type == "cuda" else 1
        for t in range(steps):
            check_stop()  # a Stop ends the step within seconds, not after max_new_tokens tokens
            decoder.step(feed=t < steps - 1)
            if t == steps - 1 or ((t + 1) % check == 0 and decoder.finished.all()):
                break

        tokens, logprobs = decoder.tokens[:, : t + 1].tolist(), decoder.logprobs[:, : t + 1].tolist()
        lengths = _response_lengths(tokens, self.stop_ids, self.pad_id)
        return (
            [row[:n] for row, n in zip(tokens, lengths)],
            [row[:n] for row, n in zip(logprobs, lengths)],
            decoder.stopped.tolist(),
        )

    def _decoder(self, rows: int, length: int, temperature: float, top_p: float) -> "StaticDecoder":
        """A static cache for `rows` rows of at least `length` tokens; on CUDA kept with its graph
        (on CPU, with no graph to reuse, exactly `length`: every step attends over all of it)."""
        sampling = (temperature, top_p)
        if self.device.type != "cuda":
            return StaticDecoder(self.model, rows, length, sampling, self.stop_ids, self.pad_id, graph=False)
        key = (rows, -(-length // LENGTH_BUCKET) * LENGTH_BUCKET, sampling)
        if key in self._decoders:
            self._decoders.move_to_end(key)
        else:
            while len(self._decoders) >= MAX_DECODERS:
                self._decoders.popitem(last=False)
            self._decoders[key] = StaticDecoder(self.model, *key[:2], sampling, self.stop_ids, self.pad_id, graph=True)
        return self._decoders[key]

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        copy_weights(self.model, state_dict)  # in place: captured graphs read the new weights
        self.model_version = version

    def load_checkpoint(self, path: Path, version: int) -> None:
        self.load_state_dict(read_weights(path), version)


class StaticDecoder:
    """The decode state of one batch in preallocated tensors, and one step over it: sample each
    row's next token from `logits`, record it, feed it through the model into `logits` again. Run
    eagerly, or as a replayed CUDA graph that reads and writes these same tensors."""

    def __init__(self, model, rows: int, length: int, sampling: tuple[float, float], stop_ids: list[int],
                 pad_id: int, graph: bool):
        config = model.config.get_text_config()
        param = next(model.parameters())
        device = param.device
        self.model, self.pad_id = model, pad_id
        self.temperature, self.top_p = sampling
        self.cache = StaticCache(config=config, max_cache_len=length)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(rows, config.num_key_value_heads, head_dim, param.dtype, device)
        self.stop_ids = torch.tensor(stop_ids, device=device)
        self.logits = torch.zeros((rows, config.vocab_size), device=device)  # float: what sampling reads
        self.uniforms = torch.zeros((length, rows), device=device)  # one per step and row
        self.step_index = torch.zeros(1, dtype=torch.long, device=device)  # the step being sampled
        self.tokens = torch.full((rows, length), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, length), device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.stopped = torch.zeros_like(self.finished)  # finished by a stop token (not by the limit)
        # The model's inputs for the fed token: the token, its position, its cache slot, and which
        # cache slots each row attends to ([rows, 1, query 1, length], True: attend; SDPA's form):
        # a 4D mask goes to the attention as it is, so transformers builds none in the step.
        self.token = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=device)
        self.graph = self._capture() if graph else None

    def start(self, prefill, logits: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
              n: int, uniforms: torch.Tensor | None) -> None:
        """Take the prompts' cache and last logits (one row per prompt, repeated n times here),
        their mask and last positions, and the step's uniforms ([steps, rows], None when greedy)."""
        width = attention_mask.shape[1]
        for layer, prompt in zip(self.cache.layers, prefill.layers):
            layer.keys[:, :, :width] = prompt.keys.repeat_interleave(n, dim=0)
            layer.values[:, :, :width] = prompt.values.repeat_interleave(n, dim=0)
            layer.cumulative_length.fill_(width)  # where StaticLayer.update writes the next token
        self.logits.copy_(logits.repeat_interleave(n, dim=0))
        if uniforms is not None:
            self.uniforms[: len(uniforms)].copy_(uniforms)
        self.mask.zero_()
        self.mask[:, 0, 0, :width] = attention_mask.bool().repeat_interleave(n, dim=0)
        self.position.copy_(positions.repeat_interleave(n, dim=0)[:, None])
        self.slot.fill_(width)
        self.step_index.zero_()
        self.tokens.fill_(self.pad_id)
        self.finished.zero_()
        self.stopped.zero_()

    def step(self, feed: bool = True) -> None:
        """Sample and record one token per row; then (`feed`) run it through the model. A graph
        always feeds (the last step's forward is wasted); eager skips it after the last token."""
        if self.graph is not None:
            self.graph.replay()
            return
        self._sample()
        if feed:
            self._feed()

    def _sample(self) -> None:
        t = self.step_index
        uniform = self.uniforms.index_select(0, t)[0]
        token, logprob = sample_token(self.logits, self.temperature, self.top_p, uniform)
        token = torch.where(self.finished, self.pad_id, token)
        self.tokens.index_copy_(1, t, token[:, None])
        self.logprobs.index_copy_(1, t, logprob[:, None])
        self.stopped |= ~self.finished & (token[:, None] == self.stop_ids).any(-1)
        self.finished |= self.stopped
        self.token.copy_(token[:, None])
        self.step_index += 1

    def _feed(self) -> None:
        self.position += 1
        self.mask.index_fill_(3, self.slot, True)  # the new token's own slot
        self.slot += 1
        out = self.model(input_ids=self.token, attention_mask=self.mask, position_ids=self.position,
                         past_key_values=self.cache, use_cache=True)
        self.logits.copy_(out.logits[:, -1])

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Record the step once. Warm-up runs on a side stream first (as torch.cuda.graphs asks);
        what they write, start() overwrites. Captured thread-locally: at offset 1 the trainer's
        thread keeps launching work meanwhile."""
        self.mask[:, 0, 0, 0] = True  # a row that attends to nothing would be NaN in the warm-up
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._sample()
                self._feed()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._sample()
            self._feed()
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
    logits: torch.Tensor, temperature: float, top_p: float, uniform: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with the row's uniform in [0, 1) (unused when greedy:
    temperature 0); return it with its logprob under softmax(logits / temperature). Top-p only
    narrows what may be drawn, the reported logprob is the untruncated one."""
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
    token = draw(probs, uniform)
    return token, logp.gather(-1, token[:, None])[:, 0]


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One index per row, with the row's probabilities (zeros are never drawn; rows need not sum
    to 1), by inverse CDF at the row's uniform in [0, 1): several times faster than
    torch.multinomial on CPU for a large vocabulary, and it needs no generator (CUDA graphs)."""
    cdf = probs.cumsum(-1)
    u = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
