"""The static-cache decode loop (transformers_engine.py) against the eager loop it replaced: a
growing dynamic cache and a 2D mask, one forward per token, kept here as the reference."""
import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.engines.transformers_engine import LENGTH_BUCKET, sample_token


@torch.no_grad()
def eager_loop(model, prompts, params, pad_id, stop_ids):
    """The engine's loop before the static cache (git 90c6fd9), tokens and logprobs per row up to
    and including the first stop token, with the engine's random numbers (one uniform per step and
    row, drawn up front). tests/gpu/test_decode_gpu.py runs it on CUDA too."""
    n, device = params.n, next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    uniforms = torch.rand((params.max_new_tokens, len(prompts) * n), generator=generator, device=device)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1)
    cache, next_logits = out.past_key_values, out.logits[:, -1].float().repeat_interleave(n, dim=0)
    cache.batch_repeat_interleave(n)
    attention_mask = attention_mask.repeat_interleave(n, dim=0)
    positions = position_ids[:, -1].repeat_interleave(n, dim=0)
    finished = torch.zeros(len(prompts) * n, dtype=torch.bool, device=device)
    tokens, logprobs = [], []
    for step in range(params.max_new_tokens):
        token, logprob = sample_token(next_logits, params.temperature, params.top_p, uniforms[step])
        token = torch.where(finished, pad_id, token)
        tokens.append(token)
        logprobs.append(logprob)
        alive = ~finished
        finished |= alive & torch.isin(token, torch.tensor(stop_ids, device=device))
        if finished.all():
            break
        attention_mask = torch.cat([attention_mask, alive.long()[:, None]], dim=1)
        positions = positions + 1
        out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=positions[:, None],
                    past_key_values=cache, use_cache=True)
        cache, next_logits = out.past_key_values, out.logits[:, -1].float()
    rows = []
    for ids, lps in zip(torch.stack(tokens, 1).tolist(), torch.stack(logprobs, 1).tolist()):
        end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), len(ids))
        rows.append((ids[:end], lps[:end]))
    return rows


def mixed_prompts(tokenizer):
    texts = ["1+2?", "What is 11 + 22?", "Using the numbers [3, 5, 7], create an equation that equals 15."]
    return [tokenizer(t)["input_ids"] for t in texts]


def assert_same(engine, model, prompts, params, tolerance=1e-5):
    got = [(c.token_ids, c.logprobs) for group in engine.generate(prompts, params) for c in group]
    expected = eager_loop(model, prompts, params, engine.pad_id, engine.stop_ids)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=tolerance, rtol=tolerance)
    return got


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_static_cache_equals_the_eager_loop(tiny_model, tokenizer, temperature, top_p):
    engine = TransformersEngine(tiny_model, tokenizer)
    params = SamplingParams(n=3, temperature=temperature, top_p=top_p, max_new_tokens=12, seed=5)
    got = assert_same(engine, tiny_model, mixed_prompts(tokenizer), params)
    assert all(len(ids) == 12 for ids, _ in got)  # random weights: no row stops, the limit holds


def test_stop_tokens_end_rows_at_different_steps(tiny_model, tokenizer):
    # eos made likely, not certain: rows stop at different steps and the rest keep going.
    with torch.no_grad():
        tiny_model.lm_head.weight[tokenizer.eos_token_id] += 1.5 * tiny_model.model.norm.weight.sign()
    engine = TransformersEngine(tiny_model, tokenizer)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=20, seed=0)
    got = assert_same(engine, tiny_model, mixed_prompts(tokenizer), params)
    lengths = {len(ids) for ids, _ in got}
    stopped = [ids for ids, _ in got if ids[-1] == tokenizer.eos_token_id]
    assert len(lengths) > 2 and stopped and len(stopped) < len(got), lengths
    assert all(tokenizer.eos_token_id not in ids[:-1] for ids, _ in got)


def test_max_length_fills_the_cache_to_its_last_slot(tiny_model, tokenizer):
    # On CPU the cache holds exactly prompt + new tokens (on CUDA it rounds up to LENGTH_BUCKET):
    # a long run fills it and stops at the limit.
    engine = TransformersEngine(tiny_model, tokenizer)
    prompts = mixed_prompts(tokenizer)
    steps = LENGTH_BUCKET + 5 - max(len(p) for p in prompts)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=steps, seed=2)
    got = assert_same(engine, tiny_model, prompts, params)
    assert [len(ids) for ids, _ in got] == [steps] * 3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_decodes_as_sdpa_does_with_grouped_query_attention(tiny_path, tokenizer, temperature):
    """The engine moves its model to gqa_eager (on CUDA SDPA under a padding mask copies K/V out to
    every query head); the tokens and logprobs are those of the same weights under SDPA."""
    from transformers import AutoModelForCausalLM

    from workers.rft.attention import NAME

    def sdpa_model():
        return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa")

    model = sdpa_model()
    engine = TransformersEngine(model, tokenizer)
    assert model.config._attn_implementation == NAME
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=10, seed=4)
    got = [(c.token_ids, c.logprobs) for group in engine.generate(mixed_prompts(tokenizer), params) for c in group]
    reference = sdpa_model()
    assert reference.config._attn_implementation == "sdpa"
    expected = eager_loop(reference, mixed_prompts(tokenizer), params, engine.pad_id, engine.stop_ids)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=1e-5, rtol=1e-5)


def ends_early(model, stop_id: int, bias: float):
    """The model with `bias` added to one stop token's logit: sampled rows end at varied steps."""
    def add(module, inputs, output):
        output[..., stop_id] += bias
        return output

    model.get_output_embeddings().register_forward_hook(add)
    return model


