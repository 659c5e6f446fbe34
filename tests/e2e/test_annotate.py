"""Annotation in a real browser against the real server: an annotator rates three items with the
keyboard only, edits one and compares a pair; the rows hold what was chosen; a second
annotator's page shows live that the first took the item it is looking at; and the run page
shows the feedback."""
import re

import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

from .conftest import PASSWORD

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def experience_url(experience) -> re.Pattern:
    return re.compile(rf"/annotate/experience/{experience.pk}/$")


def sign_in(page, user, next_path):
    page.goto(next_path)
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def test_an_annotator_rates_edits_and_compares_with_the_keyboard_while_another_watches_live(
    page, login, browser, asgi_server, researcher, page_errors
):
    # Two annotators judge each item here, so the watcher and the first annotator can hold one together.
    run = Run.objects.create(
        name="annotated", owner=researcher, status=Run.Status.RUNNING, config={"feedback": {"judgements_per_item": 2}}
    )
    taskset = Taskset.objects.create(name="questions")
    tasks = [Task.objects.create(taskset=taskset, index=i, prompt=f"Question {i}?", answer=str(i)) for i in range(5)]

    def rollout(task, step, text):
        return Experience.objects.create(
            run=run, task=task, explorer_step=step, rollout_index=step, group_id=f"{step}-{task.pk}", prompt_text=task.prompt,
            response_text=text, prompt_ids=[1], response_ids=[2, 3], action_mask=[1, 1], reward=0.0, model_version=0,
        )

    # The queue hands out the newest first: three to rate, one to edit, then a pair to compare.
    pair_b = rollout(tasks[4], 0, "Paris is in Germany.")
    pair_a = rollout(tasks[4], 1, "Paris is in France.")
    to_edit = rollout(tasks[3], 2, "The sun is cold.")
    to_rate = [rollout(tasks[i], step, f"Answer {i}.") for i, step in ((2, 3), (1, 4), (0, 5))][::-1]
    first = create_user("first", PASSWORD, roles=(ANNOTATOR,))
    watcher = create_user("watcher", PASSWORD, roles=(ANNOTATOR,))

    # The watcher looks at the item the queue will hand the first annotator first.
    watcher_context = browser.new_context(base_url=asgi_server)
    watcher_page = watcher_context.new_page()
    watcher_page.on("pageerror", lambda error: page_errors.append(str(error)))
    sign_in(watcher_page, watcher, f"/annotate/experience/{to_rate[0].pk}/")
    expect(watcher_page.locator("#live")).to_have_text("live")
    expect(watcher_page.locator("#taken-notice")).to_be_hidden()

    login(first, f"/annotate/?run={run.pk}&strategy=newest")
    page.wait_for_url(experience_url(to_rate[0]))
    expect(page.locator("#live")).to_have_text("live")
    # The watcher's page learns it live, with no reload.
    expect(watcher_page.locator("#taken-notice")).to_be_visible()
    expect(watcher_page.locator("#holders")).to_have_text("first")

    # Rate three items: a digit picks the rating, Enter submits, the next item opens.
    for experience, point, following in zip(to_rate, "425", [*to_rate[1:], to_edit]):
        expect(page.locator("#response")).to_have_text(experience.response_text)
        page.keyboard.press(point)
        expect(page.locator(f'[data-panel="rate"] button[value="{point}"]')).to_have_class(re.compile(r"\bselected\b"))
        with page.expect_navigation():
            page.keyboard.press("Enter")
        page.wait_for_url(experience_url(following))
    expect(watcher_page.locator("#taken-notice")).to_be_hidden()  # judged: the item is no longer held

    # Edit: e opens the editor, Ctrl+Enter saves.
    page.keyboard.press("e")
    expect(page.locator("#edit-text")).to_be_focused()
    page.keyboard.press("Control+a")
    page.keyboard.type("The sun is hot.")
    with page.expect_navigation():
        page.keyboard.press("Control+Enter")
    page.wait_for_url(experience_url(pair_a))

    # Compare: c switches to the comparison, 1 is "A is better".
    expect(page.get_by_text("B: another response")).to_be_visible()
    page.keyboard.press("c")
    page.keyboard.press("1")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/annotate/(next|experience/\d+)/$"))

    ratings = {f.experience_id: (f.label, f.value) for f in Feedback.objects.filter(user=first, kind="rating")}
    assert ratings == {to_rate[0].pk: ("4", 0.75), to_rate[1].pk: ("2", 0.25), to_rate[2].pk: ("5", 1.0)}
    assert Feedback.objects.get(user=first, kind="edit").edited_text == "The sun is hot."
    edited = Experience.objects.get(parent=to_edit)
    assert (edited.source, edited.response_text) == ("human_edit", "The sun is hot.")
    preference = Feedback.objects.get(user=first, kind="preference")
    assert (preference.experience_id, preference.other_id, preference.value, preference.label) == (pair_a.pk, pair_b.pk, 1.0, "a_better")
    assert Feedback.objects.filter(user=watcher).count() == 0
    watcher_context.close()

    # The run page shows the feedback: counts, and the human reward (mean of 0.75, 0.25 and 1).
    researcher_context = browser.new_context(base_url=asgi_server, viewport={"width": 1400, "height": 3000})
    run_page = researcher_context.new_page()
    run_page.on("pageerror", lambda error: page_errors.append(str(error)))
    sign_in(run_page, researcher, f"/runs/{run.pk}/")
    card = run_page.locator("#human-feedback")
    expect(card.locator('[data-feedback="rated_experiences"]')).to_have_text("3")
    expect(card.locator('[data-feedback="human_reward"]')).to_have_text("0.667")
    expect(card.locator('[data-feedback="judgements"]')).to_have_text("3 · 1 · 1 · 0")
    expect(card.locator('[data-feedback="data"]')).to_have_text("1 · 1 · 0")
    expect(run_page.locator("#human-reward-chart .main-svg").first).to_be_visible()
    researcher_context.close()
    assert page_errors == []
