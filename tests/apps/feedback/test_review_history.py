"""The run's review history (apps/feedback/review_history.py): who decided what and when, filtered
by reviewer and decision; a reviewer changes their own decision while no trainer step used the
judgement; decisions per reviewer and accept rate on the run's feedback page and in the API. On
Postgres and SQLite."""
import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import REVIEWER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import review, services, stats
from apps.feedback.models import Feedback
from apps.runs.api import token_for
from apps.runs.models import Run

HUMAN = services.HUMAN_REWARD


@pytest.fixture
def reviewed_run(run):
    Run.objects.filter(pk=run.pk).update(config={"feedback": {
        "reward_mode": "weight", "require_review": True, "judgements_per_item": 2}})
    run.refresh_from_db()
    return run


@pytest.fixture
def reviewers(db):
    return [create_user(name, "pw-for-tests-123", roles=(REVIEWER,)) for name in ("rev1", "rev2")]


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def human(experience):
    experience.refresh_from_db()
    return experience.reward_components.get(HUMAN)


@pytest.fixture
def decided(reviewed_run, make_experience, make_annotator, reviewers):
    """rev1 accepted a's rating 5 and rejected b's rating 1; rev2 accepted a's edit of another item."""
    a, b = make_annotator("a"), make_annotator("b")
    rated, edited = make_experience(), make_experience()
    services.rate(rated.pk, a, "5")
    services.rate(rated.pk, b, "1")
    services.edit(edited.pk, a, "a better answer", confirmed=True)
    rev1, rev2 = reviewers
    review.decide(Feedback.objects.get(user=a, kind="rating").pk, rev1, accept=True, note="clear")
    review.decide(Feedback.objects.get(user=b).pk, rev1, accept=False, note="too harsh")
    review.decide(Feedback.objects.get(kind="edit").pk, rev2, accept=True)
    return {"a": a, "b": b, "rated": rated, "edited": edited}


def rows(response) -> list[tuple]:
    return [(r["judgement"].reviewer.username, r["judgement"].review, r["summary"], r["judgement"].user.username)
            for r in response.context["rows"]]


def test_the_history_lists_every_decision_and_filters_by_reviewer_and_decision(reviewed_run, decided, reviewers):
    client = client_of(reviewers[0])
    url = reverse("review-history", args=[reviewed_run.pk])
    page = client.get(url)
    assert rows(page) == [("rev2", "accepted", "edited", "a"), ("rev1", "rejected", "rated 1", "b"),
                          ("rev1", "accepted", "rated 5", "a")]
    text = page.content.decode()
    assert "too harsh" in text and "Reject instead" in text and "Accept instead" in text
    assert rows(client.get(url, {"reviewer": "rev1"})) == rows(page)[1:]
    assert rows(client.get(url, {"reviewer": "rev1", "decision": "accepted"})) == [("rev1", "accepted", "rated 5", "a")]
    assert rows(client.get(url, {"decision": "rejected"})) == [("rev1", "rejected", "rated 1", "b")]
    # A value that names nothing: said, and the whole list shown.
    for query, said in (({"decision": "maybe"}, "decision must be accepted or rejected, not &#x27;maybe&#x27;"),
                        ({"reviewer": "a"}, "reviewer &#x27;a&#x27; decided nothing on this run")):
        refused = client.get(url, query)
        assert said in refused.content.decode() and rows(refused) == rows(page)
    # Only rev2 may change theirs: rev1's page offers no change on rev2's decision.
    assert [r["may_change"] for r in page.context["rows"]] == [False, True, True]


