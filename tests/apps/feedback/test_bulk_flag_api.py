"""The bulk flag through the API (apps/runs/api/bulk_flag.py): a GET counts and names the items a
filter matches and changes nothing; a POST naming those items flags them as the page does, and
flags nothing when the items moved since (409); the run's owner or a curator only; bad input is a
400 naming it, with nothing flagged. On Postgres and SQLite."""
import json

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import ANNOTATOR, RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.api import token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def items(make_experience):
    """Six items: rewards 0, 0.2 ... 1.0; the filter reward_max=0.3 matches the first two."""
    return [make_experience(reward=n / 5, explorer_step=n) for n in range(6)]


class Api:
    def __init__(self, user):
        self.client, self.auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {token_for(user)}"}

    def count(self, run, **query):
        return self.client.get(reverse("api-run-bulk-flag", args=[run.pk]), query, **self.auth)

    def flag(self, run, body, path="api-run-bulk-flag"):
        return self.client.post(reverse(path, args=[run.pk]), json.dumps(body), content_type="application/json",
                                **self.auth)


def rejected() -> set[int]:
    return set(Experience.objects.filter(status="rejected").values_list("pk", flat=True))


def test_the_owner_counts_then_flags_exactly_the_items_counted_and_undoes_them(researcher, run, items):
    api = Api(researcher)
    counted = api.count(run, reward_max="0.3")
    assert counted.status_code == 200
    answer = counted.json()
    assert answer["count"] == 2 and answer["items"] == [items[1].pk, items[0].pk]  # newest first
    assert answer["filter"] == {"reward_max": "0.3"} and answer["described"] == "reward ≤ 0.3"
    assert not Feedback.objects.exists()  # counting changed nothing
    done = api.flag(run, {"filter": {"reward_max": 0.3}, "reason": "garbled", "items": answer["items"]})
    assert done.status_code == 200, done.content
    flagged = done.json()
    assert flagged["flagged"] == 2 and flagged["message"] == "Flagged 2 items." and flagged["refused"] == {}
    assert rejected() == {items[0].pk, items[1].pk}
    flags = Feedback.objects.filter(kind="flag")
    assert sorted(flagged["feedback"]) == sorted(flags.values_list("pk", flat=True))
    assert {(f.user_id, f.label, f.comment) for f in flags} == {(researcher.pk, "garbled", "bulk flag")}
    # Counted again: nothing left to flag.
    assert api.count(run, reward_max="0.3").json() | {"items": None} == answer | {"count": 0, "items": None}
    # Sent twice (a script's retry): the first flagged them; the second says so, not "look again".
    resent = api.flag(run, {"filter": {"reward_max": 0.3}, "reason": "garbled", "items": answer["items"]})
    assert resent.status_code == 200, resent.content
    assert resent.json() == {"flagged": 0, "feedback": [], "refused": {},
                             "message": "The 2 items carry your flag already (sent twice?): nothing changed."}
    undone = api.flag(run, {"feedback": flagged["feedback"]}, path="api-run-bulk-flag-undo")
    assert undone.status_code == 200
    assert undone.json() == {"undone": 2, "skipped": 0, "message": "Undid 2 flags."}
    assert rejected() == set() and not Feedback.objects.exists()
    again = api.flag(run, {"feedback": flagged["feedback"]}, path="api-run-bulk-flag-undo").json()
    assert (again["undone"], again["skipped"]) == (0, 2) and "undone already" in again["message"]


def test_items_that_moved_since_the_count_flag_nothing(researcher, run, items, make_experience):
    api = Api(researcher)
    shown = api.count(run, reward_max="0.3").json()["items"]
    newer = make_experience(reward=0.1)  # written after the count
    moved = api.flag(run, {"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": shown})
    assert moved.status_code == 409
    assert moved.json()["error"] == "the filter matches 3 items now, not the 2 you confirmed: look again and confirm"
    # As many went as came: the same count, other items.
    Experience.objects.filter(pk=items[0].pk).update(reward=0.9)
    swapped = api.flag(run, {"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": shown})
    assert swapped.status_code == 409 and "not the same ones you confirmed" in swapped.json()["error"]
    assert rejected() == set() and not Feedback.objects.exists()
    again = api.count(run, reward_max="0.3").json()["items"]
    assert again == [newer.pk, items[1].pk]
    assert api.flag(run, {"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": again}).status_code == 200
    assert rejected() == {newer.pk, items[1].pk}


