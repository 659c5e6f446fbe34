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
Rows that stopped stop costing: once at most half the rows still run, those move to the front and
the steps go on over them alone (StaticDecoder.narrow; 1.24x on CPU with answers of varied length,
bench/README.md). A batch whose cache would not fit the free memory runs in rounds of as many
prompts as fit (`_rounds`), with the whole batch's random numbers: the same tokens.
On CUDA the step is compiled by inductor before it is captured (`compiled`): a captured graph
still runs each of its kernels, and at 135M it is ~1,650 small ones a step, bound by their
launches; inductor fuses the norms, rotary, activations and sampling into fewer. A step that
cannot compile runs uncompiled, with a warning.
"""
import logging
import os
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
# Captured decoders kept (least recently used goes first): at most MAX_DECODERS, their caches at most
# KEPT_CACHE_SHARE of the card's memory with the new one's. Each holds a cache of rows x length
# slots per layer: SmolLM2-135M's 128 rows x 320 slots are 0.9 GB in bf16, four of them 3.6; at
# SmolLM2-1.7B, 128 x 1,088 slots are 27 GB, and a trainer in the same process needs the memory of
# the ones not in use back (a capture costs a second or two; a step of that size, tens). Before a
# trainer step in the same process (a loop duty at offset 0: free_idle_caches) the last one used
# goes too when it alone is past the share: the step would otherwise run beside an idle 27 GB
# cache, which TRL (its cache freed after generating) does not hold.
MAX_DECODERS = 4
KEPT_CACHE_SHARE = 0.1
# How often the CUDA loop asks the host whether every row has stopped (each ask waits for the GPU);
# at most this many steps run after the last row stopped. On CPU every step: asking is free there.
CUDA_STOP_CHECK = 16
# Rows that stopped stop costing: once at most this share of a batch's rows still runs, the running
# rows move to the front of the batch's tensors and the steps go on over those rows only
# (StaticDecoder.narrow: views of the same storage, no second cache). On CUDA the narrowed row count
# rounds up to a power of two, so a batch has at most log2(rows) narrowed graphs; 0 turns it off.
COMPACT_BELOW = 0.5
MIN_COMPACT_ROWS = 4  # fewer rows than this are not worth a narrowed step (and its graph)
# A batch whose static cache (and logits) would take more than this share of the free memory is
# decoded in rounds of as many prompts as fit: the rest holds the model's activations.
KV_MEMORY_SHARE = 0.8
# RFTWEB_COMPILE_DECODE: compile the decode step with torch.compile: auto (on CUDA), 1 or 0. Not on
# CPU by default: SmolLM2-135M's step compiled in 42-44 s (6 s from inductor's disk cache) to be
# 1.3x faster at 16 rows there (2-core EPYC, bench/README.md), and the demo's tiny model would spend
# its first half-minute compiling.
COMPILE_SETTING = "RFTWEB_COMPILE_DECODE"

log = logging.getLogger(__name__)


def free_bytes(device: torch.device) -> int:
    """Memory a new cache may take: on CUDA what the card has free plus what torch's allocator
    holds unused; on CPU what the machine has available."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    import psutil

    return psutil.virtual_memory().available


def compile_by_default(device: torch.device) -> bool:
    """Whether the decode step is compiled on `device`, as RFTWEB_COMPILE_DECODE says."""
    value = os.environ.get(COMPILE_SETTING, "auto")
    if value not in ("auto", "1", "0"):
        raise ValueError(f"{COMPILE_SETTING} must be auto, 1 or 0, got {value!r}")
    return device.type == "cuda" if value == "auto" else value == "1"


