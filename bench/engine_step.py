"""Seconds per GRPO step (explore + train) on the tiny model and on SmolLM2-135M.

    python bench/engine_step.py [--steps 3] [--only tiny|smollm2]

Each run does one warm-up step, then times `--steps` steps; prints explorer, trainer and total
seconds per step, and the device. Figures, not pass/fail: they depend on the machine and its load.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.rft.config import RunConfig
from workers.rft.loop import Loop
from workers.rft.memory import memory_stores

CASES = {
    "tiny": {"model": "tiny", "tasks": 16, "samples": 8, "new_tokens": 32},
    "smollm2": {"model": "smollm2-135m", "tasks": 4, "samples": 4, "new_tokens": 48},
}


def grpo_config(case: dict, steps: int) -> RunConfig:
    return RunConfig.from_dict({
        "seed": 0,
        "model": {"path": case["model"]},
        "algorithm": {"name": "grpo", "repeat_times": case["samples"]},
        "explorer": {"engine": "transformers", "batch_size": case["tasks"], "max_new_tokens": case["new_tokens"]},
        "trainer": {"lr": 1e-6, "micro_batch_size": 16, "total_steps": steps + 1},
        "buffer": {"taskset": "arithmetic:n=200"},
    })


def bench(name: str, steps: int) -> None:
    case = CASES[name]
    config = grpo_config(case, steps)
    stores = memory_stores(config)
    with tempfile.TemporaryDirectory() as work_dir:
        loop = Loop(config, stores, work_dir)
        explore, train = [], []
        for _ in range(steps + 1):
            started = time.perf_counter()
            loop.explore()
            explore.append(time.perf_counter() - started)
            started = time.perf_counter()
            loop.train()
            train.append(time.perf_counter() - started)
    explore, train = explore[1:], train[1:]  # drop the warm-up step
    tokens = statistics.mean(v for _, v in stores.metrics.series("explorer", "response_length"))
    device = loop.trainer.device
    print(
        f"{name:8s} grpo {case['tasks']} tasks x {case['samples']} samples, {case['new_tokens']} new tokens "
        f"on {device}: explore {statistics.mean(explore):.2f} s + train {statistics.mean(train):.2f} s "
        f"= {statistics.mean(e + t for e, t in zip(explore, train)):.2f} s/step "
        f"(mean response {tokens:.1f} tokens, {steps} steps)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", choices=sorted(CASES))
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in [args.only] if args.only else CASES:
        bench(name, args.steps)


if __name__ == "__main__":
    main()
