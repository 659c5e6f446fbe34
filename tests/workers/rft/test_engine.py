import pytest
import torch

from workers.rft import engines
from workers.rft.engines import SamplingParams, TransformersEngine, build_engine
from workers.rft.engines.transformers_engine import draw, sample_token


@pytest.fixture
def engine(tiny_model, tokenizer):
    return TransformersEngine(tiny_model, tokenizer)


def prompts(tokenizer):
    texts = ["What is 1 + 2?", "Using the numbers [3, 5, 7], create an equation that equals 15."]
    return [tokenizer(t)["input_ids"] for t in texts]  # different lengths: the first is left-padded


def test_generates_n_completions_per_prompt_with_consistent_fields(engine, tokenizer):
    out = engine.generate(prompts(tokenizer), SamplingParams(n=3, max_new_tokens=6, seed=0))
    assert [len(group) for group in out] == [3, 3]
    for completion in (c for group in out for c in group):
        assert 1 <= len(completion.token_ids) <= 6
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(lp <= 0 for lp in completion.logprobs)
        stopped = completion.token_ids[-1] == tokenizer.eos_token_id
        assert completion.finish_reason == ("stop" if stopped else "length")
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_full_forward_pass(engine, tiny_model, tokenizer, temperature):
    # Generation logprobs serve as logπ_old: they must be what the trainer would compute,
    # for left-padded rows too.
    batch = prompts(tokenizer)
    out = engine.generate(batch, SamplingParams(n=2, temperature=temperature, max_new_tokens=8, seed=1))
    for prompt, group in zip(batch, out):
        for completion in group:
            ids = torch.tensor([prompt + completion.token_ids])
            with torch.no_grad():
                logits = tiny_model(ids).logits[0, len(prompt) - 1 : -1] / temperature
            expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_seed_makes_sampling_reproducible(engine, tokenizer):
    params = SamplingParams(n=4, max_new_tokens=6, seed=7)
    first = engine.generate(prompts(tokenizer), params)
    again = engine.generate(prompts(tokenizer), params)
    other = engine.generate(prompts(tokenizer), SamplingParams(n=4, max_new_tokens=6, seed=8))
    ids = lambda out: [c.token_ids for group in out for c in group]  # noqa: E731
    assert ids(first) == ids(again) != ids(other)


def test_greedy_ignores_the_seed_and_matches_argmax(engine, tiny_model, tokenizer):
    [prompt] = prompts(tokenizer)[:1]
    [[a]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=5, seed=1))
    [[b]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=5, seed=2))
    assert a.token_ids == b.token_ids
    with torch.no_grad():
        first = tiny_model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert a.token_ids[0] == first


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[5.0, 4.0, -5.0, -6.0]])
    uniforms = torch.rand((50, 1), generator=torch.Generator().manual_seed(0))
    drawn = {sample_token(logits, 1.0, 0.5, u)[0].item() for u in uniforms}
    assert drawn == {0}  # token 0 alone holds > 50% of the mass
    token, logprob = sample_token(logits, 1.0, 0.5, uniforms[0])
    assert logprob.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())


def test_draw_follows_the_probabilities():
    """Frequencies over 40,000 draws match the distribution (5 sigma); zero-probability tokens,
    first and last included, never come up; rows need not be normalised."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 2.0, 0.0, 0.0, 2.0]])
    uniforms = torch.rand((40_000, 2), generator=torch.Generator().manual_seed(0))
    draws = torch.stack([draw(probs, u) for u in uniforms])
    for row, expected in enumerate(probs / probs.sum(-1, keepdim=True)):
        frequency = torch.bincount(draws[:, row], minlength=6).float() / len(draws)
        sigma = (expected * (1 - expected) / len(draws)).sqrt()
        assert ((frequency - expected).abs() <= 5 * sigma + 1e-9).all(), (row, frequency, expected)


def test_stop_token_ends_a_row_and_the_rest_keep_going(engine, tiny_model, tokenizer):
    # Make eos the likeliest next token everywhere: every row stops after one token.
    with torch.no_grad():
        tiny_model.lm_head.weight[tokenizer.eos_token_id] += 50 * tiny_model.model.norm.weight.sign()
    out = engine.generate(prompts(tokenizer), SamplingParams(n=2, temperature=0, max_new_tokens=6))
    assert all(
        c.token_ids == [tokenizer.eos_token_id] and c.finish_reason == "stop" and c.text == "" for g in out for c in g
    )


def test_new_weights_change_outputs_and_version(engine, tiny_path, tokenizer, tmp_path):
    from workers.rft.models import load_policy

    params = SamplingParams(n=2, max_new_tokens=6, seed=3)
    before = engine.generate(prompts(tokenizer), params)
    other = load_policy(tiny_path, torch.device("cpu"))
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    engine.load_state_dict(other.state_dict(), version=4)
    assert engine.model_version == 4
    after = engine.generate(prompts(tokenizer), params)
    assert [c.logprobs for g in before for c in g] != [c.logprobs for g in after for c in g]
    other.save_pretrained(tmp_path)
    engine.load_checkpoint(tmp_path, version=5)
    assert engine.model_version == 5
    again = engine.generate(prompts(tokenizer), params)
    assert [c.logprobs for g in again for c in g] == [c.logprobs for g in after for c in g]


def test_engine_choice(tiny_model, tokenizer):
    # On CPU `auto` takes the transformers engine; tests/workers/rft/test_vllm.py has the rest.
    engine = build_engine("auto", tiny_model, tokenizer)
    assert isinstance(engine, TransformersEngine) and engine.selection.startswith("transformers (auto on CPU")
    assert isinstance(build_engine("transformers", tiny_model, tokenizer), TransformersEngine)
    with pytest.raises(ValueError, match="unknown rollout engine"):
        build_engine("tensorrt", tiny_model, tokenizer)


def test_vllm_asked_for_but_not_installed_says_so(tiny_model, tokenizer, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match="vllm is not installed"):
        build_engine("vllm", tiny_model, tokenizer)
    assert engines.choose_engine("auto", tiny_model.name_or_path, "cuda") == (  # on a GPU auto would take vLLM
        "transformers", "auto: vllm is not installed (requirements-vllm.txt)"
    )
