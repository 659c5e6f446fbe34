"""Micro-batches sized by tokens (trainer.micro_batch_tokens, issue #43): answers of varied length
go many to a micro-batch when short and few when long, and the step is the one by rows."""
import pytest
import torch

from workers.rft.experience import Experience
from workers.rft.micro_batches import chunks, collate, pack
from workers.rft.models import load_tokenizer

from .test_distributed import TIMED, train
from .test_fsdp import LR
from .test_trainer import rollouts


def row(prompt: int, response: int) -> Experience:
    return Experience(task_id=None, group_id="g", rollout_index=0, prompt_ids=[1] * prompt,
                      response_ids=[2] * response, action_mask=[1] * response)


def padded_tokens(rows: list[Experience]) -> int:
    return collate(rows, 0, torch.device("cpu")).input_ids.numel()  # as the trainer pads them


def test_rows_go_together_up_to_the_token_budget_in_their_order():
    rows = [row(10, 6)] * 6 + [row(10, 1000), row(12, 40), row(10, 2000)] + [row(10, 6)] * 3
    packed = pack(rows, most_rows=8, most_tokens=1024)
    assert [len(mb) for mb in packed] == [6, 1, 1, 1, 3]  # 8 short rows would be 128 tokens; 6 then end the run
    assert [r for mb in packed for r in mb] == rows  # every row once, in order (a group stays together)
    for mb in packed:
        assert len(mb) == 1 or padded_tokens(mb) <= 1024  # a row past the budget alone
    assert [len(mb) for mb in pack([row(10, 6)] * 20, most_rows=8, most_tokens=1024)] == [8, 8, 4]
    assert pack(rows, 4) == chunks(rows, 4)  # without a budget: by rows, as before
    # Padding counts: a short answer after a long one is padded to the long one's width.
    assert [len(mb) for mb in pack([row(10, 90), row(10, 6), row(10, 6)], most_rows=8, most_tokens=200)] == [2, 1]


@pytest.mark.parametrize("case", ["grpo", "mix"])
def test_a_step_by_tokens_is_the_step_by_rows(case, tiny_path):
    """The grpo case's 8 rows by 3 (3 + 3 + 2) against a budget that fits 2 of them a micro-batch;
    mix adds its expert part."""
    batch = rollouts(load_tokenizer(tiny_path), 8)
    assert [len(mb) for mb in pack(batch, 8, 32)] == [2, 2, 2, 2] != [len(mb) for mb in chunks(batch, 3)]
    by_rows = train(None, case, tiny_path)
    by_tokens = train(None, case, tiny_path, trainer_keys={"micro_batch_size": 8, "micro_batch_tokens": 32})
    for one, two in zip(by_rows["metrics"], by_tokens["metrics"], strict=True):
        for key in one.keys() - TIMED:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for name, value in by_rows["policy"].items():
        torch.testing.assert_close(by_tokens["policy"][name], value, rtol=1e-5, atol=2e-1 * LR,
                                   msg=lambda m, name=name: f"{name}: {m}")
