"""Who annotates a run (every annotator, or only those assigned), on the pages, the services and
the websocket; and the run page's human-feedback summary."""
import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse

from apps.feedback import queue, services
from apps.feedback.models import Feedback
from apps.feedback.services import FeedbackError

from .test_consumer import connect, session_cookie


def restrict(run, *usernames):
    return services.set_annotators(run, run.owner, open_to_all=False, usernames=list(usernames))


@pytest.mark.django_db
def test_a_run_open_to_all_takes_every_annotator_and_a_restricted_one_only_those_assigned(
    run, make_experience, make_annotator
):
    chosen, other = make_annotator("chosen"), make_annotator("other")
    experience = make_experience()
    assert services.may_annotate(run, other)
    restrict(run, "chosen")
    assert services.may_annotate(run, chosen) and services.may_annotate(run, run.owner)
    assert not services.may_annotate(run, other)
    with pytest.raises(FeedbackError, match="not an annotator of run 'r'"):
        queue.next_item(run, other)
    with pytest.raises(FeedbackError, match="not an annotator of run 'r'"):
        services.rate(experience.pk, other, "3")
    assert not Feedback.objects.exists()
    assert queue.next_item(run, chosen) == experience


@pytest.mark.django_db
@pytest.mark.parametrize(
    "usernames, error",
    [(["ghost"], "no user named ghost"), (["res2"], "res2 cannot annotate")],
)
def test_assigning_unknown_users_or_non_annotators_is_refused_and_changes_nothing(
    run, django_user_model, usernames, error
):
    django_user_model.objects.create_user("res2")  # no role at all
    with pytest.raises(FeedbackError, match=error):
        restrict(run, *usernames)
    assert not type(run).objects.filter(pk=run.pk, annotators__isnull=False).exists()


@pytest.mark.django_db
def test_only_the_owner_or_a_curator_assigns(run, make_annotator, curator):
    with pytest.raises(FeedbackError, match="only the owner"):
        services.set_annotators(run, make_annotator("x"), open_to_all=False, usernames=[])
    assert services.set_annotators(run, curator, open_to_all=False, usernames=[]).open_to_all is False


@pytest.mark.django_db
def test_pages_list_only_runs_the_annotator_may_annotate(client, run, make_experience, make_annotator):
    make_experience()
    outsider = make_annotator("outsider")
    restrict(run)
    client.force_login(outsider)
    assert f'value="{run.pk}"'.encode() not in client.get(reverse("annotate-start")).content
    response = client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest"}, follow=True)
    assert b"You are not an annotator of run <bdi>r</bdi>" in response.content


@pytest.mark.django_db
def test_the_owner_assigns_annotators_on_the_feedback_page(researcher_client, run, make_annotator):
    make_annotator("alice")
    response = researcher_client.post(reverse("annotate-assign", args=[run.pk]), {"usernames": "alice\n"}, follow=True)
    assert b"Saved who annotates <bdi>r</bdi>" in response.content
    assert list(run.annotators.users.values_list("username", flat=True)) == ["alice"]
    assert run.annotators.open_to_all is False
    response = researcher_client.post(reverse("annotate-assign", args=[run.pk]), {"usernames": "bob"}, follow=True)
    assert b"no user named bob" in response.content
    assert list(run.annotators.users.values_list("username", flat=True)) == ["alice"]


@pytest.mark.django_db(transaction=True)
def test_the_websocket_refuses_annotators_not_assigned_to_the_run(client, run, make_annotator):
    make_annotator("chosen")
    outsider = make_annotator("outsider")
    restrict(run, "chosen")

    async def connects(cookie):
        ws = connect(f"/ws/annotate/{run.pk}/", cookie)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(connects)(session_cookie(client, outsider)) == (False, 4403)
    client.logout()
    from django.contrib.auth import get_user_model

    assert async_to_sync(connects)(session_cookie(client, get_user_model().objects.get(username="chosen")))[0] is True


@pytest.mark.django_db
def test_the_run_page_shows_human_feedback_counts_and_the_human_reward(
    researcher_client, annotator, run, make_experience, make_annotator, settings
):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = 2
    first, second, third = (make_experience(explorer_step=s) for s in (0, 0, 1))
    services.rate(first.pk, make_annotator("a"), "5")
    services.rate(first.pk, make_annotator("b"), "4")  # the item's human reward: 0.875
    services.rate(third.pk, make_annotator("c"), "1")
    services.rate(third.pk, make_annotator("e"), "1")  # rated once both of its 2 are in
    services.flag(second.pk, make_annotator("d"), "garbled")
    summary = researcher_client.get(reverse("annotate-run-summary", args=[run.pk])).json()
    assert summary["judgements"] == {"rating": 4, "edit": 0, "preference": 0, "flag": 1}
    assert (summary["rated_experiences"], summary["flagged_experiences"], summary["dpo_pairs"]) == (2, 1, 0)
    assert summary["human_reward_by_step"] == [
        {"explorer_step": 0, "human_reward": 0.875, "rated": 1},
        {"explorer_step": 1, "human_reward": 0.0, "rated": 1},
    ]
    assert summary["human_reward"] == pytest.approx(0.4375)
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert reverse("annotate-run-summary", args=[run.pk]) in page and "js/feedback_summary.js" in page
    assert 'data-feedback="waiting_for_review"' not in page  # the run asks no review
    annotator_client = Client()
    annotator_client.force_login(annotator)
    assert annotator_client.get(reverse("annotate-run-summary", args=[run.pk])).status_code == 403