def test_a_reviewer_changes_their_own_decision_on_the_history_page(reviewed_run, decided, reviewers):
    rev1 = reviewers[0]
    client = client_of(rev1)
    rejected = Feedback.objects.get(user=decided["b"])
    assert human(decided["rated"]) == 1.0
    done = client.post(reverse("review-change", args=[rejected.pk]),
                       {"to": "accept", "seen": review.seen(rejected), "note": "on second thought",
                        "reviewer": "rev1", "decision": "rejected"}, follow=True)
    back = reverse("review-history", args=[reviewed_run.pk]) + "?reviewer=rev1&decision=rejected"
    assert done.redirect_chain[-1][0] == back
    assert "Accepted <bdi>b</bdi>&#x27;s rating of experience" in done.content.decode()
    rejected.refresh_from_db()
    assert (rejected.review, rejected.reviewer, rejected.review_note) == ("accepted", rev1, "on second thought")
    assert human(decided["rated"]) == 0.5  # both ratings count now: 1.0 and 0.0
    # The same decision again: refused, nothing changed.
    with pytest.raises(review.ReviewError, match="you accepted judgement .* already"):
        review.change(rejected.pk, rev1, accept=True)
    # Another reviewer's decision is theirs to change: refused by the page and by decide itself.
    edit = Feedback.objects.get(kind="edit")
    again = client.post(reverse("review-change", args=[edit.pk]), {"to": "reject", "seen": review.seen(edit)},
                        follow=True)
    assert "Nothing changed: judgement" in again.content.decode() and "no decision of yours" in again.content.decode()
    assert "<bdi>rev2</bdi> decided it, and only they change it" in again.content.decode()
    with pytest.raises(review.ReviewError, match="rev2.* accepted this edit: only they change their decision"):
        review.decide(edit.pk, rev1, accept=False)
    edit.refresh_from_db()
    assert edit.review == "accepted" and edit.reviewer == reviewers[1]
    assert Experience.objects.filter(parent=decided["edited"], source="human_edit").count() == 1
    # A bad decision value changes nothing either.
    bad = client.post(reverse("review-change", args=[rejected.pk]), {"to": "maybe"}, follow=True)
    assert "to must be accept or reject" in bad.content.decode()
    rejected.refresh_from_db()
    assert rejected.review == "accepted"


def test_a_change_comes_back_to_the_page_it_was_on_and_a_stale_one_says_who_moved_it(reviewed_run, decided,
                                                                                      reviewers, monkeypatch):
    from apps.feedback import review_history
    monkeypatch.setattr(review_history, "PAGE_SIZE", 1)  # three decisions: three pages
    rev1 = reviewers[0]
    client = client_of(rev1)
    url = reverse("review-history", args=[reviewed_run.pk])
    second = client.get(url, {"page": 2})
    rejected = second.context["rows"][0]["judgement"]
    assert rejected.user == decided["b"] and 'name="page" value="2"' in second.content.decode()
    seen_before = review.seen(rejected)
    done = client.post(reverse("review-change", args=[rejected.pk]), {"to": "accept", "seen": seen_before,
                                                                       "page": "2"}, follow=True)
    assert done.redirect_chain[-1][0] == f"{url}?page=2"  # it was page 1
    assert "It is the newest decision now: at the top of page 1." in done.content.decode()
    # A page drawn before it (another tab of theirs) decides again: their own change, said as theirs
    # (it read "rev1 accepted this rating while you looked at it", to rev1).
    with pytest.raises(review.ReviewError, match=r"^you accepted this rating since this page showed it \(another "):
        review.decide(rejected.pk, rev1, accept=False, seen_as=seen_before)


def test_a_curator_takes_over_the_decisions_of_a_reviewer_who_has_left(reviewed_run, decided, reviewers, curator):
    """One reviewer a judgement, only they change it: once they left (deactivated, or the role taken
    away), no one could, and a wrong acceptance not yet trained stayed until someone used the admin."""
    rev1, rev2 = reviewers
    accepted = Feedback.objects.get(user=decided["a"], kind="rating")
    curator_page = client_of(curator).get(reverse("review-history", args=[reviewed_run.pk]))
    assert not any(row["may_change"] for row in curator_page.context["rows"])  # both reviewers are here
    with pytest.raises(review.ReviewError, match="only they change their decision"):
        review.decide(accepted.pk, rev2, accept=False)  # another reviewer may not, left or not
    rev1.is_active = False
    rev1.save()
    curator_page = client_of(curator).get(reverse("review-history", args=[reviewed_run.pk]))
    assert [(r["judgement"].reviewer.username, r["may_change"]) for r in curator_page.context["rows"]] == [
        ("rev2", False), ("rev1", True), ("rev1", True)]
    with pytest.raises(review.ReviewError, match="has no decision of yours to change"):
        review.change(accepted.pk, rev2, accept=False)  # a reviewer is no curator
    done = client_of(curator).post(reverse("review-change", args=[accepted.pk]),
                                   {"to": "reject", "seen": review.seen(accepted), "note": "rev1 erred"}, follow=True)
    assert "Rejected <bdi>a</bdi>&#x27;s rating of experience" in done.content.decode()
    accepted.refresh_from_db()
    assert (accepted.review, accepted.reviewer, accepted.review_note) == ("rejected", curator, "rev1 erred")


