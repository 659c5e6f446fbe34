"""Every annotation path (apps/feedback: compare, flag, skip, postpone, rate, edit, undo, progress)
through the page's JSON API on the database DATABASE_URL names: `make test` runs this directory on
Postgres and again on SQLite, the embedded mode's database that the README's first command gives
every new user (`make test-sqlite`).

Issue #42: on SQLite one comparison made every later call on its run answer 500 (a JSONField
`__contains` in apps/feedback/history.py). Issue #41: a second comparison with the same response
replaced the first pair; undoing a flag lifted a curator's rejection."""
import json

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer import services as buffer_services
from apps.buffer.models import Experience
from apps.buffer.store import DjangoExperienceBuffer
from apps.feedback.models import Feedback, SetAside
from apps.runs.models import MetricPoint, Run
from apps.tasksets.models import Task, Taskset
from tests.support import migrate_to, migrate_to_newest

from .conftest import ENGINE

pytestmark = pytest.mark.django_db
Status = Experience.Status


def post(client, url, body=None):
    return client.post(url, json.dumps(body or {}), content_type="application/json")


def judge(client, item, action, **body):
    return post(client, reverse("annotate-api-judge", kwargs={"pk": item.pk, "action": action}), body)


def undo(client, feedback=None):
    return post(client, reverse("annotate-api-undo"), {} if feedback is None else {"feedback": feedback})


def ok(response) -> dict:
    assert response.status_code == 200, (ENGINE, response.status_code, response.content[:500])
    return response.json()


@pytest.fixture
def run(researcher):
    return Run.objects.create(name=f"feedback on {ENGINE}", owner=researcher,
                              config={"feedback": {"reward_mode": "weight"}}, status=Run.Status.RUNNING)


@pytest.fixture
def items(run):
    """Six rollouts of the run; 0, 1 and 2 answer one prompt (they compare), the rest one each."""
    taskset = Taskset.objects.create(name=f"sums {run.pk}")
    tasks = [Task.objects.create(taskset=taskset, index=i, prompt=f"What is {i} + 1?", answer=str(i + 1))
             for i in range(4)]
    task_of = [tasks[0], tasks[0], tasks[0], tasks[1], tasks[2], tasks[3]]
    return [
        Experience.objects.create(
            run=run, task=task, explorer_step=0, rollout_index=n, group_id=f"g{task.pk}", prompt_text=task.prompt,
            response_text=f"response {n}", prompt_ids=[1, 2], response_ids=[10 + n, 2], action_mask=[1, 1],
            reward=0.0, model_version=1,
        )
        for n, task in enumerate(task_of)
    ]


@pytest.fixture
def page(annotator_client, items):
    """The annotator on the first item's page: the session's run is the items' run."""
    ok_page = annotator_client.get(reverse("annotate-experience", args=[items[0].pk]))
    assert ok_page.status_code == 200
    return annotator_client


def status(item) -> str:
    return Experience.objects.get(pk=item.pk).status


def test_after_a_comparison_every_feedback_path_answers_and_does_what_it_says(page, items, annotator):
    """Issue #42: `c`, `1`, Enter, then flag, skip, postpone, rate, undo and progress: each 200."""
    a, b, c, d, e, f = items
    saved = ok(judge(page, a, "compare", other=b.pk, verdict="a_better", seconds=1.5))
    assert saved["message"] is None and saved["session_count"] == 1
    assert [(h["item"], h["summary"], h["trained_on_step"]) for h in saved["history"]] == [
        (a.pk, "compared: A is better", None)
    ]
    assert ok(page.get(reverse("annotate-api-next"), {"exclude": f"{a.pk},{b.pk}"}))["item"]["id"] in {
        x.pk for x in items
    }
    ok(judge(page, c, "flag", reason="garbled"))
    assert status(c) == Status.REJECTED
    ok(judge(page, d, "skip"))
    ok(judge(page, e, "postpone"))
    assert set(SetAside.objects.values_list("experience_id", "postponed")) == {(d.pk, False), (e.pk, True)}
    ok(judge(page, f, "rate", point="4"))
    assert Experience.objects.get(pk=f.pk).reward_components["human"] == 0.75
    undone = ok(undo(page))  # the newest: the rating
    assert undone["message"] == f"Undid your judgement of experience {f.pk} (rated 4)." and undone["item"]["id"] == f.pk
    assert "human" not in Experience.objects.get(pk=f.pk).reward_components
    progress = ok(page.get(reverse("annotate-api-progress")))
    assert [h["summary"] for h in progress["history"]] == ["flagged as garbled", "compared: A is better"]
    comparison = Feedback.objects.get(kind="preference").pk
    undone = ok(undo(page, comparison))["message"]
    assert undone == f"Undid your judgement of experience {a.pk} (compared: A is better)."
    assert list(Feedback.objects.values_list("kind", flat=True)) == ["flag"]


