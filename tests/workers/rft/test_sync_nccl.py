"""synchronizer.method nccl (synchronizer.py over weight_broadcast.py, gloo here): the trainer's
versions reach every explorer bit for bit, and it answers as the trainer's model does; an
explorer behind the trainer does not hold it up, a dead explorer is named by the trainer's next
publish, and explorers join the new group a restarted trainer opens. Trainer and explorers are
threads here, each with its own group rank (tests/workers/test_explorers.py runs them as Celery
workers)."""
import threading
import time

import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.memory import InMemoryWeightGroup
from workers.rft.models import load_policy, load_tokenizer
from workers.rft.synchronizer import Synchronizer
from workers.rft.weight_manifest import WeightSyncError, model_fingerprint

CPU = torch.device("cpu")
PROMPTS = ["What is 7 + 5?", "The quick brown fox", "12+30=42\n4*5="]
GREEDY = SamplingParams(n=1, temperature=0, max_new_tokens=8)


def sync(group, **kwargs) -> Synchronizer:
    return Synchronizer("nccl", group=group, timeout_s=kwargs.pop("timeout_s", 20), verify_every=1, **kwargs)


def perturb(model, seed: int):
    """Far enough to change greedy answers (as tests/workers/rft/test_weight_broadcast.py's)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std() * 0.3)


def greedy(engine) -> list[list[int]]:
    prompts = [engine.tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]
    return [c.token_ids for group in engine.generate(prompts, GREEDY) for c in group]


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def explorer_engine(tiny_path):
    def build():
        return TransformersEngine(load_policy(tiny_path, CPU), load_tokenizer(tiny_path))
    return build


def test_every_explorer_holds_the_trainers_versions_and_one_behind_holds_nobody_up(tiny_path, explorer_engine):
    rendezvous = InMemoryWeightGroup(explorers=2)
    trainer = load_policy(tiny_path, CPU)
    sender = sync(rendezvous.side(0))
    receivers = [sync(rendezvous.side(rank)) for rank in (1, 2)]
    engines = [explorer_engine(), explorer_engine()]
    try:
        wait_until(sender.ready)
        sender.check()
        assert [r.latest_version() for r in receivers] == [-1, -1]  # nothing yet: an explorer waits
        sender.publish(trainer, 0)  # the explorers start from the trainer's weights
        wait_until(lambda: all(r.latest_version() == 0 for r in receivers))
        stale = []  # whether the explorer answered otherwise before the sync
        for version in (1, 2, 3):  # explorer 2 pulls nothing meanwhile: it is behind, busy generating
            perturb(trainer, version)
            sender.publish(trainer, version)
            wait_until(lambda v=version: receivers[0].latest_version() == v)
            answers = greedy(TransformersEngine(trainer, engines[0].tokenizer))
            stale.append(greedy(engines[0]) != answers)
            receivers[0].pull(engines[0], version)
            assert model_fingerprint(engines[0].model) == model_fingerprint(trainer)
            assert greedy(engines[0]) == answers
        assert all(stale)  # each version changed the answers: their equality after it says something
        sender.publish(trainer, 4)  # not held up by explorer 2's three versions unloaded
        wait_until(lambda: receivers[1].latest_version() == 4)
        receivers[1].pull(engines[1], 2)  # needs version 2 at least: loads the newest it holds
        assert engines[1].model_version == 4 and model_fingerprint(engines[1].model) == model_fingerprint(trainer)
        sender.check()
    finally:
        for side in (sender, *receivers):
            side.close()


@pytest.mark.slow
def test_a_dead_explorer_is_named_and_a_new_group_is_joined(tiny_path, explorer_engine):
    rendezvous = InMemoryWeightGroup(explorers=2)
    trainer = load_policy(tiny_path, CPU)
    sender = sync(rendezvous.side(0), timeout_s=3)
    live, dead = sync(rendezvous.side(1)), sync(rendezvous.side(2))
    engine = explorer_engine()
    wait_until(sender.ready)
    sender.publish(trainer, 0)
    wait_until(lambda: live.latest_version() == 0 and dead.latest_version() == 0)
    dead.close()  # its thread stops receiving: a killed explorer process
    perturb(trainer, 1)
    sender.publish(trainer, 1)
    with pytest.raises(WeightSyncError, match="rank 2"):
        wait_until(lambda: sender.check() or False, timeout=30)
    sender.close()

    # The trainer's duty restarts (its watchdog): a new group, which the live explorer and a
    # replacement for the dead one join; the first version is the trainer's current one.
    restarted = sync(rendezvous.side(0))
    replacement = sync(rendezvous.side(2))
    try:
        wait_until(restarted.ready)
        restarted.check()
        restarted.publish(trainer, 1)
        wait_until(lambda: live.latest_version() == 1 and replacement.latest_version() == 1)
        live.pull(engine, 1)
        assert engine.model_version == 1 and model_fingerprint(engine.model) == model_fingerprint(trainer)
        assert rendezvous.generation == 2
    finally:
        for side in (restarted, live, replacement):
            side.close()


def test_an_explorer_waits_for_a_group_before_joining_it(tiny_path):
    """An explorer up before its trainer finds no group, then joins it once it opens."""
    rendezvous = InMemoryWeightGroup(explorers=1)
    receiver = sync(rendezvous.side(1))
    try:
        time.sleep(1)
        assert receiver.latest_version() == -1
        sender = sync(rendezvous.side(0))
        wait_until(sender.ready)
        sender.publish(load_policy(tiny_path, CPU), 0)
        wait_until(lambda: receiver.latest_version() == 0)
        sender.close()
        assert rendezvous.address is None  # closed: no explorer joins it any more
    finally:
        receiver.close()


def test_nccl_needs_a_group():
    with pytest.raises(ValueError, match="weight group"):
        Synchronizer("nccl")


def test_threads_end_when_closed(tiny_path):
    before = threading.active_count()
    rendezvous = InMemoryWeightGroup(explorers=1)
    receiver = sync(rendezvous.side(1))
    receiver.close()
    wait_until(lambda: threading.active_count() <= before, timeout=10)
