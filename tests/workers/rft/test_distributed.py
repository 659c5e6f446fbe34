"""trainer.strategy 'ddp': two real ranks (processes, a gloo group on CPU) train exactly as one.

The rank functions live at module level: `launch` spawns fresh interpreters, which import them
from here by name."""
import copy
import gc
import os
import re
import socket
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from workers.rft.config import load_config
from workers.rft.distributed import RankFailure, free_port, launch, serve_store
from workers.rft.experience import PreferencePair
from workers.rft.loop import Loop
from workers.rft.memory import InMemoryBuffer, memory_stores
from workers.rft.models import load_critic, load_policy, load_reference, load_tokenizer
from workers.rft.trainer import Trainer

from .conftest import make_config
from .test_trainer import experience, rollouts, weights

CPU = torch.device("cpu")
DDP = {"strategy": "ddp", "num_processes": 2}
LR = 1e-3  # conftest.make_config's

# Micro-batch sizes that split each batch unevenly over 2 ranks (and one rank's part of MIX's
# expert data is empty), so the token-mean must weigh every micro-batch by the whole batch.
CASES = {
    "grpo": {"trainer": {"batch_size": 8, "micro_batch_size": 3}},
    "grpo_kl": {"trainer": {"batch_size": 8, "micro_batch_size": 3}, "algorithm": {"kl": {"fn": "k3", "coef": 0.1}}},
    "seq_mean": {"trainer": {"batch_size": 8, "micro_batch_size": 3},
                 "algorithm": {"loss_agg_mode": "seq-mean-token-mean"}},
    "mix": {"trainer": {"batch_size": 8, "micro_batch_size": 3}, "buffer": {"expert_taskset": "x"},
            "algorithm": {"name": "mix", "mix": {"mu": 0.5, "expert_data_ratio": 0.25}}},
    "dpo": {"trainer": {"batch_size": 5, "micro_batch_size": 4}, "algorithm": {"name": "dpo", "repeat_times": 1}},
    "ppo": {"trainer": {"batch_size": 8, "micro_batch_size": 3}, "algorithm": {"name": "ppo", "repeat_times": 1}},
    # Advantages whitened over the whole batch, across ranks; one micro-batch: the follower has none
    # and still takes part in the sums.
    "reinforce_plus_plus": {"trainer": {"batch_size": 8, "micro_batch_size": 8},
                            "algorithm": {"name": "reinforce_plus_plus", "repeat_times": 1}},
    # The rollout engine's logprobs on some experiences only: a micro-batch without them runs the
    # policy's forward for logπ_old, one with them does not (under fsdp every rank must anyway).
    "some_logprobs": {"trainer": {"batch_size": 8, "micro_batch_size": 3}},
}


