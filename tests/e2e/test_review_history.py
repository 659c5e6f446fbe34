"""The review history in Chromium against the real server: a reviewer accepts by key on the review
page, finds the decision under Reviewed, filters the list, and turns it round (Reject instead),
and the rating leaves the human reward."""
import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR, REVIEWER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import services
from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_finds_and_changes_their_decision(page, login, researcher, page_errors):
    run = Run.objects.create(name="reviewed", owner=researcher, status=Run.Status.RUNNING,
                             config={"feedback": {"reward_mode": "weight", "require_review": True}})
    item = Experience.objects.create(run=run, explorer_step=1, rollout_index=0, group_id="g", prompt_text="2 + 2?",
                                     response_text="4", prompt_ids=[1], response_ids=[2], action_mask=[1],
                                     reward=1.0, model_version=1)
    annotator = create_user("ann1", "pw-for-tests-123", roles=(ANNOTATOR,))
    services.rate(item.pk, annotator, "5")
    reviewer = create_user("rev1", "pw-for-tests-123", roles=(REVIEWER,))
    page.set_viewport_size({"width": 1366, "height": 768})
    login(reviewer, f"/annotate/review/runs/{run.pk}/")
    expect(page.locator("#review")).to_be_attached()
    page.keyboard.press("a")
    expect(page.locator("#review-empty")).to_be_visible()
    wait_for(lambda: Feedback.objects.get().review == "accepted", 10, "the acceptance")

    page.click("#reviewed-link")
    row = page.locator("#review-history tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator(".decision")).to_have_text("accepted")
    expect(row).to_contain_text("rated 5")
    expect(row).to_contain_text("ann1")
    page.select_option("#filter-decision", "rejected")
    page.click("#review-history-filter button")
    expect(page.locator("#history-empty")).to_contain_text("matches the filter")
    page.select_option("#filter-decision", "accepted")
    page.select_option("#filter-reviewer", "rev1")
    page.click("#review-history-filter button")
    row.locator("input[name=note]").fill("the sum is fine, the rating is not")
    row.get_by_role("button", name="Reject instead").click()
    expect(page.locator(".flash.success")).to_contain_text("Rejected ann1's rating")
    # Back on the list as filtered (accepted, rev1): the decision is rejected now, so it left it.
    expect(page.locator("#history-empty")).to_be_visible()
    assert "reviewer=rev1" in page.url and "decision=accepted" in page.url
    judgement = Feedback.objects.get()
    assert (judgement.review, judgement.review_note) == ("rejected", "the sum is fine, the rating is not")
    item.refresh_from_db()
    assert services.HUMAN_REWARD not in item.reward_components
    assert not page_errors
