"""What one process of a run holds in memory at its peak, estimated from the model's config and
the run's shapes before anything loads: a launch compares it with the memory of the workers that
would serve the run (apps/runs/config_checks.py). Per-key limits alone accepted 8 tasks x 16
rollouts x 32,768 new tokens of the tiny model (a ~400-byte launch), whose pool processes passed
3 GB within seconds, were killed and handed to the next one, 7 kills in a minute.

The formula. A decoder of L layers, hidden size H, MLP size I, Hq query and Hkv key/value heads of
size d, vocabulary V, P parameters; b the compute dtype's bytes (4 fp32, 2 bf16 or fp16).

Explorer, the transformers engine: one call generates R rows of T = prompt + new tokens.
  weights     P b
  KV cache    2 L Hkv d R T b            a static cache, allocated whole for max_new_tokens
  decoding    2 L Hkv d R prompt b       the prompts' cache, copied to each row
              + 13 R T + 8 R new         token ids, log-probs and mask; the random numbers
              + 12 min(R Hq T, S)        one step's attention scores (CPU's plain attention)
              + R T Hkv d b              a layer's keys and values of the rows still running (at
                                         most R / 2), copied as the batch narrows to them
              + 20 R V                   the last logits and sampling's copies of them
              + 88 R new                 the rollouts as Python lists of ids and log-probs
  R = explorer.batch_size x algorithm.repeat_times, at least EVAL_CHUNK with eval;
  prompt = model.max_prompt_tokens, new = explorer.max_new_tokens.

Trainer, one rank; a micro-batch is M = trainer.micro_batch_size rows of T tokens (with
trainer.micro_batch_tokens, M = min(micro_batch_size, micro_batch_tokens // T): the longest rows).
  weights     4 P                        fp32 master weights (fsdp: / ranks, as the three below)
  gradients   4 P'                       P' trained: all of P, or the LoRA adapters
  optimizer   8 P'                       AdamW's two moments
  reference   4 P                        where the loss needs one (KL, DPO) other than the LoRA base
  critic      16 P                       PPO's value model: weights, gradients, moments
  activations s M T L A                  A: the bytes autograd keeps per token and layer (KV = Hkv d):
                                         32 H + 8 KV + 16 I in fp32, 30 H + 4 KV + 8 I under bf16
                                         autocast (the residual stream and norms stay fp32), measured
                                         (layer_bytes); checkpointed, M T (4 L H + A): each layer's
                                         fp32 input, and the layer being recomputed
  autocast    2 P                        under bf16 autocast, the bf16 copies of the fp32 weights: kept
                                         for the backward, or in autocast's cache until the forward
                                         ends when checkpointed (not counted under fsdp)
  attention   s (4 L M Hq T^2 + M T^2)   the fp32 score matrix a layer keeps where it is at most S
                                         elements (CPU's plain attention; SDPA, a GPU's, keeps none), the mask
  logits      s x 12 min(M T V, CHUNK)   the head applied CHUNK logits at a time; M T V under fsdp
  batch       88 B T                     the step's B = trainer batch rows as Python lists
  S = attention.MAX_SCORES. s = 2 on CPU, what a step's micro-batches allocate against one: over a
  step of 2 to 8 micro-batches the process's peak RSS was 1.4-1.75x a single one's (glibc keeps
  freed activations in its heap for the next), on the tiny model on CPU; s = 1 on a GPU, whose
  caching allocator hands a freed micro-batch's blocks to the next.

A process that runs both holds both (a `loop` duty: at synchronizer.offset >= 1 the explorer and the
trainer step at once; at offset 0 the transformers engine keeps its cache through the trainer's
step while it is within a tenth of the card, transformers_engine.KEPT_CACHE_SHARE, and past that
gives it back before the step, so there the estimate is high by that cache).
Against the tiny model on CPU (tests/workers/rft/test_footprint.py, which holds it to 0.9-2.5x): a
generate's peak RSS grew 80-83 and 78-88 MiB, estimated 96 and 87 (the narrowing's copy is 8-10 MiB
of the second: 77-79 with narrowing off); a train step's 419-472 and 904-1,007 MiB, estimated 497
and 1,365 (1.05-1.5x; a single micro-batch's step up to 2.1x). On an H100 (bench/README.md, issue
#25's gpu_step: SmolLM2-135M, 16 x 8 x 256 new tokens in one micro-batch, bf16, prompts of at most
40 tokens): measured 37,132 MiB at the peak, estimated 36,742 (0.99x).
GB here are GiB, as the Workers page's. Not counted: vLLM (it sizes its own KV cache within its
gpu_memory_utilization), a multi-turn episode beyond one turn, expert answers longer than
max_new_tokens, the CUDA engine's other cached decoders, and CUDA's own context (~0.5 GB a GPU).
"""
from collections.abc import Mapping
from dataclasses import dataclass, field

from .algorithms import resolve
from .attention import MAX_SCORES
from .explorer import EVAL_CHUNK
from .logprobs import CHUNK
from .loop import EXPLORER, TRAINER, components_of

