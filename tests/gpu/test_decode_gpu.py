"""On CUDA: the graph-captured static-cache decode (transformers_engine.py), its step plain and
compiled by inductor, against the eager loop it replaced, before and after a weight update and as
the batch narrows; and a chunked-logprob trainer step against the
whole-logits one. One GPU; only torch, transformers, pytest (make test-gpu)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.memory import InMemoryBuffer
from workers.rft.models import build_tiny_model, load_policy, load_tokenizer
from workers.rft.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
# The CPU tests' reference loop and helpers, by path (tests/ is no package).
_spec = importlib.util.spec_from_file_location(
    "static_decode", Path(__file__).parents[1] / "workers" / "rft" / "test_static_decode.py")
static_decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(static_decode)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def assert_compiled(engine):
    from workers.rft.engines import transformers_engine

    assert engine.compiled and transformers_engine._compile_failure is None


@pytest.mark.parametrize(("temperature", "compiled"), [(0.0, False), (1.0, False), (1.0, True)])
def test_graph_decode_equals_the_eager_loop_across_a_weight_update(tiny_path, temperature, compiled):
    tokenizer = load_tokenizer(tiny_path)
    model = load_policy(tiny_path, CUDA)
    engine = TransformersEngine(model, tokenizer, compiled=compiled)
    prompts = static_decode.mixed_prompts(tokenizer)
    params = SamplingParams(n=4, temperature=temperature, max_new_tokens=40, seed=3)
    static_decode.assert_same(engine, model, prompts, params, tolerance=1e-4)
    [decoder] = engine._decoders.values()
    assert decoder.graph is not None
    scaled = {name: 1.3 * p for name, p in model.state_dict().items()}
    engine.load_state_dict(scaled, version=1)  # in place: the same graph replays the new weights
    got = static_decode.assert_same(engine, model, prompts, params, tolerance=1e-4)
    assert list(engine._decoders.values()) == [decoder]
    assert len(got) == 12
    if compiled:
        assert_compiled(engine)


@pytest.mark.parametrize("compiled", [False, True])
def test_narrowed_graphs_sample_what_the_whole_batch_would_twice_over(tiny_path, compiled):
    """Rows ending at varied steps (a bias on the end-of-text logit): the batch narrows to the
    running rows (power-of-two row counts, a graph each, captured mid-batch and kept), and the
    tokens are the eager loop's; a second batch reuses the narrowed graphs."""
    tokenizer = load_tokenizer(tiny_path)
    stop = tokenizer.eos_token_id
    model = static_decode.ends_early(load_policy(tiny_path, CUDA), stop, 4.0)
    engine = TransformersEngine(model, tokenizer, compiled=compiled)
    prompts = static_decode.mixed_prompts(tokenizer)
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=96, seed=3)
    for _ in range(2):
        static_decode.assert_same(engine, model, prompts, params, tolerance=1e-4)
    [decoder] = engine._decoders.values()
    assert decoder._narrowed and all(view.graph is not None for view in decoder._narrowed.values())
    assert all(rows & (rows - 1) == 0 for rows in decoder._narrowed)
    if compiled:
        assert_compiled(engine)


def test_captured_decoders_are_capped(tiny_path):
    from workers.rft.engines.transformers_engine import MAX_DECODERS

    tokenizer = load_tokenizer(tiny_path)
    engine = TransformersEngine(load_policy(tiny_path, CUDA), tokenizer, compiled=False)  # a compile a shape
    prompts = static_decode.mixed_prompts(tokenizer)
    for n in range(1, MAX_DECODERS + 3):  # a row count each: a decoder each
        engine.generate(prompts, SamplingParams(n=n, max_new_tokens=4, seed=0))
    assert [key[0] for key in engine._decoders] == [3 * n for n in range(3, MAX_DECODERS + 3)]


