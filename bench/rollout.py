"""Rollout throughput in generated tokens/s: rftweb's engines (transformers, vLLM) against plain
HF `model.generate` and vLLM's own offline `LLM.generate` (the vLLM engine's ceiling: the same
settings, nothing of ours around it), on the same prompts (chat-formatted arithmetic), samples and
length.

    python -m bench rollout [--quick]

Every row runs to exactly `tokens` new tokens (eos ignored) at temperature 1, so all engines do the
same work. Each engine runs in its own child process (`python -m bench.rollout child ...`), the
engines alternate, rep after rep; figures are medians over reps of tokens/s of the timed rounds
(after one small warm-up call). The rftweb engines also report their weight-sync times and the
logprob gap to a trainer forward (bench/vllm_rollout.py does their measurement).
"""
import argparse
import sys
import time

from bench.common import child, emit, load, machine, median, peak_rss_mb, quiet_hf, save, table

ENGINES = ("hf_generate", "transformers", "vllm", "vllm_alone")


def bench_hf_generate(path, args) -> dict:
    import torch

    from bench.vllm_rollout import prompts_for
    from workers.rft.models import load_policy, load_tokenizer

    tokenizer = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu")).eval()
    prompts = prompts_for(tokenizer, args.prompts)
    rows = [p for p in prompts for _ in range(args.samples)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1

    def generate(n_rows, tokens, seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            return model.generate(
                input_ids=ids[:n_rows], attention_mask=mask[:n_rows], do_sample=True, temperature=1.0, top_k=0,
                top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id,
            )

    generate(4, 4, 0)  # warm-up
    rounds = []
    for r in range(args.rounds):
        started = time.perf_counter()
        out = generate(len(rows), args.tokens, r)
        rounds.append(((out.shape[1] - width) * len(rows), time.perf_counter() - started))
    tokens, seconds = sum(t for t, _ in rounds), sum(s for _, s in rounds)
    return {"engine": "hf_generate", "tokens_per_round": tokens / len(rounds), "tokens_per_s": tokens / seconds,
            "round_s": seconds / len(rounds)}


def bench_vllm_alone(path, args) -> dict:
    """vLLM's `LLM.generate` with the options the vLLM engine gives it (`llm_options`), and
    requests as the engine sends them: one per prompt with n samples, eos ignored."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from bench.vllm_rollout import prompts_for
    from workers.rft.engines.vllm_engine import llm_options, new_ipc_dir, vllm_environment
    from workers.rft.models import load_tokenizer

    tokenizer = load_tokenizer(path)
    with vllm_environment(new_ipc_dir()):
        started = time.perf_counter()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # as VLLMEngine picks
        llm = LLM(**llm_options(path, device=device, dtype=torch.float32, seed=0))
        startup = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(tokenizer, args.prompts)]
    llm.generate(prompts[:2], SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=0), use_tqdm=False)
    rounds = []
    for r in range(args.rounds):
        params = SamplingParams(n=args.samples, temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=r)
        started = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        rounds.append((sum(len(c.token_ids) for o in out for c in o.outputs), time.perf_counter() - started))
    llm.llm_engine.engine_core.shutdown()
    tokens, seconds = sum(t for t, _ in rounds), sum(s for _, s in rounds)
    return {"engine": "vllm_alone", "startup": startup, "tokens_per_round": tokens / len(rounds),
            "tokens_per_s": tokens / seconds, "round_s": seconds / len(rounds)}


def child_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["child"])
    parser.add_argument("--engine", choices=ENGINES)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    quiet_hf()
    from workers.rft.models import resolve_model_path

    path = resolve_model_path(args.model)
    if args.engine == "hf_generate":
        result = bench_hf_generate(path, args)
    elif args.engine == "vllm_alone":
        result = bench_vllm_alone(path, args)
    else:
        from bench.vllm_rollout import bench_engine

        result = bench_engine(args.engine, path, args)
    result["peak_rss_mb"] = peak_rss_mb()
    emit(result)


def rollout(quick: bool = False, model: str = "smollm2-135m") -> dict:
    # Three rounds each, a sync after every round (the first sync of an engine costs more).
    shape = {"prompts": 8 if quick else 16, "samples": 4 if quick else 8, "tokens": 32, "rounds": 3}
    reps = 2
    results = {"machine": machine(), "model": model, **shape, "reps": reps, "runs": []}
    per_engine = {e: [] for e in ENGINES}
    failures = {}
    for rep in range(reps):
        order = ENGINES if rep % 2 == 0 else tuple(reversed(ENGINES))
        for engine in order:
            if engine in failures:
                continue
            try:
                out = child("bench.rollout", "child", "--engine", engine, "--model", model,
                            *[f"--{k}={v}" for k, v in shape.items()])
            except (RuntimeError, OSError) as err:
                failures[engine] = str(err)
                print(f"{engine}: failed ({err})", flush=True)
                continue
            out["load"] = load()
            per_engine[engine].append(out)
            results["runs"].append(out)
            print(f"rep {rep} {engine:12s}: {out['tokens_per_s']:.1f} tokens/s (load {out['load']})", flush=True)
    base = median([o["tokens_per_s"] for o in per_engine["hf_generate"]])
    alone = median([o["tokens_per_s"] for o in per_engine["vllm_alone"]])
    rows = []
    for engine, outs in per_engine.items():
        if not outs:
            continue
        tps = median([o["tokens_per_s"] for o in outs])
        with_sync = median([o.get("tokens_per_s_with_sync") for o in outs])
        rows.append([engine, tps, tps / base, tps / alone, with_sync, with_sync / alone,
                     median([o.get("sync_memory_s") for o in outs]), median([o.get("mismatch_mean") for o in outs]),
                     max(o["peak_rss_mb"] for o in outs)])
    keys = ["engine", "tokens_per_s", "vs_hf_generate", "vs_vllm_alone", "tokens_per_s_with_sync",
            "with_sync_vs_vllm_alone", "sync_memory_s", "logprob_gap_mean", "peak_rss_mb"]
    results["summary"] = [dict(zip(keys, r)) for r in rows]
    results["failures"] = failures
    results["load_end"] = load()
    save("rollout", results)
    print(table(rows, ["engine", "tokens/s", "x HF generate", "x vLLM alone", "tokens/s with sync",
                       "with sync x vLLM alone", "sync s", "|dlogp| mean", "RSS MB"]))
    return results


if __name__ == "__main__":  # vLLM starts its workers with spawn: this module is re-imported there
    child_main(sys.argv[1:])
