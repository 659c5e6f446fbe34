"""The decode step compiled by inductor (transformers_engine.compiled_step; issue #43: at 135M a
captured step is bound by its ~1,650 kernels' launches): on CPU it samples the very tokens of the
step it compiles, on the benchmark architectures and as the batch narrows; a step that cannot
compile runs uncompiled, says why once, and no decoder tries again. tests/gpu/test_decode_gpu.py
captures the compiled step in a CUDA graph."""
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.rft.architectures import build_random
from workers.rft.engines import SamplingParams, TransformersEngine, transformers_engine
from workers.rft.engines.transformers_engine import COMPILE_SETTING, compile_by_default

from .test_static_decode import ends_early, mixed_prompts


def generate(path, tokenizer, params, compiled: bool):
    """Rows end at varied steps (a biased stop logit), so the batch narrows as they stop."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = TransformersEngine(ends_early(model, tokenizer.eos_token_id, 4.0), tokenizer, compiled=compiled)
    return [(c.token_ids, c.logprobs) for group in engine.generate(mixed_prompts(tokenizer), params) for c in group]


def assert_same_samples(got, expected):
    """The same tokens; log-probs within 1e-5 (inductor's fused kernels sum in their own order)."""
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # each architecture compiles its step: ~25 s on 2 cores
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-1.5b"])
def test_the_compiled_step_samples_what_the_step_it_compiles_does(name, tiny_path, tokenizer, tmp_path, monkeypatch):
    path = build_random(name, tiny_path, tmp_path / name, tiny=True)
    params = SamplingParams(n=8, temperature=0.7, top_p=0.9, max_new_tokens=40, seed=3)
    plain = generate(path, tokenizer, params, compiled=False)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    narrowed = []
    monkeypatch.setattr(transformers_engine.StaticDecoder, "narrow", lambda self, running, rows, narrow=(
        transformers_engine.StaticDecoder.narrow): narrowed.append(rows) or narrow(self, running, rows))
    compiled = generate(path, tokenizer, params, compiled=True)
    assert transformers_engine._compile_failure is None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames  # inductor ran the step
    assert narrowed, "rows stopped at varied steps and the batch narrowed"
    assert_same_samples(compiled, plain)
    # New decoders (of a new engine here) of the shapes compiled before compile nothing again: a
    # loop at offset 0 whose engine gives its big cache back before each trainer step makes a new
    # one every explorer step, and dynamo allows 8 compiles a process (recompile_limit).
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert_same_samples(generate(path, tokenizer, params, compiled=True), plain)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames


@pytest.mark.slow  # dynamo traces the step before inductor fails: ~5 s
def test_a_step_that_cannot_compile_runs_uncompiled_and_says_why_once(tiny_path, tokenizer, monkeypatch, caplog):
    """A real failure, not a mock: inductor is pointed at a C++ compiler that does not exist."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()  # nothing compiled before may serve this step
    monkeypatch.setattr(inductor, "fx_graph_cache", False)
    monkeypatch.setattr(inductor.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(transformers_engine, "_compile_failure", None)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=1)
    plain = generate(tiny_path, tokenizer, params, compiled=False)
    with caplog.at_level(logging.WARNING, logger=transformers_engine.__name__):
        got = generate(tiny_path, tokenizer, params, compiled=True)
        again = generate(tiny_path, tokenizer, params, compiled=True)
    torch._dynamo.reset()
    assert got == plain and again == plain
    warnings = [r.getMessage() for r in caplog.records if "runs uncompiled" in r.getMessage()]
    assert len(warnings) == 1 and transformers_engine._compile_failure, warnings  # said once; no second try


def test_the_setting_picks_where_the_step_compiles(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(COMPILE_SETTING, raising=False)
    assert (compile_by_default(cpu), compile_by_default(cuda)) == (False, True)
    monkeypatch.setenv(COMPILE_SETTING, "1")
    assert (compile_by_default(cpu), compile_by_default(cuda)) == (True, True)
    monkeypatch.setenv(COMPILE_SETTING, "0")
    assert (compile_by_default(cpu), compile_by_default(cuda)) == (False, False)
    monkeypatch.setenv(COMPILE_SETTING, "yes")
    with pytest.raises(ValueError, match="RFTWEB_COMPILE_DECODE must be auto, 1 or 0, got 'yes'"):
        compile_by_default(cpu)


@pytest.mark.slow  # one compile: ~25 s on 2 cores
def test_a_shape_past_the_recompile_limit_runs_uncompiled_and_the_others_stay_compiled(
        tiny_path, tokenizer, monkeypatch, caplog):
    """fullgraph=True turns dynamo's recompile limit into an error (FailOnRecompileLimitHit, not a
    TorchDynamoException): that decoder runs as it is; compiling goes on for the rest."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    monkeypatch.setattr(transformers_engine, "_compile_failure", None)
    first, second = (SamplingParams(n=n, temperature=1.0, max_new_tokens=6, seed=1) for n in (2, 3))
    plain = [generate(tiny_path, tokenizer, params, compiled=False) for params in (first, second)]
    with caplog.at_level(logging.WARNING, logger=transformers_engine.__name__):
        got = [generate(tiny_path, tokenizer, params, compiled=True) for params in (first, second)]
    torch._dynamo.reset()
    for samples, expected in zip(got, plain):
        assert_same_samples(samples, expected)
    assert got[1] == plain[1]  # the second shape ran uncompiled: exactly the plain step
    warnings = [r.getMessage() for r in caplog.records if "runs uncompiled" in r.getMessage()]
    assert len(warnings) == 1 and "recompile_limit allows (1)" in warnings[0], warnings
    assert transformers_engine._compile_failure is None  # not given up: the first shape stays compiled
