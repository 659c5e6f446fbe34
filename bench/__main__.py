"""python -m bench all | <name> [options]: run benchmarks, print their tables, write bench/results/<name>.json.

Names: grpo_step, learning, rollout, stack_overhead, buffer, live_metrics, memory, weight_sync, explorers,
config_cost, config_parse, gpu_step and decode (one GPU; not in `all`).
`--quick` uses fewer repetitions and steps (for a loaded machine); see bench/README.md for what each
figure means.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load, machine


def run_grpo_step(args):
    from bench.grpo import grpo_step

    cases = args.cases or ("tiny", "smollm2")
    return grpo_step(reps=2 if args.quick else 3, steps=1 if args.quick else 3, cases=cases,
                     dtypes=args.dtypes or ("fp32", "bf16"))


def run_learning(args):
    from bench.grpo import learning

    return learning(seeds=2 if args.quick else 4, steps=12 if args.quick else 24)


def run_rollout(args):
    from bench.rollout import rollout

    return rollout(quick=args.quick)


def run_stack_overhead(args):
    from bench.stack_overhead import stack_overhead

    return stack_overhead(steps=3 if args.quick else 6, reps=1 if args.quick else 3)


def run_buffer(args):
    from bench.buffer import FULL_FILL_TOKENS, TOKENS, buffer

    return buffer(rows=10_000_000 if args.full else 200_000 if args.quick else 1_000_000,
                  fill_tokens=FULL_FILL_TOKENS if args.full else TOKENS)


def run_live_metrics(args):
    from bench.live_metrics import live_metrics

    return live_metrics(clients=50, steps=20 if args.quick else 60)


def run_memory(args):
    from bench.memory import memory

    return memory(steps=2 if args.quick else 3)


def run_weight_sync(args):
    from bench.weight_sync import weight_sync

    return weight_sync(quick=args.quick)


def run_explorers(args):
    from bench.explorers import explorers

    return explorers(quick=args.quick)


def run_config_parse(args):
    from bench.config_cost import config_parse

    return config_parse(against=args.against)


def run_config_cost(args):
    from bench.config_cost import config_cost

    return config_cost(quick=args.quick)


def run_decode(args):
    from bench.decode import decode

    return decode(args)


def run_gpu_step(args):
    from bench.gpu_step import gpu_step, prepare

    if args.prepare:
        return prepare()
    if args.out is None:
        sys.exit("gpu_step needs --out DIR")
    return gpu_step(Path(args.out), args, steps=2 if args.quick else args.steps, reps=args.reps or 1, sides=args.sides)


BENCHMARKS = {
    "grpo_step": run_grpo_step,
    "learning": run_learning,
    "rollout": run_rollout,
    "stack_overhead": run_stack_overhead,
    "buffer": run_buffer,
    "live_metrics": run_live_metrics,
    "memory": run_memory,
    "weight_sync": run_weight_sync,
    "explorers": run_explorers,
    "config_cost": run_config_cost,
    "config_parse": run_config_parse,
    "gpu_step": run_gpu_step,
    "decode": run_decode,
    "annotate": lambda args: __import__("bench.annotate", fromlist=["run"]).run(args),
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("name", choices=["all", *BENCHMARKS])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and steps")
    parser.add_argument("--full", action="store_true", help="buffer: 10^7 rows (~30 GB of disk)")
    parser.add_argument("--cases", nargs="+", choices=["tiny", "smollm2"], help="grpo_step: which models")
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], help="grpo_step: which dtypes")
    parser.add_argument("--against", help="config_parse: the git revision to time beside this tree")
    parser.add_argument("--out", help="gpu_step: the folder for gpu_step.json")
    parser.add_argument("--steps", type=int, default=4, help="gpu_step: steps per child, the first dropped")
    parser.add_argument("--reps", type=int, help="gpu_step: children per side (1); decode: generate calls (3)")
    parser.add_argument("--attentions", nargs="+", choices=["gqa_eager", "sdpa"],
                        help="decode: the attentions to time (default both)")
    parser.add_argument("--compile", choices=["both", "on", "off"], default="both",
                        help="decode: the step plain, compiled by inductor (the engine's default on CUDA), or both")
    parser.add_argument("--varied", action="store_true",
                        help="decode: also answers of varied length, with and without narrowing to the running rows")
    parser.add_argument("--sides", nargs="+", choices=["rftweb", "rftweb_offset1", "trl", "trl_paged"],
                        help="gpu_step: which sides (default all; a ratio column needs its TRL row)")
    parser.add_argument("--prepare", action="store_true",
                        help="gpu_step: copy SmolLM2's tokenizer files into .smollm2/ (to carry)")
    from bench.gpu_step import add_case_flags

    add_case_flags(parser)
    args = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    names = [name for name in BENCHMARKS if name not in ("gpu_step", "decode")] if args.name == "all" else [args.name]
    failed = []
    for name in names:
        print(f"\n== {name} (load {load()}) ==", flush=True)
        started = time.perf_counter()
        try:
            BENCHMARKS[name](args)
        except Exception as err:  # one benchmark failing must not hide the others
            if type(err).__name__ == "LossMismatch" or "LOSS MISMATCH" in str(err):
                raise
            print(f"{name} FAILED: {type(err).__name__}: {err}", flush=True)
            failed.append(name)
        print(f"({name}: {time.perf_counter() - started:.0f} s, load {load()})", flush=True)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
