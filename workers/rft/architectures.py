"""Real architectures with random weights: the benchmark models of issue #43.

Real weights cannot be brought to the GPU machine (64 MiB is all that travels), so each model is
its published architecture with random weights (seed 0) and SmolLM2's tokenizer and chat template;
Qwen2.5-1.5B's vocabulary is set to the tokenizer's (49,152) so that one tokenizer serves all three.
They span what people train: SmolLM2-135M (grouped-query, 9 query / 3 key-value heads),
SmolLM2-1.7B (full multi-head attention: the heavy KV cache) and Qwen2.5-1.5B (12 / 2 heads: the
light cache; biases on q, k and v; rope theta 1e6). `tiny=True` keeps each architecture (attention
kind and head ratio, biases, rope, tied embeddings) at a width the CPU tests decode in seconds.
"""
from pathlib import Path

import torch

# name -> (transformers' model type, sizes from the model's published config.json)
ARCHITECTURES = {
    "smollm2-135m": ("llama", {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "rope_theta": 100_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192}),
    "smollm2-1.7b": ("llama", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
        "num_key_value_heads": 32, "rope_theta": 130_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192}),
    "qwen2.5-1.5b": ("qwen2", {
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768}),
}
# The same head ratios at 2 layers and a head width of 16-32.
TINY = {
    "smollm2-135m": {"hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 3,
                     "num_key_value_heads": 1},
    "smollm2-1.7b": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 4},
    "qwen2.5-1.5b": {"hidden_size": 96, "intermediate_size": 280, "num_hidden_layers": 2, "num_attention_heads": 6,
                     "num_key_value_heads": 1},
}


def architecture_config(name: str, tokenizer, tiny: bool = False):
    """The transformers config of architecture `name` over `tokenizer`'s vocabulary and tokens."""
    from transformers import LlamaConfig, Qwen2Config

    kind, sizes = ARCHITECTURES[name]
    sizes = {**sizes, **TINY[name]} if tiny else sizes
    return {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind](
        vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sizes)


def build_random(name: str, tokenizer_dir: Path, out: Path, tiny: bool = False, seed: int = 0) -> Path:
    """A model directory: architecture `name` with random weights (fp32) and the tokenizer (and chat
    template) of `tokenizer_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(architecture_config(name, tokenizer, tiny), dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