def test_a_decoder_past_the_cache_budget_is_kept_alone(tiny_path, monkeypatch):
    from workers.rft.engines import transformers_engine

    monkeypatch.setattr(transformers_engine, "KEPT_CACHE_SHARE", 1e-9)  # any cache is past it
    tokenizer = load_tokenizer(tiny_path)
    engine = TransformersEngine(load_policy(tiny_path, CUDA), tokenizer, compiled=False)
    prompts = static_decode.mixed_prompts(tokenizer)
    for n in (1, 2, 3):
        engine.generate(prompts, SamplingParams(n=n, max_new_tokens=4, seed=0))
        assert [key[0] for key in engine._decoders] == [3 * n]


def test_before_a_trainer_step_a_cache_past_the_budget_is_given_back(tiny_path, monkeypatch):
    """A loop at offset 0 frees the engine's idle caches before each trainer step: a cache past
    KEPT_CACHE_SHARE (SmolLM2-1.7B's 27 GB at 128 rows of 1,088 tokens) goes, one within it stays,
    and the next generate captures again and samples the same. (A new decoder of a shape compiled
    before compiles nothing again: tests/workers/rft/test_compiled_decode.py, on CPU.)"""
    from workers.rft.engines import transformers_engine

    tokenizer = load_tokenizer(tiny_path)
    engine = TransformersEngine(load_policy(tiny_path, CUDA), tokenizer, compiled=False)
    prompts, params = static_decode.mixed_prompts(tokenizer), SamplingParams(n=2, max_new_tokens=4, seed=0)

    def tokens():
        return [c.token_ids for group in engine.generate(prompts, params) for c in group]

    first = tokens()
    engine.free_idle_caches()
    assert len(engine._decoders) == 1  # the tiny model's cache is far within a tenth of the card
    monkeypatch.setattr(transformers_engine, "KEPT_CACHE_SHARE", 1e-9)  # any cache is past it
    engine.free_idle_caches()
    assert not engine._decoders
    allocated = torch.cuda.memory_allocated()
    assert tokens() == first and len(engine._decoders) == 1
    engine.free_idle_caches()
    assert not engine._decoders
    assert abs(torch.cuda.memory_allocated() - allocated) < 2**20  # what the decoder held went with it


def test_a_chunked_trainer_step_equals_the_whole_logits_step(tiny_path):
    from workers.rft.config import RunConfig

    tokenizer = load_tokenizer(tiny_path)
    rollouts = [e for i in range(4) for e in static_decode_rollouts(tokenizer, i)]
    results = []
    for chunked in (False, True):
        config = RunConfig.from_dict({
            "model": {"path": str(tiny_path), "dtype": "float32", "device": "cuda"},
            "algorithm": {"name": "grpo", "repeat_times": 2},
            "trainer": {"lr": 1e-3, "batch_size": 8, "micro_batch_size": 8},
        })
        buffer = InMemoryBuffer()
        buffer.write(rollouts)
        torch.manual_seed(0)
        trainer = Trainer(config, load_policy(tiny_path, CUDA), tokenizer, buffer)
        trainer.chunked = chunked
        results.append((trainer.train_step(), [p.grad for p in trainer.policy.parameters()]))
    (whole, grads_whole), (chunk, grads_chunk) = results
    for key in ("loss", "entropy", "grad_norm"):
        assert chunk[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
    for a, b in zip(grads_whole, grads_chunk):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def static_decode_rollouts(tokenizer, i):
    """A group of two: the right sum (advantage +1) and a wrong one (-1)."""
    from workers.rft.experience import Experience

    a, b = i, 2 * i + 1
    prompt = tokenizer(f"What is {a} + {b}?")["input_ids"]
    out = []
    for index, (answer, advantage) in enumerate([(a + b, 1.0), (a + b + 11, -1.0)]):
        response = tokenizer(str(answer))["input_ids"] + [tokenizer.eos_token_id]
        out.append(Experience(
            task_id=i, group_id=str(i), rollout_index=index, prompt_ids=prompt, response_ids=response,
            action_mask=[1] * len(response), source="rollout", reward=advantage, advantage=advantage,
            explorer_step=0, model_version=0,
        ))
    return out
