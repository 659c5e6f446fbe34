"""The transformers engine alone on gpu_step's shape (issues #25, #43): generated tokens/s of
`engine.generate` with the decode step captured (CUDA) for each attention the engine could decode
with, its step plain and compiled by inductor (the engine's default on CUDA), the decode step's
distance to the card's memory bandwidth, and where an uncaptured step's device time goes and in how
many kernels (the same kernels the graph replays), plain and compiled:

    python -m bench decode [--model M] [--tasks N --samples N --tokens N] [--attentions ...] [--reps N]
                           [--compile both|on|off] [--varied] [--quick]

--varied adds answers that end at varied lengths, decoded over every row every step and over the
rows still running only (the engine narrows the batch as rows stop): the same tokens both ways.

A real architecture with random weights in bf16 (gpu_step's models, SmolLM2's tokenizer from
.smollm2/: `gpu_step --prepare`), 16 chat prompts x 8 samples x 1,024 new tokens by default,
temperature 1, seed 0. On CPU it runs the same code in fp32 on the quick shape: a smoke run, not a
figure to report.

The bandwidth figure: a decode step must read every weight and, for each row, the key/value cache
of the tokens before it (prompt and generated so far). Those bytes over the measured time a step
(generation time / new tokens, the prefill included) are what the step reads a second, printed as
a share of what a device-to-device copy of 1 GiB moves a second (read and write) in the same call:
at 1.5-1.7B a step should be bound by that bandwidth, and the share says how close it gets.
"""
import statistics
import time

from bench.common import quiet_hf, table
from bench.gpu_step import case_of, random_model

ATTENTIONS = ("gqa_eager", "sdpa")
COMPILES = {"both": (False, True), "on": (True,), "off": (False,)}
STEP = {False: "plain", True: "compiled"}  # the step's name in the tables, by `compiled`
PROFILED_STEPS = 16