GB = 2**30
SLACK = 2  # on CPU, a step's micro-batches against one: measured 1.4-1.75x (docstring)
PYTHON_TOKEN = 88  # bytes a token costs in Python lists: an int and a float (36 + 32), and a slice of each (16)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes, as its config.json gives them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True  # the output head is the embedding

    @classmethod
    def from_config(cls, config: Mapping) -> "ModelShape | None":
        """From a Hugging Face config.json (Llama, Qwen2, Mistral, SmolLM names); None when it
        lacks a size this needs (another architecture: nothing is estimated)."""
        config = config.get("text_config", config)
        sizes = [config.get(key) for key in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                             "num_attention_heads", "vocab_size")]
        if not all(isinstance(size, int) and size > 0 for size in sizes):
            return None
        layers, hidden, intermediate, heads, vocab = sizes
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        if not all(isinstance(size, int) and size > 0 for size in (kv_heads, head_dim)):
            return None
        return cls(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab,
                   bool(config.get("tie_word_embeddings", True)))

    def linear_sizes(self) -> dict[str, tuple[int, int]]:
        """{module name: (inputs, outputs)} of one layer's linear maps."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def params(self) -> int:
        """Parameters: the linear maps with the attention's biases (Qwen2 has them), two norms a
        layer, the final norm, the embedding and an untied head."""
        linear = sum(n_in * n_out for n_in, n_out in self.linear_sizes().values())
        biases = (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = linear + biases + 2 * self.hidden
        return self.layers * per_layer + self.hidden + self.vocab * self.hidden * (1 if self.tied else 2)

    def lora_params(self, r: int, target_modules: str | list) -> int:
        """A LoRA adapter's parameters: r x (inputs + outputs) for each targeted linear map. A
        module name this shape does not know counts as every map (an upper bound)."""
        sizes = self.linear_sizes()
        names = LORA_MODULES if target_modules == "all-linear" or set(target_modules) - set(sizes) else target_modules
        return self.layers * sum(r * sum(sizes[name]) for name in names)

    def kv_bytes(self, dtype_bytes: int) -> int:
        """The key/value cache of one token, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


# The built-in models as models.py builds (tiny) or installs (smollm2-135m) them, for a launch
# before their first use: the test checks these against the built config.json.
BUILTIN_SHAPES = {
    "tiny": ModelShape(layers=4, hidden=192, intermediate=768, heads=6, kv_heads=2, head_dim=32, vocab=602),
    "smollm2-135m": ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64,
                               vocab=49152),
}


@dataclass
class Footprint:
    """A process's peak bytes, by part (names as a person reads them: "explorer KV cache")."""

    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def __add__(self, other: "Footprint") -> "Footprint":
        merged = dict(self.parts)
        for name, size in other.parts.items():
            merged[name] = merged.get(name, 0) + size
        return Footprint(merged)

    def __mul__(self, times: int) -> "Footprint":
        return Footprint({name: size * times for name, size in self.parts.items()})

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.parts.items(), key=lambda part: -part[1])[:n]


def explorer_footprint(shape: ModelShape, rows: int, prompt: int, new: int, dtype_bytes: int) -> Footprint:
    """One engine call of `rows` rows (docstring: Explorer)."""
    tokens = prompt + new
    return Footprint({
        "explorer weights": shape.params * dtype_bytes,
        "explorer KV cache": rows * tokens * shape.kv_bytes(dtype_bytes),
        "explorer decoding": (rows * prompt * shape.kv_bytes(dtype_bytes) + 13 * rows * tokens + 8 * rows * new
                              + 12 * min(rows * shape.heads * tokens, MAX_SCORES)
                              + rows * tokens * shape.kv_bytes(dtype_bytes) // (2 * shape.layers)
                              + 20 * rows * shape.vocab),
        "rollouts": PYTHON_TOKEN * rows * new,
    })


def layer_bytes(shape: ModelShape, activation_bytes: int) -> int:
    """What autograd keeps per token and layer of a Llama/Qwen2 decoder layer with SDPA, in fp32
    (activation_bytes 4) or under bf16 autocast (2). Fitted exactly (to 0.4 %) to the tensors
    saved_tensors_hooks saw at SmolLM2-135M's, Qwen2.5-1.5B's and SmolLM2-1.7B's widths (the old
    12 H + 4 I elements missed the fp32 norms under autocast and the keys and values: 1.09-1.18x
    under); tests/workers/rft/test_footprint.py measures it again."""
    hidden, kv, intermediate = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    if activation_bytes >= 4:
        return 32 * hidden + 8 * kv + 16 * intermediate
    return 30 * hidden + 4 * kv + 8 * intermediate


