"""Annotation in a real browser against the real server, at 1366x768: an annotator sees the prompt,
the reference answer, the rubric and the labelled scale, with Skip and the keys in view; rates
three items with the keyboard only, edits one, compares a pair and flags one; the rows hold what
was chosen; a second annotator's page shows live that the first took the item it is looking at;
and the run page shows the feedback. It prints the seconds per item by keyboard (`pytest -s`);
RFTWEB_SHOTS=<dir> keeps screenshots of the rating, edit, compare and flag states."""
import os
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import services as feedback
from apps.feedback.models import Feedback
from apps.runs import services as run_services
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

from .conftest import PASSWORD

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def experience_url(experience) -> re.Pattern:
    return re.compile(rf"/annotate/experience/{experience.pk}/(\?[^#]*)?$")  # its queue in the query (annotate.js)


def sign_in(page, user, next_path):
    page.goto(next_path)
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def in_view(page, selector) -> bool:
    """The element is wholly inside the viewport, without scrolling."""
    box = page.locator(selector).bounding_box()
    viewport = page.viewport_size
    return (
        box is not None
        and box["y"] >= 0
        and box["y"] + box["height"] <= viewport["height"]
        and box["x"] + box["width"] <= viewport["width"]
    )


def shot(page, name):
    """With RFTWEB_SHOTS=<dir>, a screenshot of what the annotator sees (to look at, not asserted)."""
    if os.environ.get("RFTWEB_SHOTS"):
        page.screenshot(path=Path(os.environ["RFTWEB_SHOTS"]) / f"{name}.png")