class TransformersEngine(RolloutEngine):
    def __init__(self, model, tokenizer, compiled: bool | None = None):
        """`compiled`: compile the decode step (None: compile_by_default)."""
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
        self.compiled = compile_by_default(self.device) if compiled is None else compiled
        self._decoders: OrderedDict[tuple, StaticDecoder] = OrderedDict()  # CUDA: captured, by key

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        rows, steps, device = len(prompts) * params.n, params.max_new_tokens, self.device
        uniforms = None  # drawn for the whole batch up front: rounds sample what one batch would
        if params.temperature > 0:
            generator = None if params.seed is None else torch.Generator(device).manual_seed(params.seed)
            uniforms = torch.rand((steps, rows), generator=generator, device=device)
        tokens, logprobs, finished_by_stop = [], [], []
        for start, end in self._rounds(prompts, params):
            part = None if uniforms is None else uniforms[:, start * params.n : end * params.n]
            for out, got in zip((tokens, logprobs, finished_by_stop), self._sample(prompts[start:end], params, part)):
                out += got
        completions = []
        for ids, lps, stopped in zip(tokens, logprobs, finished_by_stop):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, text, lps, "stop" if stopped else "length"))
        return [completions[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _rounds(self, prompts: list[list[int]], params: SamplingParams) -> list[tuple[int, int]]:
        """The prompts in rounds ([start, end) ranges) whose static cache fits the memory free
        (KV_MEMORY_SHARE of it): one round when the batch fits. A ValueError saying what to lower
        when not even one prompt's rows fit."""
        width = max(len(prompt) for prompt in prompts)
        length = width + params.max_new_tokens
        if self.device.type == "cuda":
            length = -(-length // LENGTH_BUCKET) * LENGTH_BUCKET
        row_bytes = self._row_bytes(length)
        free = free_bytes(self.device)
        if len(prompts) * params.n * row_bytes > KV_MEMORY_SHARE * free and self._decoders:
            self._decoders.clear()  # the kept decoders' caches go first
            free = free_bytes(self.device)
        per_round = int(KV_MEMORY_SHARE * free // (params.n * row_bytes))
        if per_round < 1:
            raise ValueError(
                f"the rollout engine's cache for {params.n} rows of {length} tokens (one prompt's samples) needs "
                f"{params.n * row_bytes / 1e9:.1f} GB, and {free / 1e9:.1f} GB of {self.device.type} memory is free: "
                "lower explorer.max_new_tokens, model.max_prompt_tokens or algorithm.repeat_times")
        return [(start, min(start + per_round, len(prompts))) for start in range(0, len(prompts), per_round)]

    def _row_bytes(self, length: int) -> int:
        """What a decoder holds per row of `length` cache slots: its keys and values, its logits."""
        config = self.model.config.get_text_config()
        return (2 * config.num_hidden_layers * config.num_key_value_heads * _head_dim(config) * length
                * next(self.model.parameters()).element_size() + 4 * config.vocab_size)

    def _sample(self, prompts: list[list[int]], params: SamplingParams, uniforms: torch.Tensor | None):
        """Rows are the prompts, each repeated params.n times in a row; `uniforms` [steps, rows]
        (None when greedy)."""
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
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1)
        decoder = self._decoder(rows, width + steps, params.temperature, params.top_p)
        decoder.start(out.past_key_values, out.logits[:, -1], attention_mask, position_ids[:, -1], n, uniforms)
        del out
        results = Results(rows, steps, self.pad_id, device)
        origin = torch.arange(rows, device=device)  # the batch row each decoder row is
        check = CUDA_STOP_CHECK if device.type == "cuda" else 1
        for t in range(steps):
            check_stop()  # a Stop ends the step within seconds, not after max_new_tokens tokens
            decoder.step(feed=t < steps - 1)
            if t == steps - 1 or (t + 1) % check:
                continue
            running = (~decoder.finished[: len(origin)]).nonzero()[:, 0]
            if not len(running):
                break
            narrowed = _narrowed_rows(len(running), decoder.rows, device)
            if narrowed is not None:
                results.take(decoder, origin)  # the rows that stopped are done
                origin = origin[running]
                decoder = decoder.narrow(running, narrowed)
        results.take(decoder, origin)
        tokens, logprobs = results.tokens[:, : t + 1].tolist(), results.logprobs[:, : t + 1].tolist()
        lengths = _response_lengths(tokens, self.stop_ids, self.pad_id)
        return (
            [row[:n] for row, n in zip(tokens, lengths)],
            [row[:n] for row, n in zip(logprobs, lengths)],
            results.stopped.tolist(),
        )

    def _decoder(self, rows: int, length: int, temperature: float, top_p: float) -> "StaticDecoder":
        """A static cache for `rows` rows of at least `length` tokens; on CUDA kept with its graph
        (on CPU, with no graph to reuse, exactly `length`: every step attends over all of it)."""
        sampling = (temperature, top_p)
        if self.device.type != "cuda":
            return StaticDecoder(self.model, rows, length, sampling, self.stop_ids, self.pad_id, graph=False,
                                 compiled=self.compiled)
        key = (rows, -(-length // LENGTH_BUCKET) * LENGTH_BUCKET, sampling)
        if key in self._decoders:
            self._decoders.move_to_end(key)
        else:
            self._make_room(rows * self._row_bytes(key[1]), self._kept_budget())
            self._decoders[key] = StaticDecoder(self.model, *key[:2], sampling, self.stop_ids, self.pad_id, graph=True,
                                                compiled=self.compiled)
        return self._decoders[key]

    def free_idle_caches(self) -> None:
        """Before a trainer step in this process: keep the decoders whose caches are within the
        budget (KEPT_CACHE_SHARE), the last one used included; alone past it, it goes too."""
        if self._decoders:
            self._make_room(0, self._kept_budget(), count=MAX_DECODERS)

    def _kept_budget(self) -> float:
        """The bytes kept decoders' caches may hold: KEPT_CACHE_SHARE of the card."""
        return KEPT_CACHE_SHARE * torch.cuda.get_device_properties(self.device).total_memory

    def _make_room(self, new_bytes: int, budget: float, count: int = MAX_DECODERS - 1) -> None:
        """Drop kept decoders, least recently used first, until at most `count` remain (room for the
        decoder about to be made, by default) and their bytes and `new_bytes` (its) are within
        `budget`."""
        while self._decoders and (len(self._decoders) > count or new_bytes + sum(
                decoder.rows * self._row_bytes(decoder.length) for decoder in self._decoders.values()) > budget):
            self._decoders.popitem(last=False)

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        copy_weights(self.model, state_dict)  # in place: captured graphs read the new weights
        self.model_version = version

    def load_checkpoint(self, path: Path, version: int) -> None:
        self.load_state_dict(read_weights(path), version)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _narrowed_rows(running: int, rows: int, device: torch.device) -> int | None:
    """The rows a decoder of `rows` narrows to with `running` rows left, or None to go on as it is."""
    if rows < MIN_COMPACT_ROWS or running > COMPACT_BELOW * rows:
        return None
    narrowed = 1 << (running - 1).bit_length() if device.type == "cuda" else running
    return narrowed if narrowed < rows else None


class Results:
    """Each batch row's tokens, log-probs and stop, gathered from the decoders that ran it."""

    def __init__(self, rows: int, steps: int, pad_id: int, device: torch.device):
        self.tokens = torch.full((rows, steps), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, steps), device=device)
        self.stopped = torch.zeros(rows, dtype=torch.bool, device=device)

    def take(self, decoder: "StaticDecoder", origin: torch.Tensor) -> None:
        """What the decoder's first len(origin) rows hold so far, into batch rows `origin`."""
        count, steps = len(origin), self.tokens.shape[1]
        self.tokens[origin] = decoder.tokens[:count, :steps]
        self.logprobs[origin] = decoder.logprobs[:count, :steps]
        self.stopped[origin] = decoder.stopped[:count]


# A decoder's tensors with a row per batch row (dim 0); `uniforms` has one per step and row (dim 1).
ROW_TENSORS = ("logits", "tokens", "logprobs", "finished", "stopped", "token", "position", "mask")


class StaticDecoder:
    """The decode state of one batch in preallocated tensors, and one step over it: sample each
    row's next token from `logits`, record it, feed it through the model into `logits` again. Run
    eagerly, or as a replayed CUDA graph that reads and writes these same tensors; either way
    through inductor when `compiled`. `narrow` gives a decoder over the first rows of the same
    tensors, once most rows have stopped."""

    def __init__(self, model, rows: int, length: int, sampling: tuple[float, float], stop_ids: list[int],
                 pad_id: int, graph: bool, compiled: bool = False):
        config = model.config.get_text_config()
        param = next(model.parameters())
        device = param.device
        self.rows, self.length, self._narrowed = rows, length, {}  # narrowed decoders (CUDA: kept with graphs)
        self.model, self.pad_id = model, pad_id
        self.compiled = compiled and _compile_failure is None
        self.temperature, self.top_p = sampling
        self.cache = StaticCache(config=config, max_cache_len=length)
        self.cache.early_initialization(rows, config.num_key_value_heads, _head_dim(config), param.dtype, device)
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
        elif feed:
            self._step()
        else:
            self._sample()

    def _step(self) -> None:
        """_sample, then _feed: what a graph captures; compiled by inductor when `compiled` (the
        first call compiles: SmolLM2-135M, 42 s on CPU)."""
        if self.compiled:
            try:
                return compiled_step()(self)
            except torch._dynamo.exc.FailOnRecompileLimitHit:  # raised before the step ran, as the next
                self.compiled = False
                log.warning("the decode step of %d rows x %d slots runs uncompiled: torch.compile compiled the step "
                            "for as many shapes as torch._dynamo.config.recompile_limit allows (%d)",
                            self.rows, self.length, torch._dynamo.config.recompile_limit)
            except torch._dynamo.exc.TorchDynamoException as error:
                give_up_compiling(error)
                self.compiled = False
        _step_body(self)

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

    def narrow(self, running: torch.Tensor, rows: int) -> "StaticDecoder":
        """A decoder over this one's first `rows` rows, the `running` rows moved there (in their
        order; the rows past them copies of the first, stopped: they write pad tokens and are not
        read back), sharing every tensor's storage: no second cache. Its step is this one's over
        fewer rows; each row keeps its uniforms, so it samples the tokens it would have."""
        index = torch.cat([running, running[:1].expand(rows - len(running))])
        for layer in self.cache.layers:
            layer.keys[:rows] = layer.keys.index_select(0, index)  # a layer at a time: a small copy
            layer.values[:rows] = layer.values.index_select(0, index)
        for name in ROW_TENSORS:
            tensor = getattr(self, name)
            tensor[:rows] = tensor.index_select(0, index)
        self.uniforms[:, :rows] = self.uniforms.index_select(1, index)
        self.finished[len(running) : rows] = True
        narrowed = self._narrowed.get(rows)
        if narrowed is None:
            narrowed = self._narrowed[rows] = self._view(rows)
        return narrowed

    def _view(self, rows: int) -> "StaticDecoder":
        view = object.__new__(StaticDecoder)
        view.__dict__.update(self.__dict__, rows=rows, _narrowed={}, graph=None)
        for name in ROW_TENSORS:
            setattr(view, name, getattr(self, name)[:rows])
        view.uniforms = self.uniforms[:, :rows]
        view.cache = StaticCache(config=self.model.config.get_text_config(),
                                 max_cache_len=self.cache.layers[0].max_cache_len)
        for layer, full in zip(view.cache.layers, self.cache.layers):
            layer.__dict__.update(full.__dict__, keys=full.keys[:rows], values=full.values[:rows], batch_size=rows)
        if self.graph is not None:
            view.graph = view._capture_in_place()
        return view

    def _capture_in_place(self) -> torch.cuda.CUDAGraph:
        """_capture in the middle of a batch: what its warm-up and capture steps change, put back
        (the cache slots they wrote are past every row's mask, and overwritten before it reaches
        them)."""
        kept = {name: getattr(self, name).clone() for name in (*ROW_TENSORS, "step_index", "slot")}
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        graph = self._capture()
        for name, value in kept.items():
            getattr(self, name).copy_(value)
        for layer, length in zip(self.cache.layers, lengths):
            layer.cumulative_length.copy_(length)
        return graph

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Record the step once. Warm-up runs on a side stream first (as torch.cuda.graphs asks);
        what they write, start() overwrites. Captured thread-locally: at offset 1 the trainer's
        thread keeps launching work meanwhile."""
        self.mask[:, 0, 0, 0] = True  # a row that attends to nothing would be NaN in the warm-up
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()  # the first compiles, outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._step()
        return graph


# torch.compile's wrapper of the step, made on first use, one per process (each new shape
# compiles once more; from the second, inductor compiles for any shape). fullgraph: the step
# compiles whole or not at all, so one that cannot compile has run nothing and runs uncompiled.
_compiled_step = None
_compile_failure: str | None = None  # why the step could not compile: no decoder tries again


def _step_body(decoder: StaticDecoder) -> None:
    decoder._sample()
    decoder._feed()


def compiled_step():
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(_step_body, fullgraph=True)
    return _compiled_step


def give_up_compiling(error: Exception) -> None:
    global _compile_failure
    text = str(error).strip()
    _compile_failure = text.splitlines()[0][:300] if text else type(error).__name__
    log.warning("the decode step runs uncompiled: torch.compile failed: %s", _compile_failure)


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
