"""trainer.strategy 'fsdp': two real ranks (processes, a gloo group on CPU), the models sharded
over them with FSDP2, train exactly as one process: the same loss, grad norm and weights.

The cases are test_distributed.py's: their micro-batch sizes split each batch unevenly over the
ranks (3 micro-batches over 2: 2 and 1; MIX's one expert micro-batch leaves rank 1 none), which
under fsdp would hang without the stand-in passes (Trainer._share). Rank functions live at module
level: `launch` spawns fresh interpreters, which import them from here by name."""
import re

import pytest
import torch

from workers.rft.algorithms import USUAL
from workers.rft.config import RunConfig
from workers.rft.distributed import launch
from workers.rft.loop import Loop, follow
from workers.rft.memory import memory_stores
from workers.rft.micro_batches import collate
from workers.rft.models import load_policy, load_tokenizer, read_weights
from workers.rft.trainer import Trainer

from .conftest import make_config
from .test_distributed import CASES, LEARNING, TIMED, around_a_checkpoint, build_trainer, cli, lone, on_ranks
from .test_trainer import rollouts

FSDP = {"strategy": "fsdp", "num_processes": 2}
LR = 1e-3  # conftest.make_config's


def train_sharded(ranks, case: str, tiny_path, fsdp: dict | None = None, steps: int = 2) -> dict | None:
    """Rank function: `steps` trainer steps on 2 fsdp ranks; the leader returns their metrics, the
    full weights gathered from the shards, and how many of the policy's elements it held itself."""
    trainer = build_trainer(case, tiny_path, ranks, {**FSDP, **({"fsdp": fsdp} if fsdp is not None else {})})
    if not ranks.is_leader:
        trainer.follow()
        return None
    metrics = [trainer.train_step() for _ in range(steps)]
    state = trainer.full_state(checkpoint=True)
    held = sum(p.to_local().numel() for p in trainer.policy.parameters())
    trainer.release_ranks()
    return {"metrics": metrics, "policy": state["policy"], "critic": state.get("critic"), "held": held}


def assert_same_steps(alone: dict, sharded: dict, models=("policy",)) -> None:
    for one, two in zip(alone["metrics"], sharded["metrics"], strict=True):
        assert one.keys() == two.keys() - {"scatter_seconds"} and two["scatter_seconds"] >= 0  # the leader's send
        for key in one.keys() - TIMED:
            if key == "dpo_acc" and abs(one["dpo_margin"]) < 1e-6:
                # The share of pairs with a margin above 0: on the first step the policy is the
                # reference, every margin is 0 up to rounding, and rounding decides (seen 0.2
                # against 0.0 on an AVX-512 CPU, margins of -1.9e-8).
                continue
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for model in models:
        for name, value in alone[model].items():
            # As test_distributed.py: where a gradient is rounding noise (or two steps' cancel),
            # Adam steps by up to lr on that noise. Under fsdp a micro-batch's forward skips the
            # shared-prompt cache, rounding otherwise: seen 1.004e-1 of lr on 1 element of 36,864
            # (seq_mean); tolerated 2e-1 of lr.
            torch.testing.assert_close(sharded[model][name], value, rtol=1e-5, atol=2e-1 * LR,
                                       msg=lambda m, model=model, name=name: f"{model} {name}: {m}")


# Each case starts 2 ranks (~6 s on 2 cores): all slow (test_distributed.py's GRPO case is the
# quick run's two-rank check).
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_two_sharded_ranks_take_the_step_one_process_takes(case, tiny_path):
    alone = lone(case, tiny_path)
    leader, follower = launch(train_sharded, 2, case, tiny_path)
    assert follower is None
    assert_same_steps(alone, leader, ("policy", "critic") if case == "ppo" else ("policy",))
    total = sum(p.numel() for p in alone["policy"].values())
    assert leader["held"] <= 0.51 * total  # the leader held half of the policy, not a replica


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [
    {"reshard_after_forward": False},
    pytest.param({"activation_checkpointing": True}, id="activation_checkpointing"),
], ids=lambda f: next(iter(f)))
def test_each_fsdp_setting_keeps_the_step_exact(fsdp, tiny_path):
    alone = lone("grpo", tiny_path)
    leader, _ = launch(train_sharded, 2, "grpo", tiny_path, fsdp)
    assert_same_steps(alone, leader)


def saved_for_backward(trainer: Trainer, experiences) -> int:
    """Bytes the autograd graph of one micro-batch's loss keeps for backward."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    mb = collate(experiences, trainer.tokenizer.pad_token_id, torch.device("cpu"))
    mb.prompt_rows = mb.row_prompt = None  # as Trainer._micro_batches has it under fsdp
    trainer._prepare([(USUAL, [mb])])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer._loss(mb, USUAL)
    return sum(saved)


@pytest.mark.slow
def test_activation_checkpointing_keeps_less_for_backward(tiny_path):
    """The activations one micro-batch's forward keeps for its backward, on the leader."""
    (plain, checkpointed), _ = launch(checkpointing_memory, 2, tiny_path)
    print(f"bytes kept for backward: {plain} without activation checkpointing, {checkpointed} with")
    assert checkpointed < 0.5 * plain, (plain, checkpointed)


