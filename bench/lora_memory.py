"""Trainer peak memory and seconds per step, full fine-tuning against LoRA (model.lora).

    python -m bench.lora_memory [--model smollm2-135m|smollm2-shape|tiny] [--steps 5] [--device cpu|cuda] [--r 16]

(`smollm2-shape`: SmolLM2-135M's architecture with random weights, bench/trainer_ranks.py, for a
machine without the installed model; memory and time do not depend on the weights.)

Each side runs in its own child process: the run's trainer (loop.build_trainer: policy, AdamW
state; with LoRA the adapters and their optimizer state only) on a fixed batch of GRPO rollouts
(16 groups-of-two, the sum right or wrong), `steps` steps. Peak memory: on CPU the child's RSS
high-water mark (ru_maxrss: Python, torch and the imports included); on CUDA
torch.cuda.max_memory_allocated (tensors only). Seconds per step: the median after the first.
Figures, not pass/fail.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.common import child, emit, machine, peak_rss_mb, quiet_hf, save, table


def rollouts(tokenizer, step: int, groups: int = 16):
    from workers.rft.experience import Experience

    batch = []
    for i in range(groups):
        a, b = i % 10, (3 * i) % 10
        prompt = tokenizer(f"What is {a} plus {b}? Answer with the number only.")["input_ids"]
        for index, (answer, advantage) in enumerate([(a + b, 1.0), (a + b + 11, -1.0)]):
            response = tokenizer(f"The answer is {answer}.")["input_ids"] + [tokenizer.eos_token_id]
            batch.append(Experience(
                task_id=i, group_id=str(i), rollout_index=index, prompt_ids=prompt, response_ids=response,
                action_mask=[1] * len(response), source="rollout", reward=advantage, advantage=advantage,
                explorer_step=step, model_version=0,
            ))
    return batch


def side_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["full", "lora"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--r", type=int, default=16)
    args = parser.parse_args(argv)
    quiet_hf()
    import torch

    from workers.rft.config import RunConfig
    from workers.rft.loop import build_trainer
    from workers.rft.memory import InMemoryBuffer
    from workers.rft.models import load_tokenizer

    config = RunConfig.from_dict({
        "model": {"path": args.model, "device": args.device,
                  "lora": {"r": args.r, "alpha": 2 * args.r} if args.side == "lora" else None},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "trainer": {"lr": 1e-5, "batch_size": 32, "micro_batch_size": 32},
    })
    tokenizer = load_tokenizer(args.model)
    buffer = InMemoryBuffer()
    trainer = build_trainer(config, tokenizer, buffer)
    cuda = trainer.device.type == "cuda"
    seconds = []
    for step in range(args.steps):
        buffer.write(rollouts(tokenizer, step))
        started = time.perf_counter()
        metrics = trainer.train_step()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        assert "skipped" not in metrics
    emit({
        "side": args.side, "device": trainer.device.type,
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb(),
        "s_per_step": statistics.median(seconds[1:] or seconds),
        "trainable_params": metrics["trainable_params"], "trainable_share": metrics["trainable_share"],
    })


def main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--r", type=int, default=16)
    args = parser.parse_args(argv)
    if args.model == "smollm2-shape":  # built once here, not by both children at once
        from bench.trainer_ranks import smollm2_shape

        args.model = smollm2_shape()
    options = ["--model", args.model, "--steps", args.steps, "--device", args.device, "--r", args.r]
    sides = [child("bench.lora_memory", side, *options) for side in ("full", "lora")]
    memory = "peak MB (" + ("max_memory_allocated" if sides[0]["device"] == "cuda" else "RSS") + ")"
    name, device = Path(args.model).name, sides[0]["device"]
    print(f"{name} on {device}, GRPO batch 32 x ~30 tokens, {args.steps} steps, LoRA r={args.r}")
    print(table([[s["side"], s["peak_mb"], s["s_per_step"], s["trainable_params"], s["trainable_share"]]
                 for s in sides], ["trainer", memory, "s/step", "trainable params", "share"]))
    save("lora_memory", {"machine": machine(), "args": vars(args), "sides": sides})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("full", "lora"):
        side_main(sys.argv[1:])
    else:
        main(sys.argv[1:])