def trainer_footprint(shape: ModelShape, *, rows: int, tokens: int, batch_rows: int, trained: int,
                      activation_bytes: int = 4, shards: int = 1, reference: bool = False, critic: bool = False,
                      chunked: bool = True, checkpointed: bool = False, on_gpu: bool = False) -> Footprint:
    """One rank of the trainer, `rows` rows of `tokens` tokens a micro-batch, `trained` parameters
    trained, its states over `shards` ranks (fsdp; docstring: Trainer)."""
    slack = 1 if on_gpu else SLACK
    params = shape.params
    layer = layer_bytes(shape, activation_bytes)
    # Checkpointed: each layer keeps its input (the fp32 residual stream); the one being recomputed
    # holds its own in full.
    per_token = 4 * shape.layers * shape.hidden + layer if checkpointed else shape.layers * layer
    activations = rows * tokens * per_token
    scores = rows * shape.heads * tokens * tokens
    logits = rows * tokens * shape.vocab
    parts = {
        "trainer weights": 4 * params // shards,
        "gradients": 4 * trained // shards,
        "optimizer": 8 * trained // shards,
        "trainer activations": slack * activations,
        "attention": slack * ((4 * shape.layers * scores if scores <= MAX_SCORES and not on_gpu else 0)
                              + rows * tokens * tokens),
        "logits": slack * 12 * (min(logits, CHUNK) if chunked else logits),
        "batch": PYTHON_TOKEN * batch_rows * tokens,
    }
    if activation_bytes < 4 and shards == 1:
        parts["autocast weights"] = activation_bytes * params
    if reference:
        parts["reference"] = 4 * params // shards
    if critic:
        parts["critic"] = 16 * params // shards
    return Footprint(parts)


@dataclass
class RunFootprint:
    """What one process of each kind holds: the explorer's, and one trainer rank's (None where the
    run's mode has none), with the ranks a machine runs (trainer.num_processes)."""

    explorer: Footprint | None
    trainer: Footprint | None
    ranks: int

    def process(self, explorer: bool, trainer: bool, on_gpu: bool) -> Footprint:
        """What a machine holds for a process serving these parts: on CPU its memory holds every
        rank, on GPUs each rank has its own and the first also the explorer's."""
        total = Footprint()
        if explorer and self.explorer is not None:
            total += self.explorer
        if trainer and self.trainer is not None:
            total += self.trainer if on_gpu else self.trainer * self.ranks
        return total


def compute_bytes(dtype: str, on_gpu: bool) -> int:
    """model.dtype's bytes as models.pick_dtype chooses: auto is bf16 on a GPU, fp32 on CPU."""
    return DTYPE_BYTES.get(dtype, 2 if on_gpu else 4)


def run_footprint(config, shape: ModelShape, on_gpu: bool) -> RunFootprint:
    """The estimate for a RunConfig whose policy has this shape (reference and critic taken as
    the same model), on GPUs or on CPU."""
    explorer_config, trainer_config, model = config.explorer, config.trainer, config.model
    components = components_of(config)
    spec = resolve(config)
    tokens = model.max_prompt_tokens + explorer_config.max_new_tokens
    explorer = None
    if EXPLORER in components:
        rows = explorer_config.batch_size * config.algorithm.repeat_times
        if explorer_config.eval_interval:
            rows = max(rows, EVAL_CHUNK)
        explorer = explorer_footprint(shape, rows, model.max_prompt_tokens, explorer_config.max_new_tokens,
                                      compute_bytes(model.dtype, on_gpu))
        if explorer_config.engine == "vllm":  # vLLM's KV cache is its own (gpu_memory_utilization)
            explorer.parts.pop("explorer KV cache")
    trainer, ranks = None, 1
    if TRAINER in components:
        several = trainer_config.strategy != "single"
        ranks = trainer_config.num_processes if several else 1
        sharded = trainer_config.strategy == "fsdp"
        fsdp = trainer_config.fsdp
        lora = model.lora
        trained = shape.lora_params(lora.r, lora.target_modules) if lora is not None else shape.params
        # A micro-batch holds at most a rank's share of the step's batch (distributed.py: rows
        # rank::world_size): micro_batch_size 4,096 on a batch of 128 was estimated at 4,096 rows.
        world = ranks * trainer_config.num_nodes if several else 1
        rows = min(trainer_config.micro_batch_size, -(-config.train_batch_size // world))
        if trainer_config.micro_batch_tokens:  # the longest rows fill a micro-batch's tokens with fewest rows
            rows = max(1, min(rows, trainer_config.micro_batch_tokens // tokens))
        trainer = trainer_footprint(
            shape, rows=rows, tokens=tokens, batch_rows=config.train_batch_size,
            trained=trained, activation_bytes=min(4, compute_bytes(model.dtype, on_gpu)),
            shards=ranks * trainer_config.num_nodes if sharded else 1,
            reference=spec.needs_reference and (lora is None or model.ref_path is not None),
            critic=spec.needs_critic, chunked=not sharded,
            checkpointed=trainer_config.activation_checkpointing, on_gpu=on_gpu,
        )
        if sharded and fsdp is not None and fsdp.cpu_offload and on_gpu:  # the states live in CPU memory
            for part in ("trainer weights", "gradients", "optimizer", "reference", "critic"):
                trainer.parts.pop(part, None)
    return RunFootprint(explorer, trainer, ranks)
