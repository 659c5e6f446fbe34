"""What a duty's engine does reaches the run page as it changes: supervision sends each change on the
run's live channel, with the step's metrics, not only on the duty's heartbeat (every 10 s, read by a
poll every 10 s: on the full stack the duty line stood 6 s behind the step cards on median, 14 s at
worst). The page's side: tests/e2e/test_run_page_tools.py."""
import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from apps.runs import services, supervision
from apps.runs.consumers import run_group
from apps.runs.live import publisher
from apps.runs.models import Run
from tests.support import make_taskset

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
STEPS = 3


async def listen(run_id: int, serve) -> list[dict]:
    """The updates sent on the run's live channel while `serve` (sync) runs, in order."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(run_group(run_id), channel)
    await asyncio.to_thread(serve)
    updates = []
    while True:
        try:
            message = await asyncio.wait_for(layer.receive(channel), timeout=2)
        except asyncio.TimeoutError:
            return updates
        updates += message["payload"]["updates"]


def test_each_change_of_what_a_duty_does_goes_out_with_its_step(researcher, settings):
    settings.RFTWEB_HEARTBEAT_INTERVAL = 600  # no beat while it serves: whatever is heard, the live channel said
    make_taskset()
    config = services.validate_config({
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "micro_batch_size": 4, "total_steps": STEPS, "save_interval": 100},
        "buffer": {"taskset": "arith"},
    }).to_dict()
    run = Run.objects.create(name="told", owner=researcher, config=config, status=Run.Status.STARTING)

    def serve():
        assert supervision.serve(run.pk, "loop") == "completed"
        publisher.flush()

    updates = async_to_sync(listen)(run.pk, serve)
    said = [(i, part["what"]) for i, update in enumerate(updates) if update["type"] == "activity"
            for part in update["doing"] if update["duty"] == "loop"]
    trained = {update["step"]: i for i, update in enumerate(updates)
               if update["type"] == "metrics" and update["role"] == "trainer"}
    assert sorted(trained) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        # Said as the step began: before its metrics, and after the step before's.
        told = [i for i, what in said if what == f"training step {step}"]
        assert told and trained.get(step - 1, -1) < told[0] < trained[step], (step, said)
        assert any(what.startswith(f"rolling out step {step} with v") for _, what in said)
