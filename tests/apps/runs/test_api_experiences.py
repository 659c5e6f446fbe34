"""/api/runs/<id>/experiences/ for scripts: each human judgement read from the experience it is
listed under (a comparison under both of its experiences, saying which won) with its review state,
and the `after_id` cursor that polls a run while it writes. On Postgres and SQLite."""

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import REVIEWER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import review, services
from apps.feedback.models import Feedback
from apps.runs.api import token_for
from apps.runs.models import Run


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


@pytest.fixture
def run(make_run):
    return make_run(status=Run.Status.RUNNING)


def rollouts(run, n: int, *, step: int = 0, prompt: str = "What is 2 + 2?") -> list[Experience]:
    """n responses to one prompt (so any two of them compare), in id order."""
    made = [Experience.objects.create(run=run, explorer_step=step, group_id=f"g{step}", rollout_index=i,
                                      prompt_text=prompt, response_text=f"answer {i}", response_ids=[1, 2])
            for i in range(n)]
    return sorted(made, key=lambda e: e.pk)


def judgements(script, run, **query) -> dict[int, list[dict]]:
    """{experience id: its feedback} over one page of the run's experiences."""
    answer = script.get(reverse("api-run-experiences", args=[run.pk]), {"page_size": 500, **query})
    assert answer.status_code == 200, answer.content
    return {e["id"]: e["feedback"] for e in answer.json()["results"]}


def test_a_comparison_is_listed_under_both_experiences_each_saying_which_won(script, run, annotator):
    a, b = rollouts(run, 2)
    services.compare(a.pk, b.pk, annotator, "b_better")  # the annotator saw `a` as A and picked B

    feedback = judgements(script, run)

    common = {"kind": "preference", "label": "b_better", "a": a.pk, "b": b.pk, "annotator": annotator.username,
              "review": None}
    (on_a,), (on_b,) = feedback[a.pk], feedback[b.pk]
    assert on_a.items() >= ({"other": b.pk, "preferred": False, "value": 0.0} | common).items(), on_a
    assert on_b.items() >= ({"other": a.pk, "preferred": True, "value": 1.0} | common).items(), on_b


def test_a_tie_and_both_bad_prefer_neither_and_other_kinds_stay_as_they_were(script, run, annotator):
    a, b, c = rollouts(run, 3)
    services.compare(a.pk, b.pk, annotator, "tie")
    services.compare(b.pk, c.pk, annotator, "both_bad")
    services.rate(a.pk, annotator, "4", comment="close")

    feedback = judgements(script, run)

    seen = {pk: [(f["kind"], f["label"], f["other"], f["preferred"], f["value"]) for f in found]
            for pk, found in feedback.items()}
    assert seen == {
        a.pk: [("preference", "tie", b.pk, None, 0.5), ("rating", "4", None, None, 0.75)],
        b.pk: [("preference", "tie", a.pk, None, 0.5), ("preference", "both_bad", c.pk, None, 0.0)],
        c.pk: [("preference", "both_bad", b.pk, None, 0.0)],
    }
    rating = feedback[a.pk][1]
    assert (rating["comment"], rating["a"], rating["b"], rating["review"]) == ("close", None, None, None)


def test_a_changed_mind_reads_the_new_verdict_from_both_sides(script, run, annotator):
    a, b = rollouts(run, 2)
    services.compare(a.pk, b.pk, annotator, "a_better")
    services.compare(b.pk, a.pk, annotator, "a_better")  # the same pair, B shown first now: b wins

    feedback = judgements(script, run)

    assert [(f["preferred"], f["a"], f["b"]) for f in feedback[a.pk]] == [(False, b.pk, a.pk)]
    assert [(f["preferred"], f["a"], f["b"]) for f in feedback[b.pk]] == [(True, b.pk, a.pk)]


def test_each_judgement_says_its_review_state(script, make_run, annotator):
    run = make_run(status=Run.Status.RUNNING, config={"feedback": {"require_review": True}})
    reviewer = create_user("rev", "pw-for-tests-123", roles=(REVIEWER,))
    a, b, c = rollouts(run, 3)
    services.compare(a.pk, b.pk, annotator, "a_better")
    services.rate(c.pk, annotator, "2")
    services.flag(c.pk, annotator, "wrong")
    compared, rated = Feedback.objects.get(kind="preference"), Feedback.objects.get(kind="rating")

    assert [f["review"] for f in judgements(script, run)[a.pk]] == ["pending"]
    review.decide(compared.pk, reviewer, accept=True)
    review.decide(rated.pk, reviewer, accept=False)
    feedback = judgements(script, run)

    assert [f["review"] for f in feedback[a.pk]] == [f["review"] for f in feedback[b.pk]] == ["accepted"]
    assert [(f["kind"], f["review"]) for f in feedback[c.pk]] == [("rating", "rejected"), ("flag", None)]


# ---- the after_id cursor -----------------------------------------------------------------------


def poll(script, run, after_id: int, **query) -> dict:
    answer = script.get(reverse("api-run-experiences", args=[run.pk]), {"after_id": after_id, **query})
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_after_id_reads_each_row_once_in_id_order_while_the_run_writes(script, run):
    written = rollouts(run, 3, step=0)
    seen, cursor = [], 0
    first = poll(script, run, cursor, page_size=2)
    assert (first["count"], first["pages"], first["page"]) == (3, 2, 1)  # counted from the cursor on
    seen += [e["id"] for e in first["results"]]
    cursor = first["next_after_id"]
    # The run writes a newer step meanwhile: paged newest first, page 2 would now repeat rows.
    written += rollouts(run, 3, step=1)
    while (answer := poll(script, run, cursor, page_size=2))["results"]:
        seen += [e["id"] for e in answer["results"]]
        assert answer["next_after_id"] == answer["results"][-1]["id"]
        cursor = answer["next_after_id"]

    assert seen == sorted(e.pk for e in written)
    assert (answer["count"], answer["next_after_id"]) == (0, cursor)  # nothing new: poll again with it
    (later,) = rollouts(run, 1, step=2)
    assert [e["id"] for e in poll(script, run, cursor)["results"]] == [later.pk]


def test_after_id_keeps_the_filters_and_pages_by_number_stay_newest_first(script, run):
    old, new = rollouts(run, 2, step=0), rollouts(run, 2, step=1)
    Experience.objects.filter(pk=old[1].pk).update(source=Experience.Source.EXPERT)

    assert [e["id"] for e in poll(script, run, 0, source="rollout")["results"]] == [old[0].pk, *[e.pk for e in new]]
    paged = script.get(reverse("api-run-experiences", args=[run.pk])).json()
    assert [e["explorer_step"] for e in paged["results"]] == [1, 1, 0, 0] and paged["next_after_id"] is None


@pytest.mark.parametrize("query, message", [
    ({"after_id": "newest"}, "after_id must be an experience id"),
    ({"after_id": "-1"}, "after_id must be an experience id"),
    ({"after_id": "3", "page": "2"}, "after_id is a cursor: send it without page"),
])
def test_a_bad_cursor_is_a_400_naming_it(script, run, query, message):
    answer = script.get(reverse("api-run-experiences", args=[run.pk]), query)
    assert answer.status_code == 400 and answer.json()["error"].startswith(message)
