"""trainer.activation_checkpointing in one process (issue #43: what a 1.7B model's 1,024-token
answers need on one GPU): each decoder layer keeps only its input for backward and is recomputed
there. The step is the one without it, up to summation order; the activations kept are fewer.
Under fsdp: test_fsdp.py."""
import pytest
import torch

from workers.rft.models import load_policy, load_tokenizer
from workers.rft.trainer import Trainer

from .conftest import make_config
from .test_distributed import TIMED, lone, train
from .test_fsdp import LR, saved_for_backward
from .test_trainer import rollouts


@pytest.mark.parametrize("case", ["grpo", "ppo"])  # ppo: the critic is checkpointed too
def test_a_checkpointed_step_is_the_plain_step(case, tiny_path):
    plain = lone(case, tiny_path)
    checkpointed = train(None, case, tiny_path, trainer_keys={"activation_checkpointing": True})
    for one, two in zip(plain["metrics"], checkpointed["metrics"], strict=True):
        for key in one.keys() - TIMED:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for model in ("policy", "critic") if case == "ppo" else ("policy",):
        for name, value in plain[model].items():
            # As test_fsdp.py: a checkpointed forward skips the shared-prompt cache, rounding
            # otherwise, and Adam steps by up to lr on a gradient that is rounding noise (seen
            # 2.2e-6 on 3 of 115,584 elements); the metrics above agree to 1e-5.
            torch.testing.assert_close(checkpointed[model][name], value, rtol=1e-5, atol=2e-1 * LR,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_a_checkpointed_forward_keeps_less_for_backward(tiny_path):
    tokenizer = load_tokenizer(tiny_path)
    experiences = rollouts(tokenizer, 8)
    kept = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        config = make_config(trainer={"activation_checkpointing": checkpointing}, seed=0)
        trainer = Trainer(config, load_policy(tiny_path, torch.device("cpu")), tokenizer, None)
        kept[checkpointing] = saved_for_backward(trainer, experiences)
    print(f"bytes kept for backward: {kept[False]:,} plain, {kept[True]:,} checkpointed")
    assert kept[True] < 0.5 * kept[False], kept
