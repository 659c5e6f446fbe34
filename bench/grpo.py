"""GRPO against TRL's GRPOTrainer: loss equality, step time, learning per step, peak memory.

    python -m bench grpo_step        # check the losses agree, then time full steps (tiny, SmolLM2; fp32, bf16)
    python -m bench learning         # mean reward of the last quarter of N steps, several seeds

Both sides run the same model, prompts (the built-in arithmetic taskset, chat template), group
size, completion length, temperature 1, learning rate (constant, no warm-up, no weight decay,
grad clip 1), one update per batch, no KL, and the same loss aggregation: rftweb `token-mean` ==
TRL `loss_type="dapo"` (sum over the batch's completion tokens / their count, one process, one
accumulation step). TRL runs on CPU with `use_cpu=True, use_vllm=False`, its whole batch in one
forward (`per_device_train_batch_size` = prompts x samples); rftweb's `trainer.micro_batch_size`
is set to the same. A full step is generation + scoring + update: TRL's `on_step_begin` ->
`on_step_end`, rftweb's `Loop.explore()` + `Loop.train()` (headless, in-memory buffer).

Each measurement is a child process (`python -m bench.grpo child ...`); the parent alternates
the sides, rep after rep, and reports medians of the per-child medians and the ratio.

Known difference that is not the loss: the group advantage. TRL divides by the unbiased std
(n - 1) + 1e-4, rftweb by the population std + 1e-6 (see workers/rft/algorithms/advantages.py), so
for the same rewards rftweb's advantages are sqrt(n / (n - 1)) larger (x1.07 at n = 8, x1.15 at
n = 4): an effective learning rate that much higher. The check reports it; the loss check feeds
TRL's own advantages to both sides.
"""
import argparse
import math
import sys
import tempfile
import time

from bench.common import child, emit, load, machine, median, peak_rss_mb, quiet_hf, save, table

CASES = {
    "tiny": {"model": "tiny", "tasks": 16, "samples": 8, "tokens": 32},
    "smollm2": {"model": "smollm2-135m", "tasks": 4, "samples": 4, "tokens": 48},
}
TASKSET = "arithmetic:n=200"
STEP_LR = 1e-6


# ---- a reward the random-init tiny model can learn in a few dozen steps ------------------------

def register_bench_rewards() -> None:
    from workers.rft.rewards.base import REWARD_FNS

    if "bench_digits" not in REWARD_FNS:
        @REWARD_FNS.register("bench_digits")
        def digits(response: str, task) -> float:
            """Share of the response's characters that are digits (dense, learnable by the tiny model)."""
            return sum(c.isdigit() for c in response) / max(len(response), 1)


# ---- rftweb side --------------------------------------------------------------------------------

def rftweb_config(case: dict, dtype: str, steps: int, seed: int, lr: float, reward: str, offset: int = 0):
    from workers.rft.config import RunConfig

    register_bench_rewards()
    return RunConfig.from_dict({
        "seed": seed,
        "model": {"path": case["model"], "dtype": "bfloat16" if dtype == "bf16" else "float32"},
        "algorithm": {"name": "grpo", "repeat_times": case["samples"], "loss_agg_mode": "token-mean"},
        "explorer": {"engine": "transformers", "batch_size": case["tasks"], "max_new_tokens": case["tokens"],
                     "temperature": 1.0, "reward_fn": reward},
        "trainer": {"lr": lr, "micro_batch_size": case.get("micro") or case["tasks"] * case["samples"],
                    "activation_checkpointing": case.get("checkpointing", False), "total_steps": steps,
                    "grad_clip": 1.0, "weight_decay": 0.0},
        "buffer": {"taskset": TASKSET},
        "synchronizer": {"offset": offset},
    })