@pytest.mark.parametrize("body, said", [
    ({"reason": "wrong", "items": []}, "filter must be an object"),
    ({"filter": {}, "reason": "wrong", "items": []}, "choose a filter"),
    ({"filter": {"reward_mx": "0.3"}, "reason": "wrong", "items": []}, "unknown filter field: 'reward_mx'"),
    ({"filter": {"reward_min": "1", "reward_max": "0.3"}, "reason": "wrong", "items": []},
     "filter: reward_min (1) is above reward_max (0.3)"),
    ({"filter": {"reward_max": "0.3"}, "reason": "rude", "items": []}, "unknown flag 'rude'"),
    ({"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": "all"}, "items must be a list of ids"),
    ({"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": [1, True]}, "items must be a list of ids"),
    # past a bigint: SQLite's driver raised OverflowError (a 500); Postgres matched nothing
    ({"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": [2**63]},
     "whole numbers from 1 to 9223372036854775807"),
    ({"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": [], "count": 2}, "unknown field in the body"),
])
def test_bad_input_is_refused_naming_it_and_flags_nothing(researcher, run, items, body, said):
    answer = Api(researcher).flag(run, body)
    assert answer.status_code == 400 and said in answer.json()["error"], answer.content
    assert rejected() == set() and not Feedback.objects.exists()


def test_undo_of_ids_past_a_bigint_is_a_400_on_either_database(researcher, run, items):
    for ids in ([2**63], [99999999999999999999]):
        answer = Api(researcher).flag(run, {"feedback": ids}, path="api-run-bulk-flag-undo")
        assert answer.status_code == 400 and "feedback must be a list of ids" in answer.json()["error"]


def test_a_null_filter_field_is_left_out_as_the_count_leaves_it(researcher, run, items):
    api = Api(researcher)
    shown = api.count(run, reward_max="0.3").json()["items"]
    done = api.flag(run, {"filter": {"reward_max": "0.3", "task": None}, "reason": "wrong", "items": shown})
    assert done.status_code == 200, done.content  # it was "task: not 'None'"
    assert rejected() == {items[0].pk, items[1].pk}


def test_a_bad_count_query_is_a_400_naming_it(researcher, run, items):
    api = Api(researcher)
    assert "filter: reward_max must be" in api.count(run, reward_max="lots").json()["error"]
    assert "choose a filter" in api.count(run).json()["error"]
    assert "unknown query parameter" in api.count(run, reward_mx="0.3").json()["error"]
    assert api.count(run, unscored="true").json()["count"] == 0


def test_only_the_owner_and_curators_flag_in_bulk(researcher, curator, run, items):
    other = create_user("other", "pw-for-tests-123", roles=(RESEARCHER,))
    annotator = create_user("ann2", "pw-for-tests-123", roles=(ANNOTATOR,))
    body = {"filter": {"reward_max": "0.3"}, "reason": "wrong", "items": [items[1].pk, items[0].pk]}
    for user, status in ((other, 403), (annotator, 403)):
        api = Api(user)
        assert api.count(run, reward_max="0.3").status_code == status
        assert api.flag(run, body).status_code == status
        assert api.flag(run, {"feedback": [1]}, path="api-run-bulk-flag-undo").status_code == status
    assert "only the owner of run 'r' or a curator" in Api(other).count(run, reward_max="0.3").json()["error"]
    assert rejected() == set()
    assert Client().get(reverse("api-run-bulk-flag", args=[run.pk]), {"reward_max": "0.3"}).status_code == 401
    flagged = Api(curator).flag(run, body)
    assert flagged.status_code == 200 and rejected() == {items[0].pk, items[1].pk}
    # The owner's undo names the curator's flags: not theirs, nothing undone.
    undone = Api(researcher).flag(run, {"feedback": flagged.json()["feedback"]}, path="api-run-bulk-flag-undo")
    assert (undone.json()["undone"], undone.json()["skipped"]) == (0, 2) and rejected() == {items[0].pk, items[1].pk}
    assert "not your flag of run" in undone.json()["message"]
    assert Api(researcher).count(run, reward_max="0.3").status_code == 200
    assert Client().get(reverse("api-run-bulk-flag", args=[99999]), {"reward_max": "0.3"},
                        HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}").status_code == 404
