"""Peak resident memory (RSS) of explorer and trainer workers on SmolLM2-135M, against TRL.

    python -m bench memory [--quick]

The SmolLM2 GRPO config of bench/grpo.py (4 tasks x 4 samples x 48 tokens, fp32), each role in its
own child process, as the Celery workers run them with `synchronizer.method: checkpoint`:
- explorer: `Loop` in mode `explore` (the rollout model and engine only), `steps` explorer steps;
  its experiences are handed to the trainer child through a pickle;
- trainer: `Loop` in mode `train` (policy + AdamW state), `steps` trainer steps on them;
- loop: explorer and trainer in one process (`synchronizer.method: memory`, Celery role `loop`);
- TRL: one GRPOTrainer process, same config and steps.
Peak RSS is the child's ru_maxrss (includes Python, torch and the imports). Figures, not pass/fail.
"""
import argparse
import pickle
import sys
import tempfile
import time

from bench.common import child, emit, load, machine, peak_rss_mb, quiet_hf, save, table
from bench.grpo import CASES, STEP_LR, rftweb_config


def role_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["explorer", "trainer"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--experiences", required=True)
    args = parser.parse_args(argv)
    quiet_hf()
    from workers.rft.config import RunConfig
    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    base = rftweb_config(CASES["smollm2"], "fp32", args.steps, 0, STEP_LR, "exact_match").to_dict()
    base["mode"] = "explore" if args.role == "explorer" else "train"
    config = RunConfig.from_dict(base)
    stores = memory_stores(config)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work_dir:
        if args.role == "trainer":
            with open(args.experiences, "rb") as f:
                stores.buffer.write(pickle.load(f))
        loop = Loop(config, stores, work_dir)
        loaded = peak_rss_mb()
        if args.role == "explorer":
            loop.run()
            with open(args.experiences, "wb") as f:
                pickle.dump(stores.buffer.all(), f)
        else:
            for _ in range(args.steps):
                loop.train()
    emit({"role": args.role, "peak_rss_mb": peak_rss_mb(), "rss_after_load_mb": loaded,
          "seconds": time.perf_counter() - started})


def memory(steps: int = 3) -> dict:
    results = {"machine": machine(), "steps": steps, "config": "smollm2 4x4x48 fp32"}
    with tempfile.NamedTemporaryFile(suffix=".pkl") as exps:
        explorer = child("bench.memory", "explorer", "--steps", steps, "--experiences", exps.name)
        trainer = child("bench.memory", "trainer", "--steps", steps, "--experiences", exps.name)
    loop = child("bench.grpo", "run", "--side", "rftweb", "--case", "smollm2", "--steps", steps)
    trl = child("bench.grpo", "run", "--side", "trl", "--case", "smollm2", "--steps", steps)
    results.update(explorer_mb=explorer["peak_rss_mb"], trainer_mb=trainer["peak_rss_mb"], loop_mb=loop["peak_rss_mb"],
                   trl_mb=trl["peak_rss_mb"], load_end=load())
    save("memory", results)
    print(table([["rftweb explorer worker", results["explorer_mb"], results["explorer_mb"] / results["trl_mb"]],
                 ["rftweb trainer worker", results["trainer_mb"], results["trainer_mb"] / results["trl_mb"]],
                 ["rftweb loop (both roles)", results["loop_mb"], results["loop_mb"] / results["trl_mb"]],
                 ["TRL GRPOTrainer", results["trl_mb"], 1.0]], ["process", "peak RSS MB", "x TRL"]))
    return results


if __name__ == "__main__":
    role_main(sys.argv[1:])