def test_an_edit_and_its_undo_answer_on_this_database_too(page, items):
    a = items[0]
    ok(judge(page, a, "edit", text="0 + 1 = 1"))
    assert Experience.objects.get(parent=a).response_text == "0 + 1 = 1"
    ok(undo(page))
    assert not Experience.objects.filter(parent=a).exists()


def test_each_pair_is_its_own_comparison_and_both_reach_dpo(page, items, run):
    """Issue #41: A-vs-B then A-vs-C kept only the second pair (one row per response and annotator)."""
    a, b, c = items[:3]
    ok(judge(page, a, "compare", other=b.pk, verdict="a_better"))
    second = ok(judge(page, a, "compare", other=c.pk, verdict="a_better"))
    assert second["message"] is None  # another pair: nothing was replaced
    pairs = DjangoExperienceBuffer(run.pk).sample_pairs(8)
    assert sorted((p.chosen_ids[0], p.rejected_ids[0]) for p in pairs) == [(10, 11), (10, 12)]
    # The same pair again, either way round, replaces that pair's verdict, and says so.
    again = ok(judge(page, b, "compare", other=a.pk, verdict="a_better"))
    assert again["message"] == (
        f"Saved your comparison of experience {b.pk}. "
        f"It replaces your earlier comparison of experiences {a.pk} and {b.pk} ({a.pk} was better)."
    )
    assert Feedback.objects.filter(kind="preference").count() == 2
    pairs = DjangoExperienceBuffer(run.pk).sample_pairs(8)
    assert sorted((p.chosen_ids[0], p.rejected_ids[0]) for p in pairs) == [(10, 12), (11, 10)]
    tie = ok(judge(page, c, "compare", other=a.pk, verdict="tie"))
    assert tie["message"].endswith(f"It replaces your earlier comparison of experiences {a.pk} and {c.pk} "
                                   f"({a.pk} was better).")
    assert [(p.chosen_ids[0], p.rejected_ids[0]) for p in DjangoExperienceBuffer(run.pk).sample_pairs(8)] == [
        (11, 10)
    ]  # a tie is no pair


def test_a_pair_is_trained_on_once_a_dpo_step_of_a_run_naming_it_as_source_ran(page, items, run, researcher):
    """The query that failed on SQLite (#42), answering: only steps that took pairs count, of this
    run or of a run whose `feedback.source_runs` names it."""
    a, b = items[:2]
    ok(judge(page, a, "compare", other=b.pk, verdict="a_better"))
    elsewhere = Run.objects.create(name="other dpo", owner=researcher, config={"feedback": {"source_runs": [0]}})
    dpo = Run.objects.create(name="dpo", owner=researcher, config={"feedback": {"source_runs": [run.pk]}})
    MetricPoint.objects.create(run=elsewhere, role="trainer", step=1, values={"pairs": 4})
    MetricPoint.objects.create(run=dpo, role="trainer", step=1, values={"loss": 0.3})  # no pairs yet
    assert ok(page.get(reverse("annotate-api-progress")))["history"][0]["trained_on_step"] is None
    MetricPoint.objects.create(run=dpo, role="trainer", step=2, values={"pairs": 4})
    assert ok(page.get(reverse("annotate-api-progress")))["history"][0]["trained_on_step"] == 2


def test_the_form_without_javascript_says_what_a_comparison_replaced(page, items):
    a, b = items[:2]
    url = reverse("annotate-compare", args=[a.pk])
    page.post(url, {"other": b.pk, "verdict": "a_better"})
    response = page.post(url, {"other": b.pk, "verdict": "both_bad"}, follow=True)
    assert (f"Saved your comparison of experience {a.pk}. It replaces your earlier comparison of experiences "
            f"{a.pk} and {b.pk} ({a.pk} was better).") in response.content.decode()
    assert Feedback.objects.get().label == "both_bad"


def test_the_database_holds_one_comparison_per_annotator_and_pair_either_way_round(items, annotator):
    a, b, c = items[:3]
    pair = dict(user=annotator, kind=Feedback.Kind.PREFERENCE, value=1.0)
    Feedback.objects.create(experience=a, other=b, **pair)
    Feedback.objects.create(experience=a, other=c, **pair)  # another pair
    for chosen, rejected in ((a, b), (b, a)):
        with pytest.raises(IntegrityError), transaction.atomic():
            Feedback.objects.create(experience=chosen, other=rejected, **pair)
    other = create_user("other", "pw-for-tests-123", roles=(ANNOTATOR,))
    Feedback.objects.create(experience=b, other=a, **{**pair, "user": other})  # another annotator's
    with pytest.raises(IntegrityError), transaction.atomic():  # ratings stay one per item and annotator
        for _ in range(2):
            Feedback.objects.create(experience=a, user=annotator, kind=Feedback.Kind.RATING, value=1.0)


# -- undoing a flag puts back exactly the status it found -------------------------------------------


