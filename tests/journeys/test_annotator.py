"""An annotator judges a run while it trains, by keyboard in a real browser, and the run trains on it.

The full stack: Postgres, Redis, the real ASGI server and a real Celery worker running a MIX run
(GRPO on rated rollouts plus SFT on expert answers, `feedback.rated_only`) on the tiny model. The
annotator opens the queue at 1366x768 and, with the keyboard only, rates one answer, corrects
another (typing the reference answer the page shows), compares a third with another answer to the
same prompt and flags a fourth. What they and the researcher then check:

- the run trains on with no error (a human edit once killed the run in the trainer: its logprobs
  were stored as [] where "none" is None) until the researcher stops it;
- it trained on the edit (the human_edit row was used by trainer steps, whose metrics count expert
  experiences) and on the rating (the rated rollout was consumed);
- the flagged rollout was never trained on;
- the preference is stored as a pair, and a DPO run on this run's feedback (`feedback.source_runs`)
  trains on it.

It prints the seconds per annotated item by keyboard on the training run (`pytest -s`).
"""
import re
import time
from dataclasses import replace

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.feedback.models import Feedback, PairUse
from apps.runs.models import MetricPoint, Run
from apps.runs.services import launch_run, stop_run
from apps.tasksets.services import BUILTIN_TASKSETS, create_generated_taskset
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1500)]

# More steps than the test waits for: it stops the run once the judgements have trained. With 40,
# and the run to finish, one CI run on a loaded machine had the run done before the annotator was.
STEPS = 100_000
TASKS = 8  # one expert answer a task: every trainer step takes them all, so a new edit is taken at the next
CONFIG = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "mix", "repeat_times": 4, "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
    "explorer": {"batch_size": 4, "max_new_tokens": 6, "use_chat_template": False},
    "trainer": {"lr": 1e-3, "total_steps": STEPS, "micro_batch_size": 32},
    "buffer": {"taskset": "journey-sums", "expert_taskset": "journey-sums"},
    # Only what the annotator rated trains as RL (their rating weighted into the reward), so what
    # they flag is never sampled whatever the timing; expert answers and edits train every step.
    "feedback": {
        "reward_mode": "weight", "rated_only": True, "rubric": "5: the right sum and nothing else. 1: a wrong sum."
    },
}
RUN_DEADLINE_S = 900  # a loaded 2-core machine: seconds a step
ITEM = re.compile(r"/annotate/experience/(\d+)/(\?[^#]*)?$")  # the page's queue in its query (annotate.js)


def shown_item(page, previous: int | None = None) -> int:
    """The item on screen once it is not `previous` (items are swapped in place, with no reload)."""
    page.wait_for_url(ITEM)
    expect(page.locator("#live")).to_have_text("live")
    if previous is not None:
        expect(page.locator("#annotate")).not_to_have_attribute("data-experience", str(previous))
    return int(page.locator("#annotate").get_attribute("data-experience"))