def test_a_decision_training_used_cannot_be_changed(reviewed_run, decided, reviewers):
    rev2 = reviewers[1]
    edit = Feedback.objects.get(kind="edit")
    client = client_of(rev2)
    url = reverse("review-history", args=[reviewed_run.pk])
    assert client.get(url, {"reviewer": "rev2"}).context["rows"][0]["may_change"] is True
    # Untrained: rejecting it takes its human_edit row out; accepting again brings it back.
    review.change(edit.pk, rev2, accept=False)
    assert not Experience.objects.filter(parent=decided["edited"], source="human_edit").exists()
    review.change(edit.pk, rev2, accept=True)
    Experience.objects.filter(parent=decided["edited"], source="human_edit").update(use_count=1)  # a step used it
    Run.objects.filter(pk=reviewed_run.pk).update(trainer_step=7)
    page = client.get(url, {"reviewer": "rev2"})
    row = page.context["rows"][0]
    assert row["may_change"] is False and row["trained_on_step"] == 8
    assert "trained on at step 8" in page.content.decode() and "Reject instead" not in page.content.decode()
    edit.refresh_from_db()
    refused = client.post(reverse("review-change", args=[edit.pk]), {"to": "reject", "seen": review.seen(edit)},
                          follow=True)
    assert "accepted and trained on at step 8: it can no longer be rejected" in refused.content.decode()
    edit.refresh_from_db()
    assert edit.review == "accepted"


def test_a_judgement_judged_again_leaves_the_history_and_cannot_be_changed(reviewed_run, decided, reviewers):
    services.rate(decided["rated"].pk, decided["b"], "3")  # back to review
    judgement = Feedback.objects.get(user=decided["b"])
    with pytest.raises(review.ReviewError, match="waits for review"):
        review.change(judgement.pk, reviewers[0], accept=True)
    page = client_of(reviewers[0]).get(reverse("review-history", args=[reviewed_run.pk]))
    assert judgement.pk not in [r["judgement"].pk for r in page.context["rows"]]


def test_decisions_per_reviewer_on_the_feedback_page_and_in_the_api(reviewed_run, decided, reviewers, curator):
    expected = [{"reviewer": "rev1", "decisions": 2, "accepted": 1, "rejected": 1, "accept_rate": 0.5},
                {"reviewer": "rev2", "decisions": 1, "accepted": 1, "rejected": 0, "accept_rate": 1.0}]
    assert stats.per_reviewer(reviewed_run) == expected
    page = client_of(reviewers[0]).get(reverse("annotate-run-feedback", args=[reviewed_run.pk])).content.decode()
    assert '<section class="card" id="reviewers">' in page and "50%" in page
    answer = Client().get(reverse("api-run-annotation", args=[reviewed_run.pk]),
                          HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}")
    assert answer.status_code == 200 and answer.json()["per_reviewer"] == expected


def test_only_reviewers_read_the_history(reviewed_run, decided, annotator_client, researcher):
    url = reverse("review-history", args=[reviewed_run.pk])
    assert annotator_client.get(url).status_code == 403
    assert client_of(researcher).get(url).status_code == 403
    judgement = Feedback.objects.get(user=decided["b"])
    assert annotator_client.post(reverse("review-change", args=[judgement.pk]), {"to": "accept"}).status_code == 403
    judgement.refresh_from_db()
    assert judgement.review == "rejected"