def test_undoing_a_flag_leaves_a_curators_rejection_in_place(page, items):
    """Issue #41: rejected -> flagged -> undo made the row consumed, or ready: trained on again."""
    trained, untrained = items[3], items[4]
    Experience.objects.filter(pk=trained.pk).update(status=Status.CONSUMED, consumed_at=timezone.now())
    for item in (trained, untrained):
        buffer_services.set_status(Experience.objects.filter(pk=item.pk), Status.REJECTED)  # the admin's action
        ok(judge(page, item, "flag", reason="wrong"))
        message = ok(undo(page))["message"]
        assert status(item) == Status.REJECTED
        assert message.endswith("It stays out of training: it was rejected before your flag, or since.")


@pytest.mark.parametrize("before", [Status.READY, Status.CONSUMED])
def test_undoing_a_flag_puts_back_the_status_it_found(page, items, before):
    item = items[3]
    Experience.objects.filter(pk=item.pk).update(
        status=before, consumed_at=timezone.now() if before == Status.CONSUMED else None
    )
    ok(judge(page, item, "flag", reason="harmful"))
    assert status(item) == Status.REJECTED
    ok(undo(page))
    assert status(item) == before


def test_a_row_a_step_held_when_it_was_flagged_comes_back_consumed(page, items, run):
    """The step trained on it (mark_used keeps the flag's rejection, with its time): undone, the
    flag must not make it ready to be trained on again."""
    buffer = DjangoExperienceBuffer(run.pk)
    held = buffer.sample(1, sources=["rollout"])
    item = Experience.objects.get(pk=held[0].id)
    ok(judge(page, item, "flag", reason="wrong"))
    buffer.mark_used(consumed=held)
    assert status(item) == Status.REJECTED
    ok(undo(page))
    assert status(item) == Status.CONSUMED


@pytest.mark.parametrize("undone_first", ["the first flag", "the second flag"])
def test_with_two_flags_the_row_is_back_only_once_both_are_undone(items, run, annotator, undone_first):
    run.config = {"feedback": {"judgements_per_item": 2}}
    run.save()
    item, users, clients = items[3], [annotator, create_user("second", "pw-for-tests-123", roles=(ANNOTATOR,))], {}
    for user in users:
        clients[user] = Client()
        clients[user].force_login(user)
        ok(judge(clients[user], item, "flag", reason="wrong"))
    first, second = users if undone_first == "the first flag" else users[::-1]
    message = ok(undo(clients[first], Feedback.objects.get(kind="flag", user=first).pk))["message"]
    assert status(item) == Status.REJECTED
    assert message.endswith("It stays out of training: another annotator flagged it too.")
    ok(undo(clients[second], Feedback.objects.get(kind="flag", user=second).pk))
    assert status(item) == Status.READY


def test_a_curators_decision_after_a_flag_is_what_undo_keeps(page, items):
    """Marked rejected (or ready) by a curator after the flag: the curator's status stays."""
    rejected, ready = items[3], items[4]
    for item, decided in ((rejected, Status.REJECTED), (ready, Status.READY)):
        ok(judge(page, item, "flag", reason="wrong"))
        buffer_services.set_status(Experience.objects.filter(pk=item.pk), decided)
        ok(undo(page))
        assert status(item) == decided


# -- the migration of existing comparisons -----------------------------------------------------------

BEFORE, AFTER = ("feedback", "0003_run_annotators"), ("feedback", "0004_comparisons_per_pair_and_undo_status")


def migrate(target):
    return migrate_to(target).get_model("feedback", "Feedback")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_existing_comparisons_migrate_to_one_per_pair_and_back(researcher):
    """Forwards: A-over-B and B-over-A by one annotator (the old rule allowed both) keep the newest.
    Backwards: two pairs sharing a preferred response keep the newest (the old rule holds one)."""
    run = Run.objects.create(name="migrated", owner=researcher, config={})
    a, b, c = (Experience.objects.create(run=run, rollout_index=n, response_text=str(n)) for n in range(3))
    user = researcher
    try:
        Old = migrate(BEFORE)
        pair = dict(user_id=user.pk, kind="preference", value=1.0)
        Old.objects.create(experience_id=a.pk, other_id=b.pk, **pair)  # older: b over a replaces it
        newer = Old.objects.create(experience_id=b.pk, other_id=a.pk, **pair)
        rating = Old.objects.create(experience_id=a.pk, user_id=user.pk, kind="rating", value=0.5)
        New = migrate(AFTER)
        assert set(New.objects.values_list("pk", flat=True)) == {newer.pk, rating.pk}
        assert New.objects.get(pk=rating.pk).status_before == ""
        second = New.objects.create(experience_id=b.pk, other_id=c.pk, **pair)  # b over c: a second pair
        Old = migrate(BEFORE)
        assert set(Old.objects.values_list("pk", flat=True)) == {second.pk, rating.pk}
    finally:
        migrate_to_newest()