def decode(args) -> dict:
    import torch

    from workers.rft.engines import SamplingParams, TransformersEngine
    from workers.rft.footprint import ModelShape
    from workers.rft.models import load_policy, load_tokenizer, pick_device, pick_dtype

    quiet_hf()
    device = pick_device("auto")
    if device.type == "cpu":
        args.quick = True
    case, reps = case_of(args), args.reps or 3
    path = random_model(args.model)
    tokenizer = load_tokenizer(path)
    model = load_policy(path, device, pick_dtype(device, "auto"))
    shape = ModelShape.from_config(model.config.to_dict())
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

    # What a decode step must read: the weights (the tied head once) and each row's cache of the
    # prompt and of half the new tokens on average.
    dtype_bytes = next(model.parameters()).element_size()
    weight_bytes = shape.params * dtype_bytes
    prompt = statistics.mean(len(p) for p in prompts)
    rows_n = case["tasks"] * case["samples"]
    step_bytes = weight_bytes + rows_n * shape.kv_bytes(dtype_bytes) * (prompt + case["tokens"] / 2)
    copy_bytes_per_s = copy_bandwidth(device)
    rows, results = [], {}
    compiles = COMPILES[args.compile]
    for attention in args.attentions or ATTENTIONS:
        model.set_attn_implementation(attention)
        for compiled in compiles:
            engine.compiled = compiled
            engine._decoders.clear()
            first_s, _ = timed_generate()  # compiles the step (once a process and shape) and captures it
            runs = [timed_generate() for _ in range(reps)]
            seconds = statistics.median(s for s, _ in runs)
            tokens = runs[0][1]
            step_s = seconds / case["tokens"]
            share = step_bytes / step_s / copy_bytes_per_s
            step = STEP[compiled]
            results[f"{attention}, {step}"] = {
                "first_s": first_s, "s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                "ms_per_step": 1000 * step_s, "bandwidth_share": share}
            rows.append([attention, step, first_s, seconds, tokens, tokens / seconds, 1000 * step_s,
                         f"{100 * share:.0f} %"])
    print(f"{device} {next(model.parameters()).dtype}, {args.model}, {case['tasks']} prompts x {case['samples']} x "
          f"{case['tokens']} tokens, median of {reps}; a step must read {step_bytes / 1e6:,.0f} MB "
          f"(weights {weight_bytes / 1e6:,.0f} MB, KV cache {(step_bytes - weight_bytes) / 1e6:,.0f} MB on average); "
          f"a device copy moves {copy_bytes_per_s / 1e9:,.0f} GB/s")
    print(table(rows, ["attention", "step", "first s (compile, capture)", "s", "tokens", "tokens/s", "ms/step",
                       "of bandwidth"]))
    results.update(model=args.model, case=case, step_bytes=step_bytes, copy_gb_per_s=copy_bytes_per_s / 1e9)
    model.set_attn_implementation(ATTENTIONS[0])
    if args.varied:
        results["varied"] = varied_lengths(engine, timed_generate, tokenizer, case, reps)
    if device.type == "cuda":
        for compiled in compiles:
            results[f"profile, {STEP[compiled]}"] = profile_steps(engine, prompts, params, compiled)
    return results


def varied_lengths(engine, timed_generate, tokenizer, case: dict, reps: int) -> dict:
    """Answers that end at varied lengths, with and without narrowing the batch to the rows still
    running (transformers_engine.COMPACT_BELOW). Fair by construction: the same model, prompts,
    seed and uniforms on both sides, and a bias on the end-of-text logit (a forward hook on the
    output head) that makes random weights stop at a rate of ~4 / max_new_tokens a step; narrowing
    keeps each row's uniforms, so both sides sample the very same tokens (checked)."""
    import math

    from workers.rft.engines import transformers_engine

    vocab = engine.model.get_output_embeddings().weight.shape[0]
    bias = math.log(4 * vocab / case["tokens"])
    stop = tokenizer.eos_token_id

    def add(module, inputs, output):
        output[..., stop] += bias
        return output

    hook = engine.model.get_output_embeddings().register_forward_hook(add)
    plain, rows, out = transformers_engine.COMPACT_BELOW, [], {}
    try:
        for name, below in (("every row every step", 0.0), ("running rows only", plain)):
            transformers_engine.COMPACT_BELOW = below
            engine._decoders.clear()
            first_s, tokens = timed_generate()
            runs = [timed_generate() for _ in range(reps)]
            seconds = statistics.median(s for s, _ in runs)
            assert all(t == tokens for _, t in runs), "the same tokens every call"
            out[name] = {"s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
            rows.append([name, first_s, seconds, tokens, tokens / seconds])
    finally:
        transformers_engine.COMPACT_BELOW = plain
        hook.remove()
    assert len({o["tokens"] for o in out.values()}) == 1, "both sides generated as many tokens"
    print(f"\nanswers of varied length (end-of-text bias {bias:.2f}: a mean of ~{case['tokens'] // 4} tokens, "
          f"up to {case['tokens']}):")
    print(table(rows, ["decode steps over", "first s", "s", "tokens", "tokens/s"]))
    return out


def copy_bandwidth(device, gib: float = 1.0, reps: int = 10) -> float:
    """Bytes a second a device-to-device copy moves (each byte read once and written once)."""
    import torch

    source = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(reps):
        target.copy_(source)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * source.numel() * reps / (time.perf_counter() - started)


def profile_steps(engine, prompts, params, compiled: bool) -> dict:
    """A few uncaptured steps under the profiler: each kernel's device time a step, and how many."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workers.rft.engines import SamplingParams, transformers_engine

    short = SamplingParams(n=params.n, temperature=params.temperature, max_new_tokens=PROFILED_STEPS, seed=0)
    eager = transformers_engine.StaticDecoder
    original = engine._decoder
    engine._decoder = lambda rows, length, temperature, top_p: eager(
        engine.model, rows, length, (temperature, top_p), engine.stop_ids, engine.pad_id, graph=False,
        compiled=compiled)
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
    print(f"\n{STEP[compiled]}, uncaptured: {per_step_us / 1000:.2f} ms of device time a step (prefill included), "
          f"~{kernels:.0f} kernels a step")
    print(table([[e.key[:70], e.self_device_time_total / PROFILED_STEPS, e.count / PROFILED_STEPS]
                 for e in events[:15]], ["kernel", "us a step", "calls a step"]))
    return {"device_ms_per_step": per_step_us / 1000, "kernels_per_step": kernels,
            "top": [[e.key, e.self_device_time_total / PROFILED_STEPS, e.count / PROFILED_STEPS] for e in events[:15]]}