def test_rows_that_stopped_stop_costing_and_every_row_samples_what_it_would_have(tiny_path, tokenizer, monkeypatch):
    """Issue #43: once at most half the rows run, the running ones move to the front and the
    steps go on over them only (StaticDecoder.narrow), again and again as rows stop. Each row keeps
    its uniforms: the tokens and log-probs are the eager loop's over the whole batch."""
    from transformers import AutoModelForCausalLM

    from workers.rft.engines import transformers_engine

    def load():
        return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa")

    stop = tokenizer.eos_token_id
    engine = TransformersEngine(ends_early(load(), stop, 4.0), tokenizer)
    narrowed = []
    plain_narrow = transformers_engine.StaticDecoder.narrow
    monkeypatch.setattr(transformers_engine.StaticDecoder, "narrow",
                        lambda self, running, rows: narrowed.append((self.rows, len(running), rows))
                        or plain_narrow(self, running, rows))
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=48, seed=3)
    got = [(c.token_ids, c.logprobs) for group in engine.generate(mixed_prompts(tokenizer), params) for c in group]
    expected = eager_loop(ends_early(load(), stop, 4.0), mixed_prompts(tokenizer), params, engine.pad_id,
                          engine.stop_ids)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=1e-5, rtol=1e-5)
    lengths = sorted(len(ids) for ids, _ in got)
    assert lengths[0] < lengths[len(lengths) // 2] < lengths[-1], lengths  # ended at varied steps
    assert len(narrowed) >= 2 and narrowed[0][0] == 24, narrowed  # from all 24 rows, then narrower
    assert all(running <= rows < before for before, running, rows in narrowed)


def test_a_batch_whose_cache_does_not_fit_is_decoded_in_rounds_that_sample_what_it_would(
        tiny_model, tokenizer, monkeypatch):
    """Issue #43: the static cache is sized against the free memory; a batch too large for it runs
    in rounds of as many prompts as fit, with the whole batch's uniforms, so a seeded batch samples
    the same tokens; one prompt's rows that cannot fit are refused saying what to lower."""
    from workers.rft.engines import transformers_engine

    engine = TransformersEngine(tiny_model, tokenizer)
    prompts = mixed_prompts(tokenizer)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=5)
    whole = [(c.token_ids, c.logprobs) for group in engine.generate(prompts, params) for c in group]
    assert engine._rounds(prompts, params) == [(0, 3)]
    config = tiny_model.config
    head_dim = config.hidden_size // config.num_attention_heads
    row_bytes = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                 * (max(map(len, prompts)) + 12) * 4 + 4 * config.vocab_size)  # fp32 keys and values, logits
    monkeypatch.setattr(transformers_engine, "free_bytes", lambda device: int(3 * row_bytes / 0.8) + 1)
    assert engine._rounds(prompts, params) == [(0, 1), (1, 2), (2, 3)]  # 3 rows (one prompt's) a round
    rounds = [(c.token_ids, c.logprobs) for group in engine.generate(prompts, params) for c in group]
    assert [ids for ids, _ in rounds] == [ids for ids, _ in whole]
    for (_, lps), (_, ref) in zip(rounds, whole):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(transformers_engine, "free_bytes", lambda device: row_bytes)
    with pytest.raises(ValueError, match=r"3 rows of \d+ tokens .* lower explorer.max_new_tokens"):
        engine.generate(prompts, params)


def test_kept_decoders_give_way_to_a_new_one_by_count_and_by_bytes(tiny_model, tokenizer):
    """On CUDA the engine keeps its captured decoders to reuse; a new one first drops the least
    recently used until fewer than MAX_DECODERS remain and their caches with its own fit the
    budget (KEPT_CACHE_SHARE of the card: SmolLM2-1.7B's cache for 128 rows of 1,088 tokens is
    27 GB, which a trainer in the same process needs back). Real decoders, on CPU (no graphs)."""
    from workers.rft.engines.transformers_engine import MAX_DECODERS, StaticDecoder

    engine = TransformersEngine(tiny_model, tokenizer)

    def keep(rows):
        engine._decoders[rows] = StaticDecoder(tiny_model, rows, 64, (1.0, 1.0), engine.stop_ids, engine.pad_id,
                                               graph=False)

    def size(rows):
        return rows * engine._row_bytes(64)

    for rows in (1, 2, 3):
        keep(rows)
    decoder = engine._decoders[3]
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in decoder.cache.layers) + decoder.logits.nbytes
    assert held == size(3)  # what the budget counts is what a decoder holds
    engine._make_room(size(4), budget=size(100))
    assert list(engine._decoders) == [1, 2, 3] and MAX_DECODERS == 4
    keep(4)
    engine._make_room(size(1), budget=size(100))
    assert list(engine._decoders) == [2, 3, 4]  # by count: the least recently used went
    engine._make_room(size(8), budget=size(12))
    assert list(engine._decoders) == [4]  # by bytes: 2 + 3 + 4 + 8 rows, then 3 + 4 + 8, then 4 + 8 fit
    engine._make_room(size(100), budget=size(8))
    assert not engine._decoders  # a new one past the budget alone runs alone
    # Before a trainer step in the same process (free_idle_caches: count=MAX_DECODERS, no new one
    # comes), the ones kept stay while within the budget, the last used included; alone past it, it goes.
    for rows in (1, 2, 3, 4):
        keep(rows)
    engine._make_room(0, budget=size(10), count=MAX_DECODERS)
    assert list(engine._decoders) == [1, 2, 3, 4]
    engine._make_room(0, budget=size(7), count=MAX_DECODERS)
    assert list(engine._decoders) == [3, 4]
    engine._make_room(0, budget=size(3), count=MAX_DECODERS)
    assert not engine._decoders