def test_an_annotator_rates_edits_compares_and_flags_with_the_keyboard_while_another_watches_live(
    page, login, browser, asgi_server, researcher, page_errors
):
    # Two annotators judge each item here, so the watcher and the first annotator can hold one together.
    rubric = (
        "Judge the arithmetic only: a correct number is a 5, a wrong one a 1. Ignore style.\n"
        "A right number with wrong working is a 3. An answer that hedges between numbers is a 2.\n"
        "Flag anything that is not an attempt at the question as garbled."
    )
    run = Run.objects.create(
        name="annotated", owner=researcher, status=Run.Status.RUNNING,
        config={"feedback": {"judgements_per_item": 2, "rubric": rubric}},
    )
    taskset = Taskset.objects.create(name="questions")
    tasks = [Task.objects.create(taskset=taskset, index=i, prompt=f"Question {i}?", answer=str(i)) for i in range(6)]
    # A long prompt scrolls within its box: the response and the controls stay in view.
    tasks[0].prompt = "\n".join(f"Context line {n}." for n in range(40)) + "\nQuestion 0?"
    tasks[0].save()

    def rollout(task, step, text):
        return Experience.objects.create(
            run=run, task=task, explorer_step=step, rollout_index=step, group_id=f"{step}-{task.pk}",
            prompt_text=task.prompt, response_text=text, prompt_ids=[1], response_ids=[2, 3], action_mask=[1, 1],
            reward=0.0, model_version=step,
        )

    # The queue hands out the newest first: three to rate, one to edit, a pair to compare, one to flag.
    old = rollout(tasks[4], 0, "Paris is in Spain.")  # an answer of an old model version: not the one to compare with
    to_flag = rollout(tasks[5], 1, "@@##!!")
    pair_b = rollout(tasks[4], 2, "Paris is in Germany.")
    pair_a = rollout(tasks[4], 3, "Paris is in France.")
    to_edit = rollout(tasks[3], 4, "The sun is cold.")
    to_rate = [rollout(tasks[i], step, f"Answer {i}.") for i, step in ((2, 5), (1, 6), (0, 7))][::-1]
    first = create_user("first", PASSWORD, roles=(ANNOTATOR,))
    watcher = create_user("watcher", PASSWORD, roles=(ANNOTATOR,))

    # The watcher looks at the item the queue will hand the first annotator first.
    watcher_context = browser.new_context(base_url=asgi_server)
    watcher_page = watcher_context.new_page()
    watcher_page.on("pageerror", lambda error: page_errors.append(str(error)))
    sign_in(watcher_page, watcher, f"/annotate/experience/{to_rate[0].pk}/")
    expect(watcher_page.locator("#live")).to_have_text("live")
    expect(watcher_page.locator("#taken-notice")).to_be_hidden()

    page.set_viewport_size({"width": 1366, "height": 768})  # a laptop: everything needed is in view
    login(first, f"/annotate/?run={run.pk}&strategy=newest")
    page.wait_for_url(experience_url(to_rate[0]))
    expect(page.locator("#live")).to_have_text("live")
    # The watcher's page learns it live, with no reload.
    expect(watcher_page.locator("#taken-notice")).to_be_visible()
    expect(watcher_page.locator("#holders")).to_have_text("first")
    shot(watcher_page, "taken")

    # What the annotator needs is on the page once, and the scale, Skip and the keys are in view.
    expect(page.locator("#prompt")).to_have_text(tasks[0].prompt)
    expect(page.get_by_text("Context line 7.")).to_have_count(1)
    expect(page.locator("#answer")).to_have_text("0")
    expect(page.locator("#rubric")).to_have_text(rubric)
    expect(page.locator('[data-panel="rate"] button[value="1"]')).to_have_text("1wrong")
    expect(page.locator('[data-panel="rate"] button[value="5"]')).to_have_text("5perfect")
    expect(page.locator("#edit-text")).to_be_hidden()
    for selector in ("#keys", "#skip", '[data-panel="rate"]', '[data-panel="flag"]', "#response"):
        assert in_view(page, selector), f"{selector} is not in view at 1366x768"
    shot(page, "rate")

    seconds = {}  # per judgement: the time from an item on screen to the next one on screen

    def judge(kind, keys, following, *, before_enter=None):
        started = time.perf_counter()
        for key in keys:
            page.keyboard.press(key)
        if before_enter:
            elapsed = time.perf_counter() - started
            before_enter()  # checks and screenshots: not the annotator's time
            started = time.perf_counter() - elapsed
        page.keyboard.press("Control+Enter" if kind == "edit" else "Enter")
        # The next item is swapped in place (no reload), and the address follows it.
        expect(page.locator(f'#annotate[data-experience="{following.pk}"]')).to_be_attached()
        seconds.setdefault(kind, []).append(time.perf_counter() - started)
        page.wait_for_url(experience_url(following))

    # Rate three items: a digit picks the rating, Enter submits, the next item opens.
    for experience, point, following in zip(to_rate, "425", [*to_rate[1:], to_edit]):
        expect(page.locator("#response")).to_have_text(experience.response_text)
        selected = page.locator(f'[data-panel="rate"] button[value="{point}"]')
        judge(
            "rate", [point], following,
            before_enter=lambda selected=selected: expect(selected).to_have_class(re.compile(r"\bselected\b")),
        )
    expect(watcher_page.locator("#taken-notice")).to_be_hidden()  # judged: the item is no longer held

    # Edit: e turns the response into the editor (in place), Ctrl+Enter saves.
    def editing():
        expect(page.locator("#edit-text")).to_be_focused()
        expect(page.locator("#response")).to_be_hidden()
        shot(page, "edit")

    # The edit agrees with the reference answer (3): saved at once, with no question.
    judge("edit", ["e", "Control+a", *"3: the sun is hot."], pair_a, before_enter=editing)

    # Compare: c shows B (the answer of the nearest model version), 1 is "A is better".
    expect(page.locator("#other")).to_be_hidden()

    def comparing():
        expect(page.locator("#other")).to_be_visible()
        expect(page.locator("#other")).to_contain_text("Paris is in Germany.")
        for selector in ('[data-panel="compare"]', "#other", "#skip", "#keys"):
            assert in_view(page, selector), f"{selector} is not in view at 1366x768 when comparing"
        shot(page, "compare")

    judge("compare", ["c", "1"], to_flag, before_enter=comparing)

    # Flag: f, then 3 is "garbled".
    judge("flag", ["f", "3"], old, before_enter=lambda: shot(page, "flag"))
    # The run fails while the annotator looks at an item it had trained on: the page says so
    # (no reload: they might be editing) and, as the server now refuses the item, takes its
    # choices away with the reason (they stayed, to be refused at submit); the queue then says
    # why nothing is left.
    Experience.objects.filter(pk=old.pk).update(status="consumed")
    run_services.set_status(run, Run.Status.FAILED, error="a worker died")
    expect(page.locator("#queue-note")).to_have_text("the run has failed: no new items will come")
    expect(page.locator("#refusal")).to_contain_text("already trained on and its run is failed")
    expect(page.locator('[data-panel="rate"]')).to_have_count(0)
    # Resumed, the note says so at once (it stayed on every next item until a reload), the item
    # is open again, and refused again when it fails.
    run_services.set_status(run, Run.Status.QUEUED)
    expect(page.locator("#queue-note")).to_have_text("the run is queued again: new items will come")
    expect(page.locator('[data-panel="rate"]')).to_be_visible()
    run_services.set_status(run, Run.Status.FAILED, error="a worker died")
    expect(page.locator("#queue-note")).to_have_text("the run has failed: no new items will come")
    expect(page.locator("#refusal")).to_contain_text("already trained on and its run is failed")
    expect(page.locator('[data-panel="rate"]')).to_have_count(0)
    page.keyboard.press("3")  # no choices left: a digit does nothing
    expect(page.locator("#annotate")).to_have_attribute("data-experience", str(old.pk))
    shot(page, "refused")
    with page.expect_navigation():
        page.keyboard.press("Enter")  # on to the next item: there is none
    expect(page.locator("h1")).to_have_text("Nothing left to judge")
    expect(page.locator("#reasons")).to_contain_text("1 trained on before the run failed: no longer open to judge")
    expect(page.locator("#reasons")).to_contain_text("7 judged by you")  # a comparison judges both answers
    shot(page, "empty")
    judged = [t for times in seconds.values() for t in times]
    print(f"\nseconds per annotated item by keyboard: {sum(judged) / len(judged):.2f} over {len(judged)} items ("
          + ", ".join(f"{kind} {sum(t) / len(t):.2f}" for kind, t in seconds.items()) + ")")

    ratings = {f.experience_id: (f.label, f.value) for f in Feedback.objects.filter(user=first, kind="rating")}
    assert ratings == {to_rate[0].pk: ("4", 0.75), to_rate[1].pk: ("2", 0.25), to_rate[2].pk: ("5", 1.0)}
    assert Feedback.objects.get(user=first, kind="edit").edited_text == "3: the sun is hot."
    edited = Experience.objects.get(parent=to_edit)
    assert (edited.source, edited.response_text) == ("human_edit", "3: the sun is hot.")
    preference = Feedback.objects.get(user=first, kind="preference")
    assert (preference.experience_id, preference.other_id, preference.value, preference.label) == (
        pair_a.pk, pair_b.pk, 1.0, "a_better"
    )
    assert Feedback.objects.get(user=first, kind="flag").experience_id == to_flag.pk
    assert Experience.objects.get(pk=to_flag.pk).status == "rejected"
    assert Feedback.objects.filter(user=watcher).count() == 0
    watcher_context.close()

    # The run page shows the feedback: two judgements per item, so the three rated once wait for
    # a second annotator and give no human reward yet.
    researcher_context = browser.new_context(base_url=asgi_server, viewport={"width": 1400, "height": 3000})
    run_page = researcher_context.new_page()
    run_page.on("pageerror", lambda error: page_errors.append(str(error)))
    sign_in(run_page, researcher, f"/runs/{run.pk}/")
    card = run_page.locator("#human-feedback")
    expect(card.locator('[data-feedback="rated_experiences"]')).to_have_text("0 (3 more waiting for 2 judgements each)")
    expect(card.locator('[data-feedback="human_reward"]')).to_have_text("—")
    expect(card.locator('[data-feedback="data"]')).to_have_text("1 · 0 · 1")  # the pair is compared once
    # The watcher rates them as the first did and agrees on the pair: the page learns it with no
    # reload, and the human reward is the mean of 0.75, 0.25 and 1.
    for row, point in zip(to_rate, ("4", "2", "5"), strict=True):
        feedback.rate(row.pk, watcher, point)
    feedback.compare(pair_a.pk, pair_b.pk, watcher, "a_better")
    expect(card.locator('[data-feedback="rated_experiences"]')).to_have_text("3")
    expect(card.locator('[data-feedback="human_reward"]')).to_have_text("0.667")
    expect(card.locator('[data-feedback="judgements"]')).to_have_text("6 · 1 · 2 · 1")
    expect(card.locator('[data-feedback="data"]')).to_have_text("1 · 1 · 1")
    expect(run_page.locator("#human-reward-chart .main-svg").first).to_be_visible()
    researcher_context.close()
    assert page_errors == []


def test_the_run_page_counts_each_flagged_rollout_once_and_says_by_what(page, login, researcher, annotator,
                                                                       page_errors):
    """A flag judgement and a curator's rejection in the admin: the tile said 1 (the flags alone)."""
    from apps.buffer import services as buffer

    run = Run.objects.create(name="flags", owner=researcher, config={}, status=Run.Status.RUNNING)
    task = Task.objects.create(taskset=Taskset.objects.create(name="flags"), index=0, prompt="Say hi.", answer="")
    rows = [Experience.objects.create(run=run, task=task, explorer_step=n, rollout_index=n, group_id=f"g{n}",
                                      prompt_text=task.prompt, response_text=f"hi {n}", prompt_ids=[1],
                                      response_ids=[2], action_mask=[1], model_version=1) for n in range(3)]
    feedback.flag(rows[0].pk, annotator, "wrong")
    buffer.set_status(Experience.objects.filter(pk=rows[1].pk), Experience.Status.REJECTED)
    login(researcher, f"/runs/{run.pk}/")
    tile = page.locator('#human-feedback [data-feedback="data"]')
    expect(tile).to_have_text("0 · 0 · 2 (1 by judgement, 1 in the admin)")
    assert page_errors == []
