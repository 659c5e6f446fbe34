"""The transformers engine alone on gpu_step's shape (issue #25): generated tokens/s of
`engine.generate` with the decode step captured (CUDA) for each attention the engine could decode
with, and where an eager step's device time goes (the same kernels the graph replays):

    python -m bench decode [--quick]

SmolLM2-135M's architecture with random weights in bf16 (built from .smollm2/, `gpu_step
--prepare`), 16 chat prompts x 8 samples x 256 new tokens, temperature 1, seed 0. On CPU it runs
the same code in fp32 on the quick shape: a smoke run, not a figure to report.
"""
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import quiet_hf, table
from bench.gpu_step import CASE, QUICK, random_smollm2

ATTENTIONS = ("gqa_eager", "sdpa")
PROFILED_STEPS = 16


def decode(quick: bool = False, reps: int = 3) -> dict:
    import torch

    from workers.rft.engines import SamplingParams, TransformersEngine
    from workers.rft.models import load_policy, load_tokenizer, pick_device, pick_dtype

    quiet_hf()
    device = pick_device("auto")
    case = QUICK if quick or device.type == "cpu" else CASE
    with tempfile.TemporaryDirectory() as tmp:
        path = random_smollm2(Path(tmp) / "smollm2-random")
        tokenizer = load_tokenizer(path)
        model = load_policy(path, device, pick_dtype(device, "auto"))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i + 1}?"}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
               for i in range(case["tasks"])]
    params = SamplingParams(n=case["samples"], temperature=1.0, max_new_tokens=case["tokens"], seed=0)
    engine = TransformersEngine(model, tokenizer)

    def timed_generate():
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = engine.generate(prompts, params)
        tokens = sum(len(c.token_ids) for group in out for c in group)
        return time.perf_counter() - started, tokens

    rows, results = [], {}
    for attention in ATTENTIONS:
        model.set_attn_implementation(attention)
        engine._decoders.clear()
        first_s, _ = timed_generate()  # captures the graph
        runs = [timed_generate() for _ in range(reps)]
        seconds = statistics.median(s for s, _ in runs)
        tokens = runs[0][1]
        results[attention] = {"first_s": first_s, "s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                              "ms_per_step": 1000 * seconds / case["tokens"]}
        rows.append([attention, first_s, seconds, tokens, tokens / seconds, 1000 * seconds / case["tokens"]])
    print(f"{device} {next(model.parameters()).dtype}, {case['tasks']} prompts x {case['samples']} x "
          f"{case['tokens']} tokens, median of {reps}")
    print(table(rows, ["attention", "first s (capture)", "s", "tokens", "tokens/s", "ms/step"]))
    model.set_attn_implementation(ATTENTIONS[0])
    if device.type == "cuda":
        results["profile"] = profile_eager_steps(engine, prompts, params)
    return results


def profile_eager_steps(engine, prompts, params) -> dict:
    """A few eager steps under the profiler: each kernel's device time a step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workers.rft.engines import SamplingParams, transformers_engine

    short = SamplingParams(n=params.n, temperature=params.temperature, max_new_tokens=PROFILED_STEPS, seed=0)
    eager = transformers_engine.StaticDecoder
    original = engine._decoder
    engine._decoder = lambda rows, length, temperature, top_p: eager(
        engine.model, rows, length, (temperature, top_p), engine.stop_ids, engine.pad_id, graph=False)
    try:
        engine.generate(prompts, short)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate(prompts, short)
            torch.cuda.synchronize()
    finally:
        engine._decoder = original
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    per_step_us = sum(e.self_device_time_total for e in events) / PROFILED_STEPS
    kernels = sum(e.count for e in events) / PROFILED_STEPS
    print(f"\neager: {per_step_us / 1000:.2f} ms of device time a step (prefill included), "
          f"~{kernels:.0f} kernels a step")
    print(table([[e.key[:70], e.self_device_time_total / PROFILED_STEPS, e.count / PROFILED_STEPS]
                 for e in events[:15]], ["kernel", "us a step", "calls a step"]))
    return {"device_ms_per_step": per_step_us / 1000, "kernels_per_step": kernels,
            "top": [[e.key, e.self_device_time_total / PROFILED_STEPS, e.count / PROFILED_STEPS] for e in events[:15]]}
