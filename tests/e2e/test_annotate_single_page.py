"""Annotation as a single page, in Chromium against the real server (issue #28): keys typed while
the next item loads are applied to it (three ratings typed with no waiting: 3 of 3 saved, each on
its own item); `u` undoes the last judgement and puts its item back; the history panel lists what
this person judged and reopens an item; a judgement already trained on says so when undone; an
edit that contradicts the reference answer asks once, and Enter saves it. The history drawer
takes a column of its own, and a notice goes with the next judgement saved.
RFTWEB_SHOTS=<dir> keeps screenshots at 1366x768."""
import os
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import MetricPoint, Run
from apps.tasksets.models import Task, Taskset
from tests.support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def shot(page, name):
    if os.environ.get("RFTWEB_SHOTS"):
        page.screenshot(path=Path(os.environ["RFTWEB_SHOTS"]) / f"{name}.png")


def shown(page, item):
    expect(page.locator(f'#annotate[data-experience="{item.pk}"]')).to_be_attached()


def test_keys_typed_ahead_are_applied_to_the_next_items_and_undo_and_history_work(
    page, login, researcher, page_errors
):
    run = Run.objects.create(name="single page", owner=researcher, status=Run.Status.RUNNING,
                             config={"feedback": {"reward_mode": "weight"}})  # ratings are rewards
    taskset = Taskset.objects.create(name="sums")
    tasks = [Task.objects.create(taskset=taskset, index=i, prompt=f"What is {i} + 9?", answer=str(i + 9))
             for i in range(5)]
    # Newest first: items[0] is shown first.
    items = [
        Experience.objects.create(
            run=run, task=task, explorer_step=10 - i, rollout_index=0, group_id=f"g{i}", prompt_text=task.prompt,
            response_text=f"{i} + 9 = {i + 8}", prompt_ids=[1], response_ids=[2], action_mask=[1], reward=0.0,
            model_version=1,
        )
        for i, task in enumerate(tasks)
    ]
    annotator = create_user("fast", "pw-for-tests-123", roles=(ANNOTATOR,))
    page.set_viewport_size({"width": 1366, "height": 768})
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    shown(page, items[0])
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#session-count")).to_have_text("0 judged this session")
    shot(page, "single-page-rate")

    # Three ratings typed with no wait: each digit lands on the item shown after the previous Enter.
    for point in "425":
        page.keyboard.press(point)
        page.keyboard.press("Enter")
    shown(page, items[3])
    wait_for(lambda: Feedback.objects.filter(user=annotator).count() == 3, 10, "three ratings")
    ratings = dict(Feedback.objects.filter(user=annotator).values_list("experience_id", "label"))
    assert ratings == {items[0].pk: "4", items[1].pk: "2", items[2].pk: "5"}
    expect(page.locator("#session-count")).to_have_text("3 judged this session")

    # u undoes the last rating: its item comes back, the count goes down.
    page.keyboard.press("u")
    shown(page, items[2])
    expect(page.locator("#notice")).to_have_text(f"Undid your judgement of experience {items[2].pk} (rated 5).")
    expect(page.locator("#session-count")).to_have_text("2 judged this session")
    assert not Feedback.objects.filter(experience=items[2]).exists()
    assert page.url.endswith(f"/annotate/experience/{items[2].pk}/?run={run.pk}&strategy=newest")  # its queue

    # The history panel: newest first, and an entry reopens its item, saying what was said of it.
    page.keyboard.press("h")
    entries = page.locator("#history-list .history-open")
    expect(entries).to_have_count(2)
    expect(entries.first).to_contain_text(f"#{items[1].pk} rated 2")
    shot(page, "single-page-history")
    # The open drawer has its own column: it covered the Rate/Compare/Flag panels (issue #42, 12).
    drawer, controls = page.locator("#history").bounding_box(), page.locator(".controls").bounding_box()
    assert controls["x"] + controls["width"] <= drawer["x"], (controls, drawer)
    entries.first.click()
    shown(page, items[1])
    expect(page.locator("#mine")).to_contain_text("You rated 2 this item")
    page.keyboard.press("h")  # closes the panel
    expect(page.locator("#history")).to_be_hidden()
    page.keyboard.press("3")  # judging again replaces the rating
    page.keyboard.press("Enter")
    wait_for(lambda: Feedback.objects.get(experience=items[1]).label == "3", 10, "the changed rating")

    # A rating a trainer step already used: undo says it removes it from future training only.
    Experience.objects.filter(pk=items[1].pk).update(status="consumed", consumed_at=timezone.now(), use_count=1)
    MetricPoint.objects.create(run=run, role="trainer", step=3, values={"loss": 0.5})
    page.keyboard.press("u")
    expect(page.locator("#notice")).to_have_text(
        f"Undid your judgement of experience {items[1].pk} (rated 3). "
        "It was already trained on at step 3: undo removes it from future training only."
    )
    shown(page, items[1])

    # An edit that contradicts the reference answer asks once; Enter saves it anyway.
    page.keyboard.press("e")
    page.keyboard.press("Control+a")
    page.keyboard.type("7")
    page.keyboard.press("Control+Enter")
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-question")).to_have_text(
        "The reference answer is 10; your edit's answer differs. Save anyway?"
    )
    shot(page, "single-page-confirm")
    # Any other key answers no and does what it does: "f 3 Enter", meant to flag instead, saved
    # the edit (f and 3 were ignored and Enter said yes).
    page.keyboard.press("f")
    expect(page.locator("#confirm")).to_be_hidden()
    page.keyboard.press("Enter")  # no flag reason chosen yet: nothing
    assert not Feedback.objects.filter(kind="edit").exists()
    page.locator("#edit-text").focus()
    page.keyboard.press("Control+Enter")
    expect(page.locator("#confirm")).to_be_visible()
    page.keyboard.press("Enter")
    wait_for(lambda: Feedback.objects.filter(kind="edit").exists(), 10, "the confirmed edit")
    assert Experience.objects.get(parent=items[1]).response_text == "7"
    expect(page.locator("#annotate")).not_to_have_attribute("data-experience", str(items[1].pk))
    # The undo's notice went with the next judgement saved (it stayed up for 17 items, issue #42, 12).
    expect(page.locator("#notice")).to_be_hidden()
    assert page_errors == []