def build_trainer(case: str, tiny_path, ranks=None, strategy: dict | None = None) -> Trainer:
    """The case's trainer; a leader's (or a lone one's) buffer holds its data. `strategy`: trainer
    keys added to the case's (default: the ranks' ddp; none for a lone trainer)."""
    tokenizer = load_tokenizer(tiny_path)
    sections = CASES[case]
    strategy = strategy if strategy is not None else DDP if ranks is not None else {}
    sections = {**sections, "trainer": {**sections["trainer"], **strategy}}
    config = make_config(**sections, seed=0)
    buffer = None
    if ranks is None or ranks.is_leader:
        buffer = InMemoryBuffer()
        batch = rollouts(tokenizer, 24)  # 3 steps of 8
        if case == "mix":
            batch += [experience(tokenizer, a, 1, source="expert") for a in range(10)]
        if case == "grpo":  # numpy token arrays, as the Postgres buffer's sample returns them
            for e in batch:
                e.prompt_ids, e.response_ids = np.asarray(e.prompt_ids, "<i4"), np.asarray(e.response_ids, "<i4")
                e.action_mask = np.asarray(e.action_mask, "u1")  # (these rollouts have no logprobs)
        if case == "some_logprobs":  # each step's first micro-batch (3 of its 8 rows) has them, the others not
            for i, e in enumerate(batch):
                e.logprobs = [-2.0] * len(e.response_ids) if i % 8 < 3 else None
        buffer.write(batch)
        wrong = {e.task_id: experience(tokenizer, e.task_id // 10, 3, answer=99).response_ids for e in batch}
        buffer.add_pairs([
            PreferencePair(e.prompt_ids, e.response_ids, wrong[e.task_id]) for e in batch if e.rollout_index == 0
        ])
    torch.manual_seed(0)
    needs_reference = case in ("grpo_kl", "dpo")
    return Trainer(
        config, load_policy(tiny_path, CPU), tokenizer, buffer,
        reference=load_reference(tiny_path, CPU) if needs_reference else None,
        critic=load_critic(tiny_path, CPU) if case == "ppo" else None,
        ranks=ranks,
    )


def train(ranks, case: str, tiny_path, steps: int = 2, trainer_keys: dict | None = None) -> dict:
    """Rank function (and the lone trainer, ranks None): `steps` trainer steps; their metrics,
    the first one's gradients, the weights at the end (a follower: only those)."""
    trainer = build_trainer(case, tiny_path, ranks, trainer_keys)
    if ranks is not None and not ranks.is_leader:
        trainer.follow()
    else:
        metrics = [trainer.train_step()]
        first_grads = {f"{name}_grads": grads(m) for name, m in models(trainer).items()}
        metrics += [trainer.train_step() for _ in range(steps - 1)]
        trainer.release_ranks()
        return {"metrics": metrics, **first_grads, **{name: weights(m) for name, m in models(trainer).items()}}
    return {name: weights(m) for name, m in models(trainer).items()}


_LONE: dict[tuple[str, str], dict] = {}


def lone(case: str, tiny_path) -> dict:
    """train(None, case, tiny_path): the lone trainer's two steps that the ranks' steps are compared
    with. Deterministic (seed 0, the case's data), so computed once a process and copied for each
    test: the cases of this file, test_fsdp.py, test_micro_batches.py and
    test_activation_checkpointing.py compare with the same 8 (it was 22 runs of them)."""
    key = (case, str(tiny_path))
    if key not in _LONE:
        _LONE[key] = train(None, case, tiny_path)
    return copy.deepcopy(_LONE[key])


def models(trainer) -> dict:
    return {name: m for name, m in {"policy": trainer.policy, "critic": trainer.critic}.items() if m is not None}


def grads(model) -> dict:
    """A step's gradients, as clipped and applied (None where a parameter had none)."""
    return {name: p.grad.clone() if p.grad is not None else None for name, p in model.named_parameters()}


TIMED = {"seconds", "tokens_per_s", "idle_share", "sync_seconds"}


# Each case starts 2 ranks (~5-10 s on 2 cores): GRPO in the quick run, the rest slow.
QUICK = ("grpo",)


def test_a_served_store_owns_its_socket_and_closes_it_once():
    """The store alone holds its listening socket, and closes it once, when it goes. (A Python
    socket kept beside it closed the number when it was collected, while the store still served;
    the store closed it again when its process group went, by then another file's: the EBADF a
    resumed ddp run failed on in CI.)"""
    def open_files() -> set[int]:  # less the one listdir opened to list them
        return {int(fd) for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")}

    timeout = timedelta(seconds=5)
    serve_store("127.0.0.1", free_port(), timeout)  # torch opens files of its own the first time, for good
    gc.collect()
    open_before = open_files()
    port = free_port()
    store = serve_store("127.0.0.1", port, timeout)
    gc.collect()  # whatever else held the socket is gone now
    later, other = os.pipe()  # would take its number, had anything closed it
    try:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        client.set("key", "value")
        assert store.get("key") == b"value"  # it still serves
        del client, store
        gc.collect()
        os.fstat(later)  # the file opened meanwhile is still open
        assert open_files() == open_before | {later, other}  # and nothing leaked
        with socket.create_server(("127.0.0.1", port)):  # the port is free again
            pass
    finally:
        os.close(later)
        os.close(other)


@pytest.mark.parametrize("case", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_two_ranks_take_the_step_one_process_takes(case, tiny_path):
    alone = lone(case, tiny_path)
    leader, follower = launch(train, 2, case, tiny_path)
    for one, two in zip(alone["metrics"], leader["metrics"]):
        assert one.keys() == two.keys() - {"scatter_seconds"} and two["scatter_seconds"] >= 0  # the leader's send
        for key in one.keys() - TIMED:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for model in ("policy", "critic") if case == "ppo" else ("policy",):
        for name, grad in alone[f"{model}_grads"].items():
            if grad is None:
                assert leader[f"{model}_grads"][name] is None, f"{model} {name}"
                continue
            # Summed in another order: float rounding, 1e-7 of the largest gradient.
            torch.testing.assert_close(leader[f"{model}_grads"][name], grad, rtol=0,
                                       atol=1e-5 * grad.abs().max().item(), msg=f"{model} {name}")
        for name, value in alone[model].items():
            # Adam steps each weight by about lr * m / sqrt(v): where a gradient is rounding noise
            # (a key projection's bias: softmax ignores it, its exact gradient is 0) or its two
            # steps' gradients cancel, the noise sets the step. Seen: 3e-2 of lr (seq_mean, 2
            # steps) on single elements; tolerated: 1e-1 of lr.
            torch.testing.assert_close(leader[model][name], value, rtol=1e-5, atol=1e-1 * LR, msg=f"{model} {name}")
            assert torch.equal(follower[model][name], leader[model][name]), f"ranks differ on {model} {name}"


def around_a_checkpoint(ranks, tiny_path, path, save: bool, strategy: dict = DDP) -> list[tuple[float, float]] | None:
    """Rank function (and the lone trainer): with `save`, a step, a checkpoint at `path`, then
    two steps; else load `path` and take those two steps. (loss, grad_norm) of the two steps."""
    trainer = build_trainer("grpo", tiny_path, ranks, strategy)
    if ranks is not None and not ranks.is_leader:
        trainer.follow()
        return None
    if save:
        trainer.train_step()
        trainer.save_checkpoint(path)
    else:
        trainer.buffer.mark_used(consumed=trainer.buffer.sample(8, sources=["rollout"]))  # what step 1 took
        trainer.load_checkpoint(path)
    after = [trainer.train_step() for _ in range(2)]
    trainer.release_ranks()
    return [(m["loss"], m["grad_norm"]) for m in after]


def on_ranks(world_size: int, fn, *args):
    """fn's result on the leader of world_size ranks (1: in this process, alone)."""
    return fn(None, *args) if world_size == 1 else launch(fn, world_size, *args)[0]


@pytest.mark.slow
@pytest.mark.parametrize("saved_on, resumed_on", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(tiny_path, tmp_path, saved_on, resumed_on):
    path = tmp_path / "ckpt"
    expected = on_ranks(saved_on, around_a_checkpoint, tiny_path, path, True)
    assert (path / "model.safetensors").exists() and (path / "optimizer.pt").exists()
    resumed = on_ranks(resumed_on, around_a_checkpoint, tiny_path, path, False)
    for (loss, norm), (loss_again, norm_again) in zip(expected, resumed):
        assert loss_again == pytest.approx(loss, rel=1e-5, abs=1e-7) and norm_again == pytest.approx(norm, rel=1e-5)


def dying_follower(ranks, tiny_path, how: str):
    """Rank function: the leader steps; the follower takes the step's batch, then exits (or hangs)."""
    trainer = build_trainer("grpo", tiny_path, ranks)
    if ranks.is_leader:
        started = time.monotonic()
        try:
            trainer.train_step()
        except RankFailure as err:
            return str(err), time.monotonic() - started
        return "the step passed", None
    ranks.receive()
    if how == "hang":
        time.sleep(8)
    os._exit(0)  # a rank gone without a word: no result, no error of its own


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "hang"])
def test_a_dead_or_hung_rank_fails_the_step_naming_it(tiny_path, how):
    (message, seconds), gone = launch(dying_follower, 2, tiny_path, how, timeout_s=3)
    assert gone is None
    assert message.startswith("rank 0 of 2: rank 1 gone (no answer within 3 s);"), message
    assert seconds < 20  # the step, at most one timeout waiting, one finding who is gone


LEARNING = """\
seed: 0
model: {path: tiny}
algorithm: {name: mix, repeat_times: 8, mix: {mu: 0.5, expert_data_ratio: 0.5}}
explorer: {batch_size: 8, max_new_tokens: 4, use_chat_template: false}
trainer: {lr: 1.0e-3, micro_batch_size: 16, total_steps: 20, strategy: ddp, num_processes: 2}
buffer:
  taskset: "arithmetic:n=1000,max_operand=9,ops=+,split=train"
  expert_taskset: "arithmetic:n=1000,max_operand=9,ops=+,split=train"
"""


@pytest.mark.slow
def test_the_headless_cli_with_two_ranks_learns_as_one_process(tmp_path, data_dir):
    (tmp_path / "ddp.yaml").write_text(LEARNING)
    done = cli("-m", "workers.rft", "run", str(tmp_path / "ddp.yaml"), "--work-dir", str(tmp_path / "ddp"),
               data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    two = [float(m[1]) for m in re.finditer(r"^trainer +step +\d+ .* sft_loss=(\S+)", done.stdout, re.M)]

    config = load_config(LEARNING.replace("strategy: ddp, num_processes: 2", "strategy: single"))
    stores = memory_stores(config)
    assert Loop(config, stores, tmp_path / "single").run() == "completed"
    one = [v for _, v in stores.metrics.series("trainer", "sft_loss")]

    print("sft_loss by step, 1 rank:", one, "2 ranks:", two)
    assert len(one) == len(two) == 20
    assert two[-1] < 0.6 * two[0]  # it learns...
    # ...as one process does: the same data (same seed), the same step up to rounding (printed
    # to 4 digits); sampling may diverge once rounding flips a token, hence 5%.
    assert all(b == pytest.approx(a, rel=0.05) for a, b in zip(one, two)), (one, two)


def cli(*args, data_dir, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, "RFTWEB_DATA_DIR": str(data_dir), **env},
    )


@pytest.mark.slow
def test_torchrun_starts_the_ranks_of_a_headless_run(tmp_path, data_dir):
    """How the ranks of several machines start (here: 2 on this one, as `--nnodes 1`)."""
    (tmp_path / "ddp.yaml").write_text(LEARNING.replace("total_steps: 20", "total_steps: 2"))
    done = cli("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "workers.rft", "run", str(tmp_path / "ddp.yaml"), "--work-dir", str(tmp_path / "run"),
               data_dir=data_dir, RFTWEB_GROUP_SECRET="the same on every machine")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"^trainer +step", done.stdout, re.M)) == 2  # rank 0 alone reports
    assert done.stdout.rstrip().endswith(f"completed: {tmp_path / 'run'}")
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors").exists()


@pytest.mark.slow
def test_several_nodes_without_torchrun_say_how_to_start_them(tmp_path, data_dir):
    (tmp_path / "nodes.yaml").write_text(LEARNING.replace("num_processes: 2", "num_processes: 2, num_nodes: 2"))
    done = cli("-m", "workers.rft", "run", str(tmp_path / "nodes.yaml"), data_dir=data_dir)
    assert done.returncode == 2
    assert "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT" in done.stderr
