"""Review and agreement as a team works (issue #44, "done when"): a run requires review and two
judgements per item; two annotators rate the same two items and each edits one, through the
annotation page's JSON; a reviewer goes through the review queue by keyboard, accepting everything
but one annotator's edit; the run trains on the accepted edit and never sees the rejected one,
and the run's agreement figures are what a hand computation gives. Full stack (a Celery worker,
the reviewer in Chromium), and embedded (the run on a thread of this process, the reviewer's
posts through the same views)."""
import json
import threading

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR, REVIEWER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs import services
from apps.runs.models import Run
from apps.runs.presets import preset_config
from apps.tasksets.services import load_builtin_tasksets
from tests.e2e.conftest import PASSWORD
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def reviewed_config() -> dict:
    config = preset_config("quick-demo")  # MIX: human edits join its expert data
    config["trainer"]["total_steps"] = 5000
    config["feedback"] = {**config["feedback"], "require_review": True, "judgements_per_item": 2,
                          "reward_mode": "weight"}
    return config


def annotator_client(user, run) -> Client:
    client = Client()
    client.force_login(user)
    assert client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest"}).status_code == 302
    return client


def judge(client, item, action, **fields) -> None:
    client.get(reverse("annotate-api-item", args=[item.pk]))  # the page shows it: taken for this annotator
    answer = client.post(reverse("annotate-api-judge", args=[item.pk, action]), json.dumps(fields),
                         content_type="application/json")
    assert answer.status_code == 200, answer.content


def the_team_judges(run) -> tuple[Experience, Experience]:
    """a and b rate items x and y (x: 5 and 5; y: 2 and 4); a edits x, b edits y, each with the
    reference answer (no confirmation asked)."""
    a, b = (create_user(name, "pw-for-tests-123", roles=(ANNOTATOR,)) for name in ("a", "b"))
    rollouts = wait_for(lambda: list(Experience.objects.filter(run=run, source="rollout").select_related("task")
                                     .order_by("-explorer_step", "pk")[:16]) or None, timeout=180, what="rollouts")
    x = rollouts[0]
    y = next(e for e in rollouts if e.task_id != x.task_id)
    client_a, client_b = annotator_client(a, run), annotator_client(b, run)
    for client, ratings in ((client_a, ("5", "2")), (client_b, ("5", "4"))):
        judge(client, x, "rate", point=ratings[0], comment="read twice")
        judge(client, y, "rate", point=ratings[1])
    judge(client_a, x, "edit", text=f"{x.task.answer}")
    # The quick demo's model answers in 4 tokens (explorer.max_new_tokens): an edit must fit them.
    judge(client_b, y, "edit", text=f"{y.task.answer}")
    assert Feedback.objects.filter(experience__run=run, review="pending").count() == 6
    assert not Experience.objects.filter(run=run, source="human_edit").exists()  # nothing before review
    return x, y


def trained_as_reviewed(run, x, y) -> None:
    accepted = wait_for(lambda: Experience.objects.filter(parent=x, source="human_edit").first(), timeout=30,
                        what="the accepted edit in the buffer")
    wait_for(lambda: Experience.objects.get(pk=accepted.pk).use_count > 0, timeout=300,
             what="a trainer step training on the accepted edit")
    assert not Experience.objects.filter(parent=y, source="human_edit").exists()  # the rejected one: never
    x.refresh_from_db()
    assert x.reward_components["human"] == 1.0  # both 5s accepted


def agreement_as_by_hand(client, run) -> None:
    # Ratings normalised on 1-5: x [1, 1], y [0.25, 0.75]. One of two items alike: 50%. Alpha:
    # observed = (0 + 2 * 0.5^2) / 4 = 0.125; expected = (4 * 0.75^2 + 4 * 0.25^2 + 2 * 0.5^2) / 12
    # = 3 / 12 = 0.25; alpha = 1 - 0.125 / 0.25 = 0.5.
    page = client.get(reverse("annotate-run-feedback", args=[run.pk]))
    assert page.context["agreement"]["percent_agreement"] == 0.5
    assert page.context["agreement"]["krippendorff_alpha"] == pytest.approx(0.5, abs=1e-12)
    assert "<bdi>a</bdi> · <bdi>b</bdi>" in page.content.decode()
    by_annotator = {(row["annotator"], row["kind"]): row for row in page.context["annotators"]}
    assert (by_annotator[("b", "edit")]["rejected"], by_annotator[("a", "edit")]["accepted"]) == (1, 1)


def test_a_reviewer_accepts_by_keyboard_in_the_browser_and_only_that_trains(researcher, stack, page, login):
    load_builtin_tasksets()
    processes = stack()
    processes.worker("default,train")
    run = services.launch_run(researcher, "reviewed", reviewed_config())
    try:
        x, y = the_team_judges(run)
        reviewer = create_user("rev", PASSWORD, roles=(REVIEWER,))
        login(reviewer, f"/annotate/review/runs/{run.pk}/")
        expect(page.locator("#review-waiting")).to_contain_text("6 waiting")
        for _ in range(6):
            # The page's keys are bound by review.js at the end of the body: the new judgement's HTML
            # can be there before it runs, and a key pressed then is lost (once in a loaded CI run).
            page.wait_for_load_state("load")
            heading = page.locator("#judgement h2").text_content()  # as written: the page shows it in capitals
            shown = page.locator("#review").get_attribute("data-judgement")
            page.keyboard.press("x" if heading == "b's edit" else "a")
            # the next page is the one that no longer shows this judgement: the flash alone
            # may be the last page's ("Accepted" twice running), and a key pressed then is lost
            expect(page.locator(f'#review[data-judgement="{shown}"]')).to_have_count(0)
            expect(page.locator(".flash")).to_contain_text("Rejected" if heading == "b's edit" else "Accepted")
        expect(page.locator("#review-empty")).to_be_visible()
        trained_as_reviewed(run, x, y)
        client = Client()
        client.force_login(researcher)
        agreement_as_by_hand(client, run)
        page.goto(f"/annotate/runs/{run.pk}/")
        expect(page.locator("#pairwise")).to_contain_text("a · b")
    finally:
        services.stop_run(Run.objects.get(pk=run.pk))


def test_embedded_the_same_review_through_the_same_views(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    run = services.launch_run(researcher, "reviewed", reviewed_config())
    try:
        x, y = the_team_judges(run)
        reviewer = Client()
        reviewer.force_login(create_user("rev", "pw-for-tests-123", roles=(REVIEWER,)))
        while (judgement := reviewer.get(reverse("review-next", args=[run.pk])).context["judgement"]) is not None:
            reject = judgement.user.username == "b" and judgement.kind == "edit"
            reviewer.post(reverse("review-reject" if reject else "review-accept", args=[judgement.pk]))
        trained_as_reviewed(run, x, y)
        owner = Client()
        owner.force_login(researcher)
        agreement_as_by_hand(owner, run)
    finally:
        services.stop_run(Run.objects.get(pk=run.pk))
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=120,
                 what="the run's threads to end")
