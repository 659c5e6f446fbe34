"""The benchmark architectures (workers/rft/architectures.py) at a tiny width: the engine's
decode equals HF generate greedily, and the eager loop's tokens and log-probs when sampling, on
each of them: grouped-query (SmolLM2-135M), full multi-head (SmolLM2-1.7B) and Qwen2.5-1.5B's
(6:1 heads at this width, biases on q/k/v, rope theta 1e6). Issue #43: what the GPU bench runs
at full size."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.rft.architectures import ARCHITECTURES, build_random
from workers.rft.engines import SamplingParams, TransformersEngine

from .test_static_decode import eager_loop, mixed_prompts


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def architecture(request, tiny_path, tmp_path_factory):
    name = request.param
    return name, build_random(name, tiny_path, tmp_path_factory.mktemp(name), tiny=True)


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def test_the_tiny_width_keeps_the_architecture(architecture):
    name, path = architecture
    config = load(path).config
    kind, sizes = ARCHITECTURES[name]
    assert config.model_type == kind and config.tie_word_embeddings
    assert config.rope_parameters["rope_theta"] == sizes["rope_theta"]
    full_ratio = sizes["num_attention_heads"] // sizes["num_key_value_heads"]
    assert config.num_attention_heads // config.num_key_value_heads in (full_ratio, 6)  # qwen's 6:1 at this width


def test_greedy_decode_is_hf_generate(architecture, tokenizer):
    _, path = architecture
    engine = TransformersEngine(load(path), tokenizer)
    prompts = mixed_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    got = [c.token_ids for group in engine.generate(prompts, params) for c in group]
    reference = load(path)
    for i, prompt in enumerate(prompts):
        out = reference.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=12, eos_token_id=engine.stop_ids,
                                 pad_token_id=engine.pad_id)
        expected = out[0, len(prompt):].tolist()
        end = next((k + 1 for k, t in enumerate(expected) if t in engine.stop_ids), len(expected))
        assert got[2 * i] == got[2 * i + 1] == expected[:end], i


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tokens_and_logprobs_are_the_eager_loops(architecture, tokenizer, temperature):
    _, path = architecture
    engine = TransformersEngine(load(path), tokenizer)
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=10, seed=4)
    got = [(c.token_ids, c.logprobs) for group in engine.generate(mixed_prompts(tokenizer), params) for c in group]
    expected = eager_loop(load(path), mixed_prompts(tokenizer), params, engine.pad_id, engine.stop_ids)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=1e-5, rtol=1e-5)
