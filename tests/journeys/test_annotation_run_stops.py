"""An annotator is on an item the run has trained on when the run is stopped: the server refuses
judgements of it from then on (services.refusal: no more training to come), so the page takes
away its choices and says why, and the next item, not trained on, is still judged. With
JavaScript the page learns it on the run's channel while the annotator is editing (the edit is
kept to copy; the rating buttons stayed, to be refused at submit); without, the refused form post
comes back as the item's page with the reason and no choices. In a real browser against the real
server."""
import re

import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs import services as run_services
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from tests.e2e.conftest import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
ITEM = re.compile(r"/annotate/experience/(\d+)/(\?[^#]*)?$")  # the page's queue in its query (annotate.js)
REFUSED = "was already trained on and its run is stopped: it can no longer be judged"


def a_run_being_trained(owner) -> tuple[Run, Experience, Experience]:
    """Two rollouts: the newest (handed out first) the trainer has taken, the other not yet."""
    run = Run.objects.create(name="stopping", owner=owner, config={}, status=Run.Status.RUNNING)
    task = Task.objects.create(taskset=Taskset.objects.create(name="sums"), index=0, prompt="1 + 1?", answer="2")

    def rollout(step):
        return Experience.objects.create(
            run=run, task=task, explorer_step=step, rollout_index=0, group_id=f"g{step}", prompt_text=task.prompt,
            response_text=f"answer {step}", prompt_ids=[1], response_ids=[2], action_mask=[1], reward=0.0,
            model_version=step)
    waiting, trained = rollout(1), rollout(2)
    return run, trained, waiting


def stopped(run, trained):
    Experience.objects.filter(pk=trained.pk).update(status="consumed")
    run_services.set_status(run, Run.Status.STOPPING)
    run_services.set_status(run, Run.Status.STOPPED)


def test_with_javascript_the_page_takes_the_choices_away_as_the_run_stops(page, login, researcher, page_errors):
    run, trained, waiting = a_run_being_trained(researcher)
    annotator = create_user("judge", PASSWORD, roles=(ANNOTATOR,))
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    page.wait_for_url(ITEM)
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#annotate")).to_have_attribute("data-experience", str(trained.pk))
    page.keyboard.press("e")
    expect(page.locator("#edit-text")).to_be_focused()
    page.keyboard.press("Control+a")
    page.keyboard.type("2, half typed")

    stopped(run, trained)
    expect(page.locator("#queue-note")).to_have_text("the run has stopped: no new items will come")
    expect(page.locator("#refusal")).to_have_text(f"experience {trained.pk} {REFUSED}")
    for choices in ('[data-panel="rate"]', '[data-panel="flag"]', "#edit-form", "#skip"):
        expect(page.locator(choices)).to_have_count(0)
    expect(page.locator("#response")).to_have_text("answer 2")
    expect(page.locator("#unsaved-edit textarea")).to_have_value("2, half typed")  # theirs to copy

    page.locator("#next").click()  # the item the trainer had not taken is still open to judge
    expect(page.locator("#annotate")).to_have_attribute("data-experience", str(waiting.pk))
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Nothing left to judge")
    assert list(Feedback.objects.values_list("experience_id", "label")) == [(waiting.pk, "4")]
    assert page_errors == []


def test_a_click_on_next_while_the_page_asks_about_its_item_is_not_lost(page, login, researcher, page_errors):
    """Each status message has the page ask the server about its item (busy meanwhile); a click on
    Next made then was dropped, and the annotator stayed on the refused item (CI under load, the
    test above). The item requests are held here, and let go one at a time, to make that order."""
    run, trained, waiting = a_run_being_trained(researcher)
    annotator = create_user("judge", PASSWORD, roles=(ANNOTATOR,))
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest")
    page.wait_for_url(ITEM)
    expect(page.locator("#live")).to_have_text("live")
    held = []
    page.route(re.compile(rf"/annotate/api/experience/{trained.pk}/$"), lambda route: held.append(route))

    stopped(run, trained)  # two messages: stopping, then stopped
    expect(page.locator("#queue-note")).to_have_text("the run has stopped: no new items will come")
    held.pop().continue_()  # the first question answers: refused (the run has stopped by now)
    expect(page.locator("#refusal")).to_have_text(f"experience {trained.pk} {REFUSED}")
    for _ in range(50):  # the second question, for the second message, is asked and held
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the page did not ask again for the second status message"
    page.locator("#next").click()  # while it waits for that answer
    held.pop().continue_()
    expect(page.locator("#annotate")).to_have_attribute("data-experience", str(waiting.pk))
    assert page_errors == []


def test_without_javascript_the_refused_post_comes_back_with_no_choices(browser, asgi_server, researcher):
    run, trained, waiting = a_run_being_trained(researcher)
    annotator = create_user("judge", PASSWORD, roles=(ANNOTATOR,))
    context = browser.new_context(base_url=asgi_server, java_script_enabled=False)
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.goto(f"/accounts/login/?next=/annotate/%3Frun%3D{run.pk}%26strategy%3Dnewest")
        page.get_by_label("Username").fill(annotator.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(ITEM)
        assert int(ITEM.search(page.url).group(1)) == trained.pk

        stopped(run, trained)  # no channel without JavaScript: the page learns it when it posts
        page.locator(".rate-choices button[value='4']").click()
        expect(page.locator("#refusal")).to_have_text(f"experience {trained.pk} {REFUSED}")
        for choices in ('[data-panel="rate"]', '[data-panel="flag"]', "#skip"):
            expect(page.locator(choices)).to_have_count(0)
        expect(page.locator(".error-box")).to_have_count(0)  # the reason is said once, in the card
        page.reload()  # opened again: the same, drawn by the server
        expect(page.locator("#refusal")).to_have_text(f"experience {trained.pk} {REFUSED}")
        expect(page.locator('[data-panel="rate"]')).to_have_count(0)

        page.locator("#next").click()
        page.wait_for_url(ITEM)
        assert int(ITEM.search(page.url).group(1)) == waiting.pk
        page.locator(".rate-choices button[value='4']").click()
        expect(page.locator("h1")).to_have_text("Nothing left to judge")
        assert list(Feedback.objects.values_list("experience_id", "label")) == [(waiting.pk, "4")]
    finally:
        context.close()