def run_rftweb(case: dict, dtype: str, steps: int, seed: int, lr: float, reward: str, profile: str | None,
               offset: int = 0) -> dict:
    """`Loop.run()` as the headless CLI runs it: explorer and trainer one after the other at offset
    0, overlapped (explorer one step ahead, in its own thread) at offset 1. A step's time is the
    wall time between two trainer steps' ends, so overlap counts; the first step is the warm-up."""
    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    config = rftweb_config(case, dtype, steps, seed, lr, reward, offset)
    stores = memory_stores(config)
    ends, cpu_ends, explore_s, train_s = [], [], [], []
    profiler = None

    def timed(step_fn, durations, after=None):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            result = step_fn(*args, **kwargs)
            durations.append(time.perf_counter() - started)
            if after:
                after()
            return result
        return wrapper

    def trainer_step_ended():
        nonlocal profiler
        ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
        if profile and len(ends) == 1:  # profile the steps after the warm-up (this thread only)
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()

    with tempfile.TemporaryDirectory() as work_dir, Loop(config, stores, work_dir) as loop:
        loop.explorer.explore_step = timed(loop.explorer.explore_step, explore_s)
        loop.trainer.train_step = timed(loop.trainer.train_step, train_s, trainer_step_ended)
        started, cpu_started = time.perf_counter(), time.process_time()
        loop.run()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    rewards = [v for _, v in stores.metrics.series("explorer", "reward_mean")]
    lengths = [v for _, v in stores.metrics.series("explorer", "response_length")]
    return {"step_s": diffs([started, *ends]), "step_cpu_s": diffs([cpu_started, *cpu_ends]), "explore_s": explore_s,
            "train_s": train_s, "rewards": rewards, "lengths": lengths}


def diffs(values: list[float]) -> list[float]:
    return [b - a for a, b in zip(values, values[1:])]


# ---- TRL side -----------------------------------------------------------------------------------

