"""The run page open while its trainer is handed over (kill -9, the watchdog sends the duty to another
worker) and replays the steps after its checkpoint: the lost steps' points leave the charts, and
the replayed steps extend the lines again, as the page opened afresh would draw them.

Seen once: the trainer's and the held-out charts stopped growing while the explorer's went on.
The replayed points (steps at or below the line's last) were drawn inside the line, which ended
at the lost worker's last step until the replay got past it."""
import pytest
from django.utils import timezone
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect

from apps.runs.models import Checkpoint, Run
from apps.runs.store import DjangoMetricSink

from .test_dashboard import DEMO_CONFIG, EVAL_EVERY, seed_history

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOST_AT = 40  # the killed worker's last trainer step
# The x of a chart's first line as Plotly drew it: what the user sees.
DRAWN = """(id) => {
  const chart = window.rftRunPage?.board.charts.get(id);
  return chart?.drawn && chart.element.data ? chart.element.data[0].x : null;
}"""


def wait_for_drawn(page, chart_id: str, steps: list[int]) -> None:
    try:
        page.wait_for_function(f"([id, steps]) => JSON.stringify(({DRAWN})(id)) === JSON.stringify(steps)",
                               arg=[chart_id, steps], timeout=15_000)
    except PlaywrightTimeoutError:
        pytest.fail(f"{chart_id} drew steps {page.evaluate(DRAWN, chart_id)}, not {steps}")


@pytest.mark.parametrize("checkpoint", [20, 0], ids=["from its checkpoint", "from step 0, killed before one"])
def test_a_trainer_replaying_after_a_hand_over_extends_the_open_pages_charts(page, login, researcher, page_errors,
                                                                              checkpoint):
    run = Run.objects.create(name="handed over", owner=researcher, status=Run.Status.RUNNING, config=DEMO_CONFIG,
                             explorer_step=LOST_AT, trainer_step=LOST_AT, model_version=LOST_AT,
                             heartbeats={"loop": {"at": timezone.now().isoformat(), "worker": "test-worker"}})
    seed_history(run, steps=LOST_AT)
    if checkpoint:
        Checkpoint.objects.create(run=run, version=checkpoint, step=checkpoint, path=f"checkpoints/step_{checkpoint}")
    page.set_viewport_size({"width": 1280, "height": 4000})  # every chart in view, so drawn
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator("#live-dot")).to_have_text("live")
    evals = list(range(0, LOST_AT + 1, EVAL_EVERY))
    wait_for_drawn(page, "trainer/loss", list(range(1, LOST_AT + 1)))
    wait_for_drawn(page, "trainer/entropy", list(range(1, LOST_AT + 1)))
    wait_for_drawn(page, "eval/exact_match", evals)

    # The new worker loaded the checkpoint (supervision.run_engine; a single loop, whose explorer
    # goes back to the checkpoint's step too), and replays: two trainer steps so far, which log
    # only a loss. The explorer's steps after the checkpoint stand (their rollouts are stored).
    sink = DjangoMetricSink(run)
    sink.rewind(checkpoint, checkpoint, explorer_step=checkpoint)
    for step in (checkpoint + 1, checkpoint + 2):
        sink.log("trainer", step, {"loss": 0.5})
    sink.log("explorer", LOST_AT + 1, {"reward_mean": 0.7})

    wait_for_drawn(page, "trainer/loss", list(range(1, checkpoint + 3)))
    wait_for_drawn(page, "trainer/entropy", list(range(1, checkpoint + 1)))
    wait_for_drawn(page, "eval/exact_match", [step for step in evals if step <= checkpoint])
    wait_for_drawn(page, "explorer/reward_mean", list(range(1, LOST_AT + 2)))
    expect(page.locator('[data-state="trainer_step"]')).to_have_text(str(checkpoint + 2))
    expect(page.locator('[data-state="model_version"]')).to_have_text(str(checkpoint))
    expect(page.locator("#live-dot")).to_have_text("live")
    assert page_errors == []
