"""A GRPO step on one GPU, TRL against rftweb (issues #25, #43):

    python -m bench gpu_step --prepare          # here: SmolLM2's tokenizer files into .smollm2/
    python -m bench gpu_step --out DIR [--model M] [--tasks N --samples N --tokens N] [--micro N]
                             [--checkpointing] [--quick] [--steps N] [--reps N]

A real architecture with random weights (workers/rft/architectures.py: smollm2-135m, smollm2-1.7b,
qwen2.5-1.5b; seed 0, built once a machine and kept in MODELS, so no weights travel) and SmolLM2's
real tokenizer and chat template; by default 16 prompts x 8 samples x 1,024 new tokens (random
weights run every completion to the limit on both sides: equal work), bf16 autocast over fp32
weights, lr 1e-6, reward bench_digits, the first step dropped. The batch is split into micro-batches
of --micro rows on both sides (default: one micro-batch), and --checkpointing recomputes each layer
in the backward on both sides (TRL's GRPOConfig has gradient_checkpointing on by default; rftweb's
trainer.activation_checkpointing is off by default). Sides, each a child process, in rotated
order every rep:

- trl: TRL's GRPOTrainer, HF generate (`use_vllm=False`), micro-batches as gradient accumulation;
- trl_paged: the same with `use_transformers_continuous_batching=True` (TRL's faster non-vLLM path);
- rftweb / rftweb_offset1: `Loop.run()` headless with `explorer.engine: transformers`
  (bench/grpo.py's run_rftweb), offset 0 and 1.

Each reports s/step, generation s (TRL: its `_generate`; rftweb: the explorer step), generated
tokens/s and peak GPU memory (torch.cuda.max_memory_allocated), and rftweb's rows the launch's
memory estimate of its process (workers/rft/footprint.py) beside that peak; the parent prints them
with the ratio to each TRL row and writes gpu_step.json into --out.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, child, emit, median, quiet_hf, table

SHAPE = ROOT / ".smollm2"  # ignored (.gitignore): carried to the GPU machine, 3.5 MB
SHAPE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CASE = {"tasks": 16, "samples": 8, "tokens": 1024}
QUICK = {"tasks": 4, "samples": 4, "tokens": 32}
MODEL = "smollm2-135m"
# Each architecture is built once a machine (seed 0: the same weights each time) and kept here for
# every later child: building and saving Qwen2.5-1.5B's 6 GB took 33 s on 2 cores, and one
# gpu_check call needs the large model three times (decode and gpu_step's two sides).
MODELS = Path(os.environ.get("BENCH_MODELS") or Path(tempfile.gettempdir()) / "rftweb-bench-models")
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


def random_model(name: str) -> Path:
    """Architecture `name` with random weights (seed 0) and SmolLM2's tokenizer (SHAPE), in MODELS
    under a name that changes with what built it (architectures.py, the tokenizer's files,
    transformers' and torch's versions); built into a folder of its own and renamed into place, so
    a build cut short is never found."""
    import hashlib

    import torch
    import transformers

    from workers.rft import architectures

    digest = hashlib.sha256(f"{transformers.__version__} {torch.__version__}".encode())
    for source in (Path(architectures.__file__), *(SHAPE / file for file in SHAPE_FILES)):
        digest.update(source.read_bytes())
    path = MODELS / f"{name}-{digest.hexdigest()[:12]}"
    if not path.is_dir():
        MODELS.mkdir(parents=True, exist_ok=True)
        for stale in MODELS.glob(f".{name}-*"):  # a build killed midway (a timeout): up to 7 GB each
            shutil.rmtree(stale, ignore_errors=True)
        building = Path(tempfile.mkdtemp(dir=MODELS, prefix=f".{name}-"))
        try:
            architectures.build_random(name, SHAPE, building)
        except BaseException:
            shutil.rmtree(building)
            raise
        try:
            building.rename(path)
        except OSError:  # another process put it there first: the same weights
            shutil.rmtree(building)
    return path


def estimated_gb(case: dict) -> float:
    """The launch's estimate of the rftweb process's GPU memory (explorer and trainer), GB, with
    model.max_prompt_tokens at the longest prompt the run has: the width its batch is padded to
    (a launch takes the limit, 256 by default)."""
    import json

    from bench.grpo import rftweb_config
    from workers.rft.footprint import ModelShape, run_footprint

    config = rftweb_config(case, "bf16", 2, 0, LR, "bench_digits")
    config = config.model_copy(update={"model": config.model.model_copy(
        update={"max_prompt_tokens": longest_prompt(case["model"])})})
    shape = ModelShape.from_config(json.loads((Path(case["model"]) / "config.json").read_text()))
    return run_footprint(config, shape, on_gpu=True).process(True, True, on_gpu=True).total / 1e9


def longest_prompt(model: str) -> int:
    """Tokens of the benchmark taskset's longest prompt under the model's chat template."""
    from bench.grpo import TASKSET
    from workers.rft.memory import load_tasks
    from workers.rft.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    return max(len(tokenizer.apply_chat_template([{"role": "user", "content": task.prompt}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
               for task in load_tasks(TASKSET))


def dtype_and_sync():
    """bf16 autocast and a CUDA synchronize on a GPU; fp32 and nothing to wait for on CPU, where
    a run checks the code path only (TRL refuses bf16 there)."""
    import torch

    if torch.cuda.is_available():
        return "bf16", torch.cuda.synchronize
    return "fp32", lambda: None


def run_trl(case: dict, steps: int, paged: bool) -> dict:
    import torch
    from transformers import TrainerCallback

    from bench.grpo import trl_trainer

    times, generate_s = [], []
    dtype, synchronize = dtype_and_sync()

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            times.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = trl_trainer(case, dtype, steps, 0, LR, "bench_digits", out_dir, [Timer()],
                              use_cpu=not torch.cuda.is_available(),
                              use_transformers_continuous_batching=paged)
        generate = trainer._generate

        def timed_generate(*args, **kwargs):
            started = time.perf_counter()
            out = generate(*args, **kwargs)
            synchronize()
            generate_s.append(time.perf_counter() - started)
            return out

        trainer._generate = timed_generate
        trainer.train()
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    return {"step_s": times, "generate_s": generate_s, "lengths": lengths}


def run_rftweb(case: dict, steps: int, offset: int) -> dict:
    from bench.grpo import run_rftweb as run

    out = run(case, dtype_and_sync()[0], steps, 0, LR, "bench_digits", None, offset)
    return {"step_s": out["step_s"], "generate_s": out["explore_s"], "lengths": out["lengths"],
            "estimated_gb": estimated_gb(case)}


def child_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["trl", "rftweb"], required=True)
    parser.add_argument("--paged", action="store_true")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    add_case_flags(parser)
    args = parser.parse_args(argv)
    quiet_hf()
    import torch

    case = {**case_of(args), "model": str(random_model(args.model))}
    if args.side == "trl":
        result = run_trl(case, args.steps, args.paged)
    else:
        result = run_rftweb(case, args.steps, args.offset)
    cuda = torch.cuda.is_available()  # without: a smoke run of the code path on CPU
    result.update(rows=case["tasks"] * case["samples"], torch=torch.__version__,
                  peak_gpu_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
                  device=torch.cuda.get_device_name() if cuda else "cpu")
    emit(result)


def add_case_flags(parser) -> None:
    """The model and shape flags, the same in the parent (bench/__main__.py) and each child."""
    from workers.rft.architectures import ARCHITECTURES

    parser.add_argument("--model", choices=list(ARCHITECTURES), default=MODEL,
                        help="gpu_step, decode: the architecture")
    for key in ("tasks", "samples", "tokens"):
        parser.add_argument(f"--{key}", type=int,
                            help=f"gpu_step, decode: {key} (default {CASE[key]}; --quick {QUICK[key]})")
    parser.add_argument("--micro", type=int, help="gpu_step: rows per micro-batch, both sides (default: all rows)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="gpu_step: recompute each layer in the backward, both sides")


def case_of(args) -> dict:
    """The shape the flags ask for: CASE (QUICK with --quick), each size overridden by its flag."""
    case = dict(QUICK if args.quick else CASE)
    case.update({key: getattr(args, key) for key in ("tasks", "samples", "tokens") if getattr(args, key)})
    case["micro"] = getattr(args, "micro", None) or case["tasks"] * case["samples"]
    case["checkpointing"] = bool(getattr(args, "checkpointing", False))
    if (case["tasks"] * case["samples"]) % case["micro"]:
        sys.exit(f"--micro {case['micro']} does not divide the batch of {case['tasks'] * case['samples']} rows")
    return case


def case_flags(args) -> list:
    flags = ["--model", args.model, *(["--quick"] if args.quick else []),
             *(["--checkpointing"] if args.checkpointing else [])]
    for key in ("tasks", "samples", "tokens", "micro"):
        if getattr(args, key):
            flags += [f"--{key}", getattr(args, key)]
    return flags


def gpu_step(out: Path, args, steps: int = 4, reps: int = 1, sides: list[str] | None = None) -> dict:
    import json

    out.mkdir(parents=True, exist_ok=True)
    case = case_of(args)
    per_side = {side: [] for side in SIDES if side in (sides or SIDES)}
    for rep in range(reps):
        names = list(per_side)
        for side in names[rep % len(names):] + names[: rep % len(names)]:
            flags = [*SIDES[side], "--steps", steps, *case_flags(args)]
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
                      "peak_gpu_mb": max(o["peak_gpu_mb"] for o in outs), "runs": outs,
                      "estimated_mb": outs[0].get("estimated_gb", 0.0) * 1e9 / 2**20 or None}
    for row in rows.values():
        for base in ("trl", "trl_paged"):  # None where that TRL row was not run (--sides)
            row[f"vs_{base}"] = row["step_s"] / rows[base]["step_s"] if base in rows else None
            peak = rows[base]["peak_gpu_mb"] if base in rows else 0.0  # 0 on CPU: no GPU memory to compare
            row[f"memory_vs_{base}"] = row["peak_gpu_mb"] / peak if peak else None
    device = next(iter(per_side.values()))[0]["device"]
    print(f"\n{device}, {args.model}, {case}, {steps} steps per child (first dropped), {reps} rep(s)")
    print(table([[side, r["step_s"], r["vs_trl"], r["vs_trl_paged"], r["generate_s"], r["tokens_per_s"],
                  r["peak_gpu_mb"], r["memory_vs_trl"], r["estimated_mb"]] for side, r in rows.items()],
                ["side", "s/step", "x TRL", "x TRL paged", "generation s", "tokens/s", "peak GPU MB", "memory x TRL",
                 "estimated MB"]))
    results = {"device": device, "model": args.model, "case": case, "steps": steps, "reps": reps, "rows": rows}
    (out / "gpu_step.json").write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child_main(sys.argv[2:])
    else:
        sys.exit("run it as: python -m bench gpu_step --out DIR")