def checkpointing_memory(ranks, tiny_path) -> tuple[int, int]:
    """Rank function: every rank runs the same forwards (as FSDP needs) and measures its own;
    bytes saved for backward without and with activation checkpointing."""
    tokenizer = load_tokenizer(tiny_path)
    experiences = rollouts(tokenizer, 8)
    measured = []
    for checkpointing in (False, True):
        trainer = {"lr": LR, **FSDP, "activation_checkpointing": checkpointing}
        torch.manual_seed(0)
        model = Trainer(make_config(trainer=trainer, seed=0), load_policy(tiny_path, torch.device("cpu")), tokenizer,
                        None, ranks=ranks)
        measured.append(saved_for_backward(model, experiences))
    return tuple(measured)


@pytest.mark.slow
@pytest.mark.parametrize("saved_on, resumed_on", [("fsdp", "single"), ("single", "fsdp"), ("fsdp", "fsdp")])
def test_a_sharded_checkpoint_resumes_exactly(tiny_path, tmp_path, saved_on, resumed_on):
    """Full weights and optimizer state: the next steps' loss and grad norm as without the stop,
    on 2 fsdp ranks or 1 process."""
    path = tmp_path / "ckpt"
    expected = on_ranks(1 if saved_on == "single" else 2, around_a_checkpoint, tiny_path, path, True, FSDP)
    assert (path / "model.safetensors").exists() and (path / "optimizer.pt").exists()
    resumed = on_ranks(1 if resumed_on == "single" else 2, around_a_checkpoint, tiny_path, path, False, FSDP)
    for (loss, norm), (loss_again, norm_again) in zip(expected, resumed, strict=True):
        assert loss_again == pytest.approx(loss, rel=1e-5, abs=1e-7) and norm_again == pytest.approx(norm, rel=1e-5)


LOOP = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 4},
    "explorer": {"batch_size": 2, "max_new_tokens": 4, "use_chat_template": False},
    "trainer": {"lr": 1e-3, "total_steps": 1, "micro_batch_size": 4, **FSDP},
    "buffer": {"taskset": "arithmetic:n=40,max_operand=9,ops=+"},
}


def explorer_after_sync(ranks, data: dict, work_dir) -> dict | None:
    """Rank function: an explorer step, a trainer step, the explorer pulling its version; the
    leader returns the explorer's weights and the trainer's full ones."""
    config = RunConfig.from_dict(data)
    if not ranks.is_leader:
        follow(config, ranks)
        return None
    with Loop(config, memory_stores(config), work_dir, ranks=ranks) as loop:
        loop.explore()
        loop.train()
        loop.explore()  # pulls version 1
        return {
            "version": loop.explorer.engine.model_version,
            "explorer": {n: t.clone() for n, t in loop.explorer.engine.model.state_dict().items()},
            "trainer": loop.trainer.full_state()["policy"],
        }


@pytest.mark.slow
@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_the_explorer_gets_the_full_trained_weights(tmp_path, data_dir, method):
    data = {**LOOP, "synchronizer": {"method": method, "interval": 1}}
    got, _ = launch(explorer_after_sync, 2, data, tmp_path / "run")
    assert got["version"] == 1
    assert got["explorer"].keys() <= got["trainer"].keys()
    for name, tensor in got["explorer"].items():
        assert tensor.shape == got["trainer"][name].shape, name  # whole, not a shard
        torch.testing.assert_close(tensor, got["trainer"][name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_the_headless_cli_starts_sharded_ranks(tmp_path, data_dir):
    """`python -m workers.rft run` with strategy fsdp: distributed.launch starts the 2 ranks, the
    leader reports and writes the final checkpoint (full weights, loadable as one model)."""
    config = LEARNING.replace("total_steps: 20, strategy: ddp", "total_steps: 3, strategy: fsdp")
    assert "strategy: fsdp" in config
    (tmp_path / "fsdp.yaml").write_text(config)
    done = cli("-m", "workers.rft", "run", str(tmp_path / "fsdp.yaml"), "--work-dir", str(tmp_path / "run"),
               data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"^trainer +step", done.stdout, re.M)) == 3
    saved = read_weights(tmp_path / "run" / "checkpoints" / "step_3")
    model = load_policy(tmp_path / "run" / "checkpoints" / "step_3", torch.device("cpu"))
    assert all(saved[name].shape == p.shape for name, p in model.named_parameters() if name in saved)
