"""Flagging every item a filter matches in one confirmed action (apps/feedback/bulk.py): for the
run's owner or a curator only; the count seen is the count flagged; each item flagged as the
one-item flag does (training leaves it out the same way); undone as that flag's undo does."""
import re

import pytest
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import bulk, queue, services
from apps.feedback.models import AnnotationLock, Feedback
from apps.feedback.queue_filter import QueueFilter
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


def page(run):
    return reverse("annotate-bulk-flag", args=[run.pk])


def confirm(client, run, count, reason="garbled", seen=None, **query):
    """Post the confirm form as the page shows it now (its `seen`, unless given)."""
    if seen is None:
        found = re.search(r'name="seen" value="(\w+)"', client.get(page(run), query).content.decode())
        seen = found.group(1) if found else ""
    return client.post(reverse("annotate-bulk-flag-confirm", args=[run.pk]),
                       {**query, "count": str(count), "reason": reason, "seen": seen})


@pytest.fixture
def items(make_experience):
    """Six items: rewards 0, 0.2 ... 1.0; the filter reward_max=0.3 matches the first two."""
    return [make_experience(reward=n / 5, explorer_step=n) for n in range(6)]


def test_the_owner_sees_the_count_then_flags_exactly_those(researcher_client, researcher, run, items):
    html = researcher_client.get(page(run), {"reward_max": "0.3"}).content.decode()
    assert "<strong>2</strong> items not flagged yet match <strong>reward ≤ 0.3</strong>" in html
    assert 'name="count" value="2"' in html and "Flag these 2 items" in html
    response = confirm(researcher_client, run, 2, reward_max="0.3")
    assert response.url == page(run) + "?reward_max=0.3"
    flagged = {e.pk for e in items[:2]}
    assert set(Experience.objects.filter(status="rejected").values_list("pk", flat=True)) == flagged
    flags = Feedback.objects.filter(kind="flag")
    assert {(f.experience_id, f.user_id, f.label, f.status_before) for f in flags} == {
        (pk, researcher.pk, "garbled", "ready") for pk in flagged
    }
    assert "Flagged 2 items." in researcher_client.get(response.url).content.decode()


def test_a_count_that_changed_since_it_was_seen_flags_nothing(researcher_client, run, items, make_experience):
    make_experience(reward=0.1)  # written after the page counted 2
    confirm(researcher_client, run, 2, reward_max="0.3")
    assert not Experience.objects.filter(status="rejected").exists() and not Feedback.objects.exists()
    html = researcher_client.get(page(run)).content.decode()
    assert "Nothing flagged: the filter matches 3 items now, not the 2 you confirmed" in html


def test_as_many_other_items_as_went_flag_nothing(researcher_client, researcher, run, items, make_experience):
    """A reviewer's count came back to what the page said with other items: the flag went ahead."""
    seen = re.search(r'name="seen" value="(\w+)"',
                     researcher_client.get(page(run), {"reward_max": "0.3"}).content.decode()).group(1)
    services.flag(items[0].pk, researcher, "garbled")  # one goes...
    make_experience(reward=0.1)  # ...another comes
    confirm(researcher_client, run, 2, seen=seen, reward_max="0.3")
    assert Feedback.objects.count() == 1
    assert "not the same ones you confirmed" in researcher_client.get(page(run)).content.decode()


@pytest.mark.parametrize(
    "query, said",
    [
        ({}, "choose a filter first"),
        ({"reward_min": "nan"}, "reward_min must be a finite number"),
        ({"reward_max": "0.3", "reason": "ugly"}, "unknown flag &#x27;ugly&#x27;"),
    ],
)
def test_bad_requests_flag_nothing_and_say_why(researcher_client, run, items, query, said):
    reason = query.pop("reason", "garbled")
    confirm(researcher_client, run, 2, reason=reason, **query)
    assert not Feedback.objects.exists()
    assert f"Nothing flagged: {said}" in researcher_client.get(page(run)).content.decode()


@pytest.mark.parametrize("count, said", [
    ("", "count: the number of items confirmed is missing"),
    ("99999999999999999999999", "count: &#x27;99999999999999999999999&#x27; is not a number of items"),
    ("two", "count: &#x27;two&#x27; is not a number of items"),  # both were said to be "missing"
])
def test_a_bad_count_is_named_and_flags_nothing(researcher_client, run, items, count, said):
    confirm(researcher_client, run, count, reward_max="0.3")
    assert not Feedback.objects.exists()
    assert f"Nothing flagged: {said}" in researcher_client.get(page(run)).content.decode()


def test_more_than_one_action_may_flag_is_refused(run, researcher, items, monkeypatch):
    monkeypatch.setattr(bulk, "MAX_ITEMS", 3)
    with pytest.raises(bulk.FeedbackError, match="matches more than 3 items"):
        bulk.flag_all(run, researcher, QueueFilter(reward_min=0.0), "wrong", confirmed_count=6)
    assert not Feedback.objects.exists()


def test_annotators_and_other_researchers_may_not(annotator_client, client, run, items):
    assert annotator_client.get(page(run), {"reward_max": "0.3"}).status_code == 403
    assert confirm(annotator_client, run, 2, reward_max="0.3").status_code == 403
    client.force_login(create_user("other", "pw-for-tests-123", roles=(RESEARCHER,)))
    assert client.get(page(run), {"reward_max": "0.3"}).status_code == 403
    assert confirm(client, run, 2, reward_max="0.3").status_code == 403
    assert not Feedback.objects.exists()


def test_a_curator_may_and_the_count_leaves_out_what_the_one_item_flag_refuses(
    client, curator, run, items, make_annotator, settings
):
    """The page counted items the flag then refused: "Flag these 128 items", then "Flagged 0
    items. Left as they were: 128 (was already trained on ...)"."""
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = 1
    services.rate(items[0].pk, make_annotator("busy"), "2")  # its one judgement is taken
    queue.take(items[2].pk, make_annotator("holding"))  # held by an annotator now
    client.force_login(curator)
    assert 'name="count" value="1"' in client.get(page(run), {"reward_max": "0.5"}).content.decode()
    confirm(client, run, 1, reward_max="0.5")
    assert list(Experience.objects.filter(status="rejected").values_list("pk", flat=True)) == [items[1].pk]
    assert "Flagged 1 item." in client.get(page(run)).content.decode()
    # A finished run's consumed items were trained on: no flag changes them.
    Experience.objects.filter(pk=items[3].pk).update(status="consumed")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    assert 'name="count" value="2"' in client.get(page(run), {"reward_min": "0.5"}).content.decode()


def test_undo_takes_the_flags_back_and_leaves_the_items_free(researcher_client, researcher, run, items):
    confirm(researcher_client, run, 2, reward_max="0.3")
    assert "Undo your last bulk flag (2 items)" in researcher_client.get(page(run)).content.decode()
    researcher_client.post(reverse("annotate-bulk-flag-undo", args=[run.pk]))
    assert not Experience.objects.filter(status="rejected").exists() and not Feedback.objects.exists()
    assert not AnnotationLock.objects.filter(user=researcher).exists()  # not held from the annotators
    assert "Undid 2 flags of your last bulk flag." in researcher_client.get(page(run)).content.decode()
