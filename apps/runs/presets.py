"""Starting points for the launch page: each is a partial run config over the schema's defaults.

They name the built-in tasksets (`manage.py load_builtin_tasksets`) and the built-in models, so
they launch on a fresh install without downloads.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    title: str
    description: str
    config: dict


PRESETS = {
    "quick-demo": Preset(
        "Quick demo",
        # Measured embedded on a quiet 2-core EPYC (#42, finding 7): held-out 0.45 at step 180 (1 min
        # 45 s), 0.75 at step 240 (2 min 19 s), 0.9 at step 420 (5 min 6 s), ~1.2 steps a second; on
        # a loaded machine (load 7-11) 0.5 came at step 140 after 8.5 minutes.
        "A tiny random model learns single-digit addition with MIX (GRPO on its own answers + SFT on "
        "expert ones). On a quiet 2-core CPU, held-out accuracy passes 0.5 after about 2 minutes (step "
        "~200) and reaches about 0.9 after 5 (step ~420), at ~1.2 steps a second; slower on a busy "
        "machine. Most groups score alike at first: the expert half teaches until the model's own answers "
        "differ. Time enough to watch it and to annotate as it trains.",
        {
            "mode": "both",
            "model": {"path": "tiny"},
            "algorithm": {"name": "mix", "repeat_times": 8, "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
            # The same run as tests/workers/rft/test_learning.py (no chat template: half the tokens).
            "explorer": {"batch_size": 8, "max_new_tokens": 4, "use_chat_template": False, "eval_interval": 10},
            "trainer": {"lr": 1e-3, "total_steps": 1000, "micro_batch_size": 64, "save_interval": 50},
            "buffer": {"taskset": "addition", "expert_taskset": "addition", "eval_taskset": "addition-eval"},
        },
    ),
    "smollm2-grpo": Preset(
        "SmolLM2 GRPO",
        "SmolLM2-135M-Instruct with GRPO and a low-variance KL to the reference, evaluated on held-out problems.",
        {
            "mode": "both",
            "model": {"path": "smollm2-135m"},
            "algorithm": {"name": "grpo", "repeat_times": 8, "kl": {"fn": "low_var_kl", "coef": 0.001}},
            "explorer": {
                "batch_size": 16,
                "temperature": 1.0,
                "max_new_tokens": 64,
                "reward_fn": "exact_match",
                "system_prompt": "Solve the problem. Reply with the final number only.",
                "eval_interval": 10,
            },
            "trainer": {"lr": 1e-6, "total_steps": 200, "micro_batch_size": 8, "save_interval": 50},
            "buffer": {"taskset": "arithmetic", "eval_taskset": "arithmetic-eval"},
        },
    ),
    "sft": Preset(
        "SFT",
        "Supervised fine-tuning of SmolLM2 on the expert answers of a taskset, or on expert data a curator "
        "imported (buffer.expert_dataset); no rollouts.",
        {
            "mode": "train",
            "model": {"path": "smollm2-135m"},
            "algorithm": {"name": "sft"},
            "trainer": {"lr": 1e-5, "total_steps": 100, "batch_size": 32, "micro_batch_size": 8, "save_interval": 50},
            "buffer": {"taskset": "arithmetic", "expert_taskset": "arithmetic"},
        },
    ),
    "dpo-human": Preset(
        "DPO from human preferences",
        "Direct preference optimisation of SmolLM2 on what annotators prefer: the run writes answers to "
        "arithmetic problems, annotators compare two answers to a problem on Annotate (c, then A or B is "
        "better), and each verdict is a pair the trainer trains on once (algorithm.dpo.max_pair_uses). Until "
        "the first comes, and between comparisons once each has trained, the trainer waits, and the run page "
        "says so. To train on comparisons made on other runs instead, set mode train and list "
        "those runs in feedback.source_runs; on imported preference pairs, name them in buffer.expert_dataset.",
        {
            # Mode both: annotators judge this run's own answers while it trains. In mode train it
            # would have no pairs until a source run or dataset is named (config_rules.data_issues).
            "mode": "both",
            "model": {"path": "smollm2-135m"},
            "algorithm": {"name": "dpo", "repeat_times": 4, "dpo": {"beta": 0.1}},
            "explorer": {
                "batch_size": 4,  # 4 problems x 4 answers a step: a pair to compare for each problem
                "max_new_tokens": 64,
                "system_prompt": "Solve the problem. Reply with the final number only.",
            },
            "trainer": {"lr": 5e-7, "total_steps": 100, "batch_size": 16, "micro_batch_size": 4, "save_interval": 50},
            "buffer": {"taskset": "arithmetic"},
        },
    ),
}
DEFAULT_PRESET = "quick-demo"


def preset_config(name: str) -> dict:
    """The full config of a preset: its keys over the schema's defaults."""
    from workers.rft.config import RunConfig

    return RunConfig.from_dict(PRESETS[name].config).to_dict()


def on_taskset(config: dict, taskset) -> dict:
    """`config` on `taskset`, with its default workflow and reward; the preset's held-out taskset
    (another kind of task) is left out, with the evals that read it."""
    buffer = {**config["buffer"], "taskset": taskset.name, "eval_taskset": None}
    if buffer.get("expert_taskset"):
        buffer["expert_taskset"] = taskset.name
    explorer = {**config["explorer"], "workflow": taskset.default_workflow, "reward_fn": taskset.default_reward_fn,
                "eval_interval": 0}
    return {**config, "buffer": buffer, "explorer": explorer}