def test_an_item_deleted_while_shown_gives_way_to_the_next(page, login, researcher, page_errors):
    """A curator deletes the item on screen; the annotator's rating is answered 404, and the page
    goes on to the next item saying why (it stayed on the gone item with its panels live)."""
    run = Run.objects.create(name="deleted under", owner=researcher, status=Run.Status.RUNNING, config={})
    items = [
        Experience.objects.create(run=run, explorer_step=10 - i, rollout_index=0, group_id=f"g{i}",
                                  prompt_text=f"What is {i} + 1?", response_text=str(i), prompt_ids=[1],
                                  response_ids=[2], action_mask=[1], reward=0.0, model_version=1)
        for i in range(3)
    ]
    annotator = create_user("slow", "pw-for-tests-123", roles=(ANNOTATOR,))
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    shown(page, items[0])
    Experience.objects.filter(pk=items[0].pk).delete()
    page.keyboard.press("3")
    page.keyboard.press("Enter")
    expect(page.locator("#notice")).to_have_text(f"experience {items[0].pk} does not exist: on to the next item.")
    expect(page.locator("#annotate")).not_to_have_attribute("data-experience", str(items[0].pk))
    page.keyboard.press("3")
    page.keyboard.press("Enter")
    wait_for(lambda: Feedback.objects.filter(kind="rating").count() == 1, 10, "the next item's rating")
    assert [error for error in page_errors if "404" not in error] == []


def test_a_paste_past_an_edits_limit_says_it_was_cut(page, login, researcher):
    """The browser cuts a paste at the edit box's maxlength without a word (27,000 characters kept
    20,000): the page says so."""
    run = Run.objects.create(name="long paste", owner=researcher, status=Run.Status.RUNNING, config={})
    Experience.objects.create(run=run, explorer_step=1, rollout_index=0, group_id="g", prompt_text="Write a lot.",
                              response_text="short", prompt_ids=[1], response_ids=[2], action_mask=[1], reward=0.0,
                              model_version=1)
    annotator = create_user("paster", "pw-for-tests-123", roles=(ANNOTATOR,))
    login(annotator, f"/annotate/?run={run.pk}")
    page.keyboard.press("e")
    editor = page.locator("#edit-text")
    limit = int(editor.get_attribute("maxlength"))
    page.keyboard.press("Control+a")
    editor.evaluate("""(box, text) => {
        const data = new DataTransfer();
        data.setData("text/plain", text);
        box.dispatchEvent(new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
    }""", "x" * (limit + 7000))
    expect(page.locator("#notice")).to_have_text(
        f"An edit keeps at most {limit:,} characters: the paste was cut to fit (it made {limit + 7000:,}).")
