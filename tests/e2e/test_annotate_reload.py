"""A reloaded annotation tab goes on with its own queue (annotate.js keeps it in the address), in
Chromium against the real server: tab A filters to low rewards, tab B starts the whole run, tab A
is reloaded and still asks for its own queue (it took the session's, B's, before)."""
import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def shown(page, item):
    expect(page.locator(f'#annotate[data-experience="{item.pk}"]')).to_be_attached()


def test_a_reloaded_tab_keeps_its_queue(page, login, researcher, page_errors):
    run = Run.objects.create(name="two tabs", owner=researcher, status=Run.Status.RUNNING, config={})
    high, low, lower = (
        Experience.objects.create(run=run, explorer_step=step, rollout_index=0, group_id=f"g{step}",
                                  prompt_text=f"{step} + 1?", response_text=str(step), prompt_ids=[1],
                                  response_ids=[2], action_mask=[1], reward=reward, model_version=1)
        for step, reward in ((11, 0.9), (3, 0.1), (2, 0.2))
    )
    annotator = create_user("tabs", "pw-for-tests-123", roles=(ANNOTATOR,))
    page.set_viewport_size({"width": 1366, "height": 768})
    login(annotator, f"/annotate/?run={run.pk}&strategy=newest&reward_max=0.5")  # tab A
    shown(page, low)
    assert page.url.endswith(f"/annotate/experience/{low.pk}/?run={run.pk}&strategy=newest&reward_max=0.5")
    tab_b = page.context.new_page()
    tab_b.set_viewport_size({"width": 1366, "height": 768})
    tab_b.goto(page.url.split("/annotate/")[0] + f"/annotate/?run={run.pk}&strategy=newest")
    expect(tab_b.locator("#annotate-page")).to_have_attribute(
        "data-next-url", f"/annotate/api/next/?run={run.pk}&strategy=newest")
    page.reload()
    shown(page, low)
    # The tab's own queue, not the session's (B's, which the reload took before)
    expect(page.locator("#annotate-page")).to_have_attribute(
        "data-next-url", f"/annotate/api/next/?run={run.pk}&strategy=newest&reward_max=0.5")
    expect(page.locator("body")).to_contain_text("reward ≤ 0.5")
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    shown(page, lower)  # A's filter keeps it; B's queue would not skip the newest
    wait_for(lambda: Feedback.objects.filter(user=annotator, experience=low).exists(), 10, "the rating")
    assert page.url.endswith(f"/annotate/experience/{lower.pk}/?run={run.pk}&strategy=newest&reward_max=0.5")
    # A's queue ends: its empty page says its filter leaves nothing (the session's queue was B's, whose
    # next item is the newest).
    page.keyboard.press("3")
    page.keyboard.press("Enter")
    expect(page.locator("#filter-empty")).to_contain_text("reward ≤ 0.5")
    assert not Feedback.objects.filter(experience=high).exists()
    assert not page_errors
