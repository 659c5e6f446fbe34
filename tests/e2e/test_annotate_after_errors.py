"""Annotation after an error, in Chromium against the real ASGI server (issue #42 finding 1; the
database side of it, and of issue #41 findings 6 and 7, runs on Postgres and SQLite in
tests/contract/test_feedback_contract.py).

After "the server answered 500" the panel the annotator had used stayed open with its
choice selected, so the digit and Enter typed next for a rating saved a flag instead. Here the
server's answer to a flag is made a 500 page (Playwright's route, as Django's error page reads),
then "4", Enter must rate. And comparing a pair again says what it replaced (#41.6)."""
import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from tests.support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FLAG_URL = "**/annotate/api/experience/*/flag/"


def shown(page, item):
    expect(page.locator(f'#annotate[data-experience="{item.pk}"]')).to_be_attached()


def test_after_a_server_error_the_keys_typed_next_rate_and_a_pair_judged_again_says_so(
    page, login, researcher, page_errors
):
    run = Run.objects.create(name="errors", owner=researcher, status=Run.Status.RUNNING, config={})
    taskset = Taskset.objects.create(name="capitals")
    task = Task.objects.create(taskset=taskset, index=0, prompt="Capital of France?", answer="Paris")
    other_task = Task.objects.create(taskset=taskset, index=1, prompt="Capital of Spain?", answer="Madrid")
    # Newest first: `first`, `second` (one prompt: they compare), then `last`, which keeps the page open.
    first, second, last = (
        Experience.objects.create(
            run=run, task=task, explorer_step=step, rollout_index=step, group_id=f"g{task.pk}",
            prompt_text=task.prompt, response_text=text, prompt_ids=[1], response_ids=[2], action_mask=[1],
            reward=0.0, model_version=1,
        )
        for step, task, text in ((2, task, "Paris."), (1, task, "Lyon."), (0, other_task, "Madrid."))
    )
    annotator = create_user("errors", "pw-for-tests-123", roles=(ANNOTATOR,))
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    shown(page, first)

    error_page = {"status": 500, "content_type": "text/html", "body": "<h1>Server Error (500)</h1>"}
    page.route(FLAG_URL, lambda route: route.fulfill(**error_page))
    for key in ("f", "1", "Enter"):
        page.keyboard.press(key)
    expect(page.locator("#notice")).to_have_text("the server answered 500")
    page.unroute(FLAG_URL)
    # The flag panel is closed and nothing is chosen: the rating panel is in front, as on a new item.
    expect(page.locator('[data-panel="rate"]')).to_have_class("card panel active")
    expect(page.locator(".choice.selected")).to_have_count(0)
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    shown(page, second)
    rating = wait_for(lambda: Feedback.objects.filter(user=annotator).first(), 10, "the rating")
    assert (rating.kind, rating.label, rating.experience_id) == ("rating", "4", first.pk)
    assert Experience.objects.get(pk=first.pk).status == "ready"  # no flag reached the server

    # `second` against `first`: B is better. Then reopened from the history, the same pair again.
    for key in ("c", "2", "Enter"):
        page.keyboard.press(key)
    shown(page, last)
    pair = Feedback.objects.get(kind="preference")
    assert (pair.experience_id, pair.other_id, pair.label) == (first.pk, second.pk, "b_better")
    page.keyboard.press("h")
    page.locator(f'#history-list .history-open[data-item="{second.pk}"]').click()
    shown(page, second)
    for key in ("c", "1", "Enter"):
        page.keyboard.press(key)
    expect(page.locator("#notice")).to_have_text(
        f"Saved your comparison of experience {second.pk}. It replaces your earlier comparison of experiences "
        f"{first.pk} and {second.pk} ({first.pk} was better)."
    )
    pair = Feedback.objects.get(kind="preference")
    assert (pair.experience_id, pair.other_id, pair.label) == (second.pk, first.pk, "a_better")
    assert page_errors == []
