"""A GRPO step on one GPU, TRL against rftweb (issue #25):

    python -m bench gpu_step --prepare          # here: SmolLM2's config + tokenizer files into .smollm2/
    python -m bench gpu_step --out DIR [--quick] [--steps N] [--reps N]

SmolLM2-135M's architecture with random weights (seed 0; built in each child from .smollm2/, so no
weights travel) and SmolLM2's real tokenizer and chat template; 16 prompts x 8 samples x 256 new
tokens (random weights run every completion to the limit on both sides: equal work), bf16 autocast
over fp32 weights, lr 1e-6, reward bench_digits, the whole batch one micro-batch, the first step
dropped. Sides, each a child process, in rotated order every rep:

- trl: TRL's GRPOTrainer, HF generate (`use_vllm=False`), gradient checkpointing off;
- trl_paged: the same with `use_transformers_continuous_batching=True` (TRL's faster non-vLLM path);
- rftweb / rftweb_offset1: `Loop.run()` headless with `explorer.engine: transformers`
  (bench/grpo.py's run_rftweb), offset 0 and 1.

Each reports s/step, generation s (TRL: its `_generate`; rftweb: the explorer step), generated
tokens/s and peak GPU memory (torch.cuda.max_memory_allocated); the parent prints them with the
ratio to each TRL row and writes gpu_step.json into --out.
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, child, emit, median, quiet_hf, table

SHAPE = ROOT / ".smollm2"  # ignored (.git/info/exclude): carried to the GPU machine, 3.5 MB
SHAPE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja")
CASE = {"tasks": 16, "samples": 8, "tokens": 256}
QUICK = {"tasks": 4, "samples": 4, "tokens": 32}
LR = 1e-6
SIDES = {  # rftweb first: a run cut short by its time limit has kept their rows (children.jsonl)
    "rftweb": ["--side", "rftweb"],
    "rftweb_offset1": ["--side", "rftweb", "--offset", "1"],
    "trl": ["--side", "trl"],
    "trl_paged": ["--side", "trl", "--paged"],
}


def prepare() -> None:
    """Copy the installed SmolLM2's config and tokenizer files (not its weights) into SHAPE."""
    from workers.rft.models import resolve_model_path

    source = resolve_model_path("smollm2-135m")
    SHAPE.mkdir(exist_ok=True)
    for name in SHAPE_FILES:
        shutil.copy(source / name, SHAPE / name)
    print(f"{SHAPE}: {', '.join(SHAPE_FILES)}")


def random_smollm2(out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(SHAPE), dtype=torch.float32)
    model.save_pretrained(out)
    for name in SHAPE_FILES[1:]:
        shutil.copy(SHAPE / name, out / name)
    return out


def run_trl(case: dict, steps: int, paged: bool) -> dict:
    import torch
    from transformers import TrainerCallback

    from bench.grpo import trl_trainer

    times, generate_s = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            times.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = trl_trainer(case, "bf16", steps, 0, LR, "bench_digits", out_dir, [Timer()], use_cpu=False,
                              use_transformers_continuous_batching=paged)
        generate = trainer._generate

        def timed_generate(*args, **kwargs):
            started = time.perf_counter()
            out = generate(*args, **kwargs)
            torch.cuda.synchronize()
            generate_s.append(time.perf_counter() - started)
            return out

        trainer._generate = timed_generate
        trainer.train()
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    return {"step_s": times, "generate_s": generate_s, "lengths": lengths}


def run_rftweb(case: dict, steps: int, offset: int) -> dict:
    from bench.grpo import run_rftweb as run

    out = run(case, "bf16", steps, 0, LR, "bench_digits", None, offset)
    return {"step_s": out["step_s"], "generate_s": out["explore_s"], "lengths": out["lengths"]}


def child_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["trl", "rftweb"], required=True)
    parser.add_argument("--paged", action="store_true")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    quiet_hf()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        case = {**(QUICK if args.quick else CASE), "model": str(random_smollm2(Path(tmp) / "smollm2-random"))}
        if args.side == "trl":
            result = run_trl(case, args.steps, args.paged)
        else:
            result = run_rftweb(case, args.steps, args.offset)
    cuda = torch.cuda.is_available()  # without: a smoke run of the code path on CPU (rftweb sides)
    result.update(rows=case["tasks"] * case["samples"], torch=torch.__version__,
                  peak_gpu_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
                  device=torch.cuda.get_device_name() if cuda else "cpu")
    emit(result)


def gpu_step(out: Path, steps: int = 4, reps: int = 1, quick: bool = False, sides: list[str] | None = None) -> dict:
    import json

    out.mkdir(parents=True, exist_ok=True)
    per_side = {side: [] for side in SIDES if side in (sides or SIDES)}
    for rep in range(reps):
        names = list(per_side)
        for side in names[rep % len(names):] + names[: rep % len(names)]:
            flags = [*SIDES[side], "--steps", steps, *(["--quick"] if quick else [])]
            result = child("bench.gpu_step", "child", *flags, timeout=900)
            per_side[side].append(result)
            with open(out / "children.jsonl", "a") as f:
                f.write(json.dumps({"side": side, **result}) + "\n")
            print(f"rep {rep} {side}: {median(result['step_s'][1:]):.2f} s/step", flush=True)
    rows = {}
    for side, outs in per_side.items():
        timed = [(o["step_s"][1:], o["generate_s"][1:], o) for o in outs]  # the first step is the warm-up
        step_s = median([median(s) for s, _, _ in timed])
        generate_s = median([median(g) for _, g, _ in timed])
        tokens = median([median(o["lengths"][1:]) * o["rows"] for _, _, o in timed])
        rows[side] = {"step_s": step_s, "generate_s": generate_s, "tokens_per_s": tokens / generate_s,
                      "peak_gpu_mb": max(o["peak_gpu_mb"] for o in outs), "runs": outs}
    for row in rows.values():
        for base in ("trl", "trl_paged"):  # None where that TRL row was not run (--sides)
            row[f"vs_{base}"] = row["step_s"] / rows[base]["step_s"] if base in rows else None
            row[f"memory_vs_{base}"] = row["peak_gpu_mb"] / rows[base]["peak_gpu_mb"] if base in rows else None
    device = next(iter(per_side.values()))[0]["device"]
    print(f"\n{device}, {'quick' if quick else CASE}, {steps} steps per child (first dropped), {reps} rep(s)")
    print(table([[side, r["step_s"], r["vs_trl"], r["vs_trl_paged"], r["generate_s"], r["tokens_per_s"],
                  r["peak_gpu_mb"], r["memory_vs_trl"]] for side, r in rows.items()],
                ["side", "s/step", "x TRL", "x TRL paged", "generation s", "tokens/s", "peak GPU MB", "memory x TRL"]))
    results = {"device": device, "case": QUICK if quick else CASE, "steps": steps, "reps": reps, "rows": rows}
    (out / "gpu_step.json").write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child_main(sys.argv[2:])
    else:
        sys.exit("run it as: python -m bench gpu_step --out DIR")
