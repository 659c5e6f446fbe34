"""An annotator narrows the queue before judging (Argilla's filters): on the start page they pick a
run, a reward range and a word the response must contain; the page says how many items match and
are left; they rate the first item by keyboard, and the next one handed to them matches too. When
they have judged all that match, the page says the filter is what leaves nothing, and clearing it
goes on with the rest. In a real browser against the real server, and embedded (the same pages
through the same views, on the embedded mode's settings)."""
import re

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from tests.e2e.conftest import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ITEM = re.compile(r"/annotate/experience/(\d+)/(\?[^#]*)?$")  # the page's queue in its query (annotate.js)


def a_run_to_judge(owner) -> tuple[Run, list[Experience]]:
    """Eight rollouts; the filter below keeps the two that score at least 0.5 and mention apples."""
    run = Run.objects.create(name="fruit", owner=owner, config={}, status=Run.Status.RUNNING)
    task = Task.objects.create(taskset=Taskset.objects.create(name="fruit"), index=0, prompt="Name a fruit.", answer="")
    made = []
    for n, (reward, text) in enumerate([(0.9, "An apple."), (0.2, "An apple, maybe."), (0.8, "A pear."),
                                        (0.7, "Green apple slices."), (0.1, "A stone."), (0.6, "Plums."),
                                        (0.95, "Cherries."), (0.3, "Apple pie?")]):
        made.append(Experience.objects.create(
            run=run, task=task, explorer_step=n, rollout_index=n, group_id=f"g{n}", prompt_text=task.prompt,
            response_text=text, prompt_ids=[1], response_ids=[2], action_mask=[1], reward=reward, model_version=1,
        ))
    return run, made


def matching(items) -> list[int]:
    return [e.pk for e in items if e.reward >= 0.5 and "apple" in e.response_text.lower()]


def test_an_annotator_filters_the_queue_in_the_browser_and_judges_what_matches(page, login, researcher, page_errors):
    run, items = a_run_to_judge(researcher)
    wanted = matching(items)
    annotator = create_user("picky", PASSWORD, roles=(ANNOTATOR,))
    page.set_viewport_size({"width": 1366, "height": 768})
    login(annotator, "/annotate/")
    page.get_by_label("Run").select_option(str(run.pk))
    page.get_by_label("Reward from").fill("0.5")
    page.get_by_label("Prompt or response contains").fill("apple")
    page.get_by_role("button", name="Start").click()
    page.wait_for_url(ITEM)
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#queue-note")).to_have_text("2 of 8 left match")
    expect(page.locator("#queue-filter")).to_contain_text("reward ≥ 0.5 · text “apple”")
    first = int(page.locator("#annotate").get_attribute("data-experience"))
    assert first in wanted
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    expect(page.locator("#annotate")).not_to_have_attribute("data-experience", str(first))
    second = int(page.locator("#annotate").get_attribute("data-experience"))
    assert second in wanted and second != first
    expect(page.locator("#queue-note")).to_have_text("1 of 7 left match")  # fetched ahead, it said 2 of 8
    page.keyboard.press("3")
    page.keyboard.press("Enter")
    # Nothing more matches: the page says the filter is why, and clearing it goes on with the rest.
    expect(page.locator("h1")).to_have_text("Nothing left matches your filter")
    expect(page.locator("#filter-empty")).to_contain_text("6 are left without it")
    page.locator("#filter-clear").click()
    page.wait_for_url(ITEM)
    assert int(page.locator("#annotate").get_attribute("data-experience")) not in wanted
    assert sorted(Feedback.objects.filter(user=annotator).values_list("experience_id", flat=True)) == sorted(wanted)
    assert page_errors == []


def test_embedded_the_same_filtered_queue_through_the_same_views(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    run, items = a_run_to_judge(researcher)
    wanted = matching(items)
    client = Client()
    client.force_login(create_user("picky", PASSWORD, roles=(ANNOTATOR,)))
    started = client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "lowest_confidence",
                                                     "reward_min": "0.5", "text": "apple"})
    first = client.get(started.url).url
    page = client.get(first).content.decode()
    assert "2 of 8 left match" in page
    pk = int(ITEM.search(first).group(1))
    assert pk in wanted
    client.post(reverse("annotate-rate", args=[pk]), {"point": "4", "shown_at": "0"})
    second = int(ITEM.search(client.get(reverse("annotate-next")).url).group(1))
    assert second in wanted and second != pk
    client.post(reverse("annotate-rate", args=[second]), {"point": "3", "shown_at": "0"})
    assert "Nothing left matches your filter" in client.get(reverse("annotate-next")).content.decode()


def test_without_javascript_each_tab_goes_on_with_its_own_queue(browser, asgi_server, researcher):
    """Two tabs of one session, no JavaScript: tab 1 the filtered queue, then tab 2 the whole run
    newest first. Rating in tab 1 (a plain form post) leads to the next item of tab 1's queue; it
    led to tab 2's (the session's, changed by tab 2's start)."""
    run, items = a_run_to_judge(researcher)
    wanted = matching(items)
    annotator = create_user("picky", PASSWORD, roles=(ANNOTATOR,))
    context = browser.new_context(base_url=asgi_server, java_script_enabled=False)
    context.set_default_timeout(15_000)
    try:
        tab_1, tab_2 = context.new_page(), context.new_page()
        tab_1.goto("/accounts/login/?next=/annotate/")
        tab_1.get_by_label("Username").fill(annotator.username)
        tab_1.get_by_label("Password").fill(PASSWORD)
        tab_1.get_by_role("button", name="Log in").click()
        tab_1.wait_for_url(re.compile(r"/annotate/$"))
        tab_1.get_by_label("Run").select_option(str(run.pk))
        tab_1.get_by_label("Reward from").fill("0.5")
        tab_1.get_by_label("Prompt or response contains").fill("apple")
        tab_1.get_by_role("button", name="Start").click()
        tab_1.wait_for_url(ITEM)
        first = int(ITEM.search(tab_1.url).group(1))
        assert first in wanted
        # no socket without JavaScript: no "connecting" dot that never connects
        expect(tab_1.locator("#live")).to_be_hidden()
        # The session's queue is tab 2's now (its first item is the one tab 1 holds: held items come first).
        tab_2.goto(f"/annotate/?run={run.pk}&strategy=newest")
        tab_2.wait_for_url(ITEM)
        tab_1.locator(".rate-choices button[value='4']").click()
        tab_1.wait_for_url(lambda url: ITEM.search(url) is not None and int(ITEM.search(url).group(1)) != first)
        second = int(ITEM.search(tab_1.url).group(1))
        assert second in wanted, f"tab 1 went on with tab 2's queue: item {second}"
        expect(tab_1.locator("#queue-filter")).to_contain_text("reward ≥ 0.5 · text “apple”")
        tab_1.locator(".panel[data-panel='flag'] button").first.click()
        expect(tab_1.locator("h1")).to_have_text("Nothing left matches your filter")  # tab 1's queue, done
        assert Feedback.objects.filter(user=annotator, experience_id__in=wanted).count() == 2
    finally:
        context.close()