def trl_trainer(case: dict, dtype: str, steps: int, seed: int, lr: float, reward: str, out_dir: str, callbacks=(),
                use_cpu: bool = True, **options):
    """TRL's GRPOTrainer set up as rftweb's side is; `options` go to GRPOConfig (bench/gpu_step.py)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from workers.rft.memory import load_tasks
    from workers.rft.models import load_tokenizer, resolve_model_path
    from workers.rft.rewards import build_reward

    register_bench_rewards()
    tasks = load_tasks(TASKSET)
    score = build_reward(reward)

    def reward_fn(completions, task_id, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(text, tasks[i])[0] for text, i in zip(texts, task_id)]

    reward_fn.__name__ = reward
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.id} for t in tasks])
    path = resolve_model_path(case["model"])
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    micro = case.get("micro") or case["tasks"] * case["samples"]
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=use_cpu, use_vllm=False, bf16=dtype == "bf16", fp16=False,
        # One generation of the whole batch a step, trained in micro-batches of case["micro"] rows.
        per_device_train_batch_size=micro, gradient_accumulation_steps=case["tasks"] * case["samples"] // micro,
        num_generations=case["samples"], max_completion_length=case["tokens"], temperature=1.0,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        loss_type="dapo", beta=0.0, num_iterations=1, max_steps=steps, logging_steps=1, report_to="none",
        # TRL's default is True; here as rftweb's side has it (trainer.activation_checkpointing)
        gradient_checkpointing=case.get("checkpointing", False),
        save_strategy="no", seed=seed, data_seed=seed, dataloader_num_workers=0, disable_tqdm=True, **options,
    )
    return GRPOTrainer(model=model, reward_funcs=reward_fn, args=args, train_dataset=dataset,
                       processing_class=tokenizer, callbacks=list(callbacks))


def run_trl(case: dict, dtype: str, steps: int, seed: int, lr: float, reward: str, profile: str | None) -> dict:
    from transformers import TrainerCallback

    times, cpu = [], []

    class Timer(TrainerCallback):
        profiler = None

        def on_step_begin(self, args, state, control, **kwargs):
            if profile and state.global_step == 1:
                import cProfile

                self.profiler = cProfile.Profile()
                self.profiler.enable()
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.started)
            cpu.append(time.process_time() - self.cpu_started)

    timer = Timer()
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = trl_trainer(case, dtype, steps, seed, lr, reward, out_dir, [timer])
        trainer.train()
    if timer.profiler is not None:
        timer.profiler.disable()
        timer.profiler.dump_stats(profile)
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    return {
        "step_s": times,
        "step_cpu_s": cpu,
        "rewards": [entry["reward"] for entry in logs],
        "lengths": [entry.get("completions/mean_length") for entry in logs],
    }


# ---- the loss check -----------------------------------------------------------------------------

class LossMismatch(AssertionError):
    pass


def check_loss(case_name: str, seed: int = 0) -> dict:
    """TRL generates and scores one batch; on that very batch (its completions, masks and
    advantages, and old logprobs perturbed so the clip is active) both sides compute the loss and
    its gradient from the same weights. Raises LossMismatch when they differ."""
    import torch

    from workers.rft.algorithms.advantages import grpo as rftweb_advantages
    from workers.rft.experience import Experience
    from workers.rft.memory import InMemoryBuffer
    from workers.rft.micro_batches import collate
    from workers.rft.trainer import Trainer

    case = CASES[case_name]
    config = rftweb_config(case, "fp32", 1, seed, STEP_LR, "exact_match")
    found = {}

    def compare(trainer, model, inputs):
        params = [p for p in model.parameters() if p.requires_grad]
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        advantages = inputs["advantages"]
        lengths = completion_mask.sum(-1).long().tolist()
        # the completion mask must be a prefix of ones (eos included), as rftweb's responses are
        for row, n in zip(completion_mask, lengths):
            assert row[:n].all() and not row[n:].any()
        rft = Trainer(config, model, trainer.processing_class, InMemoryBuffer())
        generator = torch.Generator().manual_seed(seed)
        experiences = []
        for i, n in enumerate(lengths):
            experiences.append(Experience(
                task_id=i, group_id=str(i // case["samples"]), rollout_index=i % case["samples"],
                prompt_ids=prompt_ids[i][prompt_mask[i].bool()].tolist(), response_ids=completion_ids[i, :n].tolist(),
                action_mask=[1] * n, logprobs=[0.0] * n, advantage=float(advantages[i]), reward=0.0,
            ))
        mb = collate(experiences, trainer.processing_class.pad_token_id, torch.device("cpu"))
        with torch.no_grad():  # current logprobs, then old ones 0.3 nats away so ratios leave [0.8, 1.2]
            current = rft._logprobs(model, mb)[0]
        old = current + 0.3 * torch.randn(current.shape, generator=generator)
        mb.old_logprobs = old * mb.mask
        mb.rollout_logprobs = False
        width = completion_ids.shape[1]
        trl_old = torch.zeros_like(completion_mask, dtype=torch.float32)
        trl_old[:, : old.shape[1]] = old[:, :width]
        inputs = dict(inputs, old_per_token_logps=trl_old)

        trl_loss = trainer._compute_loss(model, inputs)
        trl_grads = torch.autograd.grad(trl_loss, params, allow_unused=True)
        rft_loss, metrics = rft._loss(mb, "usual")
        rft_grads = torch.autograd.grad(rft_loss, params, allow_unused=True)
        pairs = [(a, b) for a, b in zip(trl_grads, rft_grads) if a is not None and b is not None]
        diff = math.sqrt(sum(((a - b) ** 2).sum().item() for a, b in pairs))
        norm = math.sqrt(sum((a**2).sum().item() for a, _ in pairs))
        found.update(
            trl_loss=trl_loss.item(), rftweb_loss=rft_loss.item(),
            grad_norm=norm, grad_rel_diff=diff / max(norm, 1e-30),
            clip_frac=metrics["clip_frac"], tokens=int(mb.mask.sum().item()), rows=len(lengths),
        )
        # The advantage each side gives the same rewards (TRL's formula written out: group mean,
        # unbiased std + 1e-4), on rewards 0/1 drawn per rollout.
        g = case["samples"]
        rewards = (torch.rand(len(lengths), generator=generator) < 0.5).float()
        grouped = rewards.view(-1, g)
        trl_adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
        ours, _ = rftweb_advantages(rewards, [i // g for i in range(len(lengths))])
        nonzero = trl_adv.abs() > 1e-3
        found["advantage_ratio_rftweb_over_trl"] = (ours[nonzero] / trl_adv[nonzero]).median().item()

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = trl_trainer(case, "fp32", 1, seed, STEP_LR, "exact_match", out_dir)
        real = trainer.compute_loss

        def hooked(model, inputs, *args, **kwargs):
            if not found:
                compare(trainer, model, inputs)
            return real(model, inputs, *args, **kwargs)

        trainer.compute_loss = hooked
        trainer.train()
    loss_ok = abs(found["trl_loss"] - found["rftweb_loss"]) <= 1e-5 + 1e-4 * abs(found["trl_loss"])
    grad_ok = found["grad_rel_diff"] <= 1e-3
    found["equal"] = loss_ok and grad_ok
    if not found["equal"]:
        raise LossMismatch(f"{case_name}: rftweb and TRL disagree on identical inputs: {found}")
    return found


# ---- child and parents --------------------------------------------------------------------------

def child_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["run", "check"])
    parser.add_argument("--side", choices=["trl", "rftweb"])
    parser.add_argument("--case", choices=sorted(CASES), default="tiny")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=STEP_LR)
    parser.add_argument("--reward", default="exact_match")
    parser.add_argument("--profile")
    parser.add_argument("--offset", type=int, default=0)
    args = parser.parse_args(argv)
    quiet_hf()
    import torch

    torch.manual_seed(args.seed)
    if args.what == "check":
        try:
            result = check_loss(args.case, args.seed)
        except LossMismatch as err:
            print(f"LOSS MISMATCH: {err}", file=sys.stderr, flush=True)
            sys.exit(3)
        emit(result)
        return
    case = CASES[args.case]
    if args.side == "trl":
        result = run_trl(case, args.dtype, args.steps, args.seed, args.lr, args.reward, args.profile)
    else:
        result = run_rftweb(case, args.dtype, args.steps, args.seed, args.lr, args.reward, args.profile, args.offset)
    result["peak_rss_mb"] = peak_rss_mb()
    emit(result)


# The compared sides: TRL; rftweb on-policy (offset 0: explore then train, TRL's schedule); rftweb
# one step off-policy (offset 1: the explorer generates step t + 1 while the trainer trains step t).
SIDES = {
    "trl": ["--side", "trl"],
    "rftweb": ["--side", "rftweb"],
    "rftweb_offset1": ["--side", "rftweb", "--offset", "1"],
}


def alternating(rep: int) -> list[str]:
    """The sides in a different order every repetition (rotated), so drift in load hits each alike."""
    names = list(SIDES)
    shift = rep % len(names)
    return names[shift:] + names[:shift]


def grpo_step(reps: int = 3, steps: int = 4, cases=("tiny", "smollm2"), dtypes=("fp32", "bf16"),
              profile: bool = True) -> dict:
    """Loss check first (fails loudly), then alternating timed children."""
    results = {"machine": machine(), "reps": reps, "steps_per_child": steps, "checks": {}, "rows": []}
    for case in cases:
        check = child("bench.grpo", "check", "--case", case)
        results["checks"][case] = check
        print(f"loss check {case}: TRL {check['trl_loss']:.6g} rftweb {check['rftweb_loss']:.6g}, grad rel diff "
              f"{check['grad_rel_diff']:.1e}, clip frac {check['clip_frac']:.2f} -> equal", flush=True)
    for case in cases:
        for dtype in dtypes:
            per_side = {side: [] for side in SIDES}
            for rep in range(reps):
                for side in alternating(rep):
                    extra = []
                    if profile and rep == reps - 1 and dtype == "fp32":
                        extra = ["--profile", str(save_path(f"profile_{case}_{side}.prof"))]
                    out = child("bench.grpo", "run", *SIDES[side], "--case", case, "--dtype", dtype,
                                "--steps", steps + 2, *extra)
                    out["load"] = load()
                    per_side[side].append(out)
            row = {"case": case, "dtype": dtype, "load": load()}
            for side, outs in per_side.items():
                # Timed: the steps between the warm-up and the last one (which no explorer step
                # overlaps: nothing is left to generate for).
                row[f"{side}_step_s"] = median([median(o["step_s"][1:-1]) for o in outs])
                row[f"{side}_cpu_s"] = median([median(o["step_cpu_s"][1:-1]) for o in outs])
                row[f"{side}_len"] = median([median(o["lengths"]) for o in outs])
                row[f"{side}_rss_mb"] = max(o["peak_rss_mb"] for o in outs)
                row[f"{side}_runs"] = outs
                if side != "trl":
                    row[f"{side}_explore_s"] = median([median(o["explore_s"][1:]) for o in outs])
                    row[f"{side}_train_s"] = median([median(o["train_s"][1:]) for o in outs])
                    row[f"{side}_ratio"] = row[f"{side}_step_s"] / row["trl_step_s"]
                    row[f"{side}_cpu_ratio"] = row[f"{side}_cpu_s"] / row["trl_cpu_s"]
            results["rows"].append(row)
            print(f"{case} {dtype}: TRL {row['trl_step_s']:.2f} s/step; " + "; ".join(
                f"{side} {row[f'{side}_step_s']:.2f} (explore {row[f'{side}_explore_s']:.2f}, train "
                f"{row[f'{side}_train_s']:.2f}) ratio {row[f'{side}_ratio']:.2f}" for side in SIDES if side != "trl")
                + f"; load {row['load']}", flush=True)
    # one file per selection, so runs of different cases never overwrite each other
    save("grpo_step" if set(cases) == set(CASES) and set(dtypes) == {"fp32", "bf16"} else
         f"grpo_step_{'_'.join(cases)}_{'_'.join(dtypes)}", results)
    print(table(
        [[r["case"], r["dtype"], side, r[f"{side}_step_s"], r.get(f"{side}_ratio", 1.0), r[f"{side}_cpu_s"],
          r[f"{side}_len"], r[f"{side}_rss_mb"], r["load"]] for r in results["rows"] for side in SIDES],
        ["case", "dtype", "side", "s/step", "ratio to TRL", "CPU s/step", "response len", "peak RSS MB", "load"],
    ))
    return results


def save_path(name: str):
    from bench.common import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / name


def learning(seeds: int = 4, steps: int = 24, lr: float = 1e-3, reward: str = "bench_digits",
             case: str = "tiny") -> dict:
    """Same GRPO config, several seeds, the sides alternating; mean reward of the first and last quarter."""
    results = {"machine": machine(), "seeds": seeds, "steps": steps, "lr": lr, "reward": reward, "case": case,
               "runs": []}
    first, last = {side: [] for side in SIDES}, {side: [] for side in SIDES}
    for seed in range(seeds):
        for side in alternating(seed):
            out = child("bench.grpo", "run", *SIDES[side], "--case", case, "--steps", steps, "--seed", seed,
                        "--lr", lr, "--reward", reward)
            rewards = out["rewards"]
            quarter = max(1, len(rewards) // 4)
            last[side].append(sum(rewards[-quarter:]) / quarter)
            first[side].append(sum(rewards[:quarter]) / quarter)
            results["runs"].append({"side": side, "seed": seed, "rewards": rewards, "step_s": out["step_s"],
                                    "step_cpu_s": out["step_cpu_s"], "load": load()})
            print(f"seed {seed} {side:14s}: first quarter {first[side][-1]:.3f} -> last quarter {last[side][-1]:.3f} "
                  f"({median(out['step_s']):.2f} s/step, load {load()})", flush=True)
    summary = {side: {"first_quarter": sum(v) / len(v), "last_quarter": sum(last[side]) / len(last[side]),
                      "last_quarter_per_seed": last[side]} for side, v in first.items()}
    results["summary"] = summary
    save("learning", results)
    print(table([[side, s["first_quarter"], s["last_quarter"], " ".join(f"{x:.3f}" for x in s["last_quarter_per_seed"])]
                 for side, s in summary.items()], ["side", "reward 1st quarter", "reward last quarter", "per seed"]))
    return results


if __name__ == "__main__":
    child_main(sys.argv[1:])