def test_an_annotator_judges_by_keyboard_while_the_run_trains_and_the_run_trains_on_it(
    page, login, researcher, annotator, celery_worker_factory, page_errors
):
    sums = next(spec for spec in BUILTIN_TASKSETS if spec.name == "addition")
    create_generated_taskset(replace(sums, name="journey-sums", n=TASKS, split=None))
    run = launch_run(researcher, "judged while training", CONFIG)
    worker = celery_worker_factory()
    # Two explorer steps' rollouts: every prompt has answers to compare.
    wait_for(
        lambda: Experience.objects.filter(run=run, source="rollout").count() >= 2 * TASKS * 4 // 2, 600, "rollouts"
    )

    page.set_viewport_size({"width": 1366, "height": 768})
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    seconds = []

    def submit(key="Enter"):
        """Submit with `key`; the time from the item on screen to the next one on screen."""
        current = int(page.locator("#annotate").get_attribute("data-experience"))
        page.keyboard.press(key)
        following = shown_item(page, current)
        seconds.append(time.perf_counter() - started)
        return following

    # Rate: 4 on the labelled scale.
    rated = shown_item(page)
    started = time.perf_counter()
    expect(page.locator("#rubric")).to_have_text(CONFIG["feedback"]["rubric"])
    page.keyboard.press("4")
    item = submit()

    # Edit: the response becomes the editor; the annotator types the reference answer shown beside it.
    while (answer := page.locator("#answer").inner_text()) == page.locator("#response").inner_text():
        item = submit("s")  # the model got it right: nothing to correct here
    edited, started = item, time.perf_counter()
    page.keyboard.press("e")
    expect(page.locator("#edit-text")).to_be_focused()
    page.keyboard.press("Control+a")
    page.keyboard.type(answer)
    item = submit("Control+Enter")
    edit_saved_at = timezone.now()

    # Compare: c shows B, another answer to the same prompt; 1 is "A is better".
    while not page.locator('[data-panel="compare"]').count():
        item = submit("s")  # every other answer to this prompt is the same: nothing to compare
    compared, started = item, time.perf_counter()
    page.keyboard.press("c")
    expect(page.locator("#other")).to_be_visible()
    page.keyboard.press("1")
    item = submit()

    # Flag: f, then 3 is "garbled".
    flagged, started = item, time.perf_counter()
    page.keyboard.press("f")
    page.keyboard.press("3")
    submit()
    print(f"\nseconds per annotated item by keyboard on a training run: {sum(seconds) / len(seconds):.2f} "
          f"over {len(seconds)} submissions ({', '.join(f'{s:.2f}' for s in seconds)})")

    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING, worker.log_path.read_text()[-3000:]
    # Trainer steps after the last judgement (each takes the edit as expert data and the rated
    # rollout, rated_only), then the researcher stops the run.
    done_at = run.trainer_step
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= done_at + 3, RUN_DEADLINE_S, "three trainer steps")
    stop_run(run)
    wait_for(lambda: Run.objects.get(pk=run.pk).is_finished, RUN_DEADLINE_S, "the run to stop")
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.STOPPED, ""), worker.log_path.read_text()[-3000:]

    # The edit trained as expert data, in trainer steps after it was saved.
    edit = Experience.objects.get(parent_id=edited, source="human_edit")
    assert (edit.response_text, edit.logprobs, edit.status) == (answer, None, "ready")
    assert edit.use_count > 0
    later_steps = MetricPoint.objects.filter(run=run, role="trainer", time__gt=edit_saved_at)
    assert later_steps.exists() and all(p.values.get("expert_experiences", 0) > 0 for p in later_steps)
    assert not any("skipped" in p.values for p in later_steps)

    # The rating: in the rollout's reward components, and the rollout was trained on.
    rating = Feedback.objects.get(user=annotator, kind="rating")
    assert (rating.experience_id, rating.label, rating.value) == (rated, "4", 0.75)
    rated_row = Experience.objects.get(pk=rated)
    assert rated_row.reward_components["human"] == 0.75
    assert (rated_row.status, rated_row.use_count) == ("consumed", 1)

    # The flagged rollout was never trained on.
    flagged_row = Experience.objects.get(pk=flagged)
    assert (flagged_row.status, flagged_row.use_count, flagged_row.consumed_at) == ("rejected", 0, None)
    assert Feedback.objects.get(user=annotator, kind="flag").label == "garbled"

    # The comparison is a DPO pair (A preferred), and a DPO run on this run's feedback trains on it.
    pair = Feedback.objects.get(user=annotator, kind="preference")
    assert (pair.experience_id, pair.value, pair.label) == (compared, 1.0, "a_better")
    a_row, b_row = Experience.objects.get(pk=compared), Experience.objects.get(pk=pair.other_id)
    assert b_row.task_id == a_row.task_id and b_row.response_text != a_row.response_text
    chosen_uses = a_row.use_count
    dpo = launch_run(researcher, "DPO on the annotator's pairs", {
        "mode": "train", "model": {"path": "tiny"}, "algorithm": {"name": "dpo"},
        "explorer": {"use_chat_template": False},  # the pairs' prompts as the annotated run formatted them
        "trainer": {"lr": 1e-4, "total_steps": 1, "batch_size": 4, "micro_batch_size": 4},
        "buffer": {"taskset": "journey-sums"}, "feedback": {"source_runs": [run.pk]},
    })
    wait_for(lambda: Run.objects.get(pk=dpo.pk).is_finished, 300, "the DPO run to finish")
    dpo.refresh_from_db()
    assert (dpo.status, dpo.error) == (Run.Status.COMPLETED, ""), worker.log_path.read_text()[-3000:]
    assert MetricPoint.objects.get(run=dpo, role="trainer", step=1).values["pairs"] == 1
    # The pair's use is the DPO run's (PairUse): the chosen rollout's own count is its run's.
    assert list(PairUse.objects.values_list("run", "preference", "uses")) == [(dpo.pk, pair.pk, 1)]
    assert Experience.objects.get(pk=compared).use_count == chosen_uses
    assert page_errors == []
