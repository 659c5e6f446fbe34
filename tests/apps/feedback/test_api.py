"""The annotation page's JSON endpoints (apps/feedback/api.py): the next item ahead, judging,
undo and progress; and hostile input: malformed JSON, wrong ids, another person's judgement, a run
the user may not annotate: a clear JSON error and nothing changed."""
import json

import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback import services
from apps.feedback.models import AnnotationLock, Feedback, RunAnnotators, SetAside


def post(client, url, body):
    return client.post(url, body if isinstance(body, (str, bytes)) else json.dumps(body),
                       content_type="application/json")


def judge_url(pk, action):
    return reverse("annotate-api-judge", kwargs={"pk": pk, "action": action})


@pytest.fixture
def page(annotator_client, make_experience, run):
    """The annotator on the item page of the newest of three items (the session's run is set)."""
    items = [make_experience() for _ in range(3)]
    annotator_client.get(reverse("annotate-experience", args=[items[2].pk]))
    return items


def test_the_next_item_is_taken_ahead_leaving_out_the_one_shown(annotator_client, annotator, page):
    data = annotator_client.get(reverse("annotate-api-next"), {"exclude": str(page[2].pk)}).json()
    assert data["item"]["id"] == page[1].pk and data["item"]["judgeable"] is True
    assert f'data-experience="{page[1].pk}"' in data["item"]["html"] and "response number 1" in data["item"]["html"]
    assert set(AnnotationLock.objects.filter(user=annotator).values_list("experience_id", flat=True)) == {
        page[1].pk, page[2].pk
    }


def test_judging_answers_the_session_count_and_history_and_undo_reopens_the_item(annotator_client, page):
    response = post(annotator_client, judge_url(page[2].pk, "rate"), {"point": 4, "seconds": 2.5})
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["session_count"] == 1 and data["history"][0]["summary"] == "rated 4"
    assert Feedback.objects.get().seconds_spent == 2.5
    undone = post(annotator_client, reverse("annotate-api-undo"), {}).json()
    assert undone["message"] == f"Undid your judgement of experience {page[2].pk} (rated 4)."
    assert undone["item"]["id"] == page[2].pk and undone["session_count"] == 0 and undone["history"] == []
    assert not Feedback.objects.exists()


def test_undo_and_the_history_follow_the_pages_run_not_the_one_another_tab_opened_last(
    annotator_client, page, researcher, tasks
):
    """Two tabs, two runs: `u` in the first tab undid the second tab's judgement (the session's run
    is the one opened last) and showed that run's history."""
    from apps.runs.models import Run

    other_run = Run.objects.create(name="other", owner=researcher, config={}, status=Run.Status.RUNNING)
    theirs = Experience.objects.create(run=other_run, task=tasks[0], explorer_step=0, rollout_index=0, group_id="o",
                                       prompt_text=tasks[0].prompt, response_text="other", prompt_ids=[1],
                                       response_ids=[2], action_mask=[1])
    post(annotator_client, judge_url(page[2].pk, "rate"), {"point": 4})  # tab A, run 1
    annotator_client.get(reverse("annotate-experience", args=[theirs.pk]))  # tab B opens the other run ...
    judged = post(annotator_client, judge_url(theirs.pk, "rate"), {"point": 3}).json()  # ... and rates there
    assert [h["summary"] for h in judged["history"]] == ["rated 3"]

    mine = page[2].run_id
    shown = annotator_client.get(reverse("annotate-api-progress"), {"run": mine}).json()
    assert [h["item"] for h in shown["history"]] == [page[2].pk]
    undone = post(annotator_client, reverse("annotate-api-undo"), {"run": str(mine)}).json()
    assert undone["message"] == f"Undid your judgement of experience {page[2].pk} (rated 4)."
    assert undone["history"] == [] and Feedback.objects.get().experience_id == theirs.pk
    refused = annotator_client.get(reverse("annotate-api-progress"), {"run": "1x"})
    assert refused.status_code == 400 and refused.json()["error"] == "run must be the id of a run, not '1x'"
    # Taken off the other run by its owner: its history is no longer shown (it was, run named)
    from apps.feedback.services import set_annotators

    set_annotators(other_run, researcher, open_to_all=False, usernames=[])
    off = annotator_client.get(reverse("annotate-api-progress"), {"run": other_run.pk})
    assert off.status_code == 403 and "you are not an annotator of run 'other'" in off.json()["error"]
    off = annotator_client.get(reverse("annotate-api-progress"))  # the session's run: tab B opened it last
    assert off.status_code == 403 and "you are not an annotator of run 'other'" in off.json()["error"]
    gone = annotator_client.get(reverse("annotate-api-progress"), {"run": 10**9})
    assert gone.status_code == 400 and "no run with id" in gone.json()["error"]


def test_a_contradicting_edit_answers_409_with_the_question_then_saves_when_confirmed(annotator_client, page):
    url = judge_url(page[2].pk, "edit")  # task 1: "What is 1 + 1?", reference 2
    asked = post(annotator_client, url, {"text": "It is 7."})
    assert asked.status_code == 409
    assert asked.json()["confirm"] == "The reference answer is 2; your edit's answer differs. Save anyway?"
    assert not Feedback.objects.exists()
    assert post(annotator_client, url, {"text": "It is 7.", "confirm": True}).status_code == 200
    assert Experience.objects.get(parent=page[2]).response_text == "It is 7."


@pytest.mark.parametrize("confirm", ["no", 2, "yes please"])
def test_confirm_is_true_or_false_not_any_value(annotator_client, page, confirm):
    """The JSON "confirm": "false" saved a contradicting edit without the question (any non-empty
    string was yes). Now "false" is no, and a value that is neither is refused."""
    url = judge_url(page[2].pk, "edit")
    response = post(annotator_client, url, {"text": "It is 7.", "confirm": confirm})
    assert response.status_code == 400 and "'confirm' must be true or false" in response.json()["error"]
    for no in (False, "false", "0", ""):
        assert post(annotator_client, url, {"text": "It is 7.", "confirm": no}).status_code == 409
    assert not Feedback.objects.exists()


@pytest.mark.parametrize("action, body, error", [
    ("rate", {"point": "3", "comment": "\ud800"}, "the comment must not contain a lone surrogate (\\ud800)"),
    ("flag", {"reason": "wrong", "comment": "x\udfff"}, "the comment must not contain a lone surrogate"),
    ("edit", {"text": "ok \udfff", "confirm": True}, "the edited response must not contain a lone surrogate"),
])
def test_a_lone_surrogate_in_what_was_typed_is_a_400_naming_the_field(annotator_client, page, action, body, error):
    """A surrogate in JSON ("\\ud800") reached the database, whose UTF-8 refused it: a 500."""
    response = post(annotator_client, judge_url(page[2].pk, action), body)
    assert response.status_code == 400 and error in response.json()["error"], response.content
    assert not Feedback.objects.exists() and not Experience.objects.filter(parent=page[2]).exists()


def test_skip_and_postpone_go_through_the_same_endpoint(annotator_client, annotator, page):
    assert post(annotator_client, judge_url(page[2].pk, "skip"), {}).status_code == 200
    assert post(annotator_client, judge_url(page[1].pk, "postpone"), {}).status_code == 200
    set_aside = sorted(SetAside.objects.values_list("experience_id", "postponed"))
    assert set_aside == [(page[1].pk, True), (page[2].pk, False)]


@pytest.mark.parametrize("body, status, error", [
    ("{not json", 400, "the request body is not JSON"),
    ("[1, 2]", 400, "must be a JSON object, not list"),
    ({"point": ["4"]}, 400, "the field 'point' must be a string, a number or true/false, not list"),
    ({"point": "11"}, 400, "rating '11' is not on this run's scale"),
    ({"point": "4", "seconds": "soon"}, 400, "seconds must be a number"),
])
def test_a_malformed_judgement_is_a_clear_json_error_and_changes_nothing(annotator_client, page, body, status, error):
    response = post(annotator_client, judge_url(page[2].pk, "rate"), body)
    assert response.status_code == status and error in response.json()["error"], response.content
    assert not Feedback.objects.exists()
    page[2].refresh_from_db()
    assert "human" not in page[2].reward_components


def test_wrong_ids_and_actions_are_404s_that_say_so(annotator_client, page):
    missing = Experience.objects.order_by("-pk").first().pk + 100
    assert post(annotator_client, judge_url(missing, "rate"), {"point": "4"}).json() == {
        "error": f"experience {missing} does not exist"
    }
    assert annotator_client.get(reverse("annotate-api-item", args=[missing])).status_code == 404
    response = post(annotator_client, judge_url(page[2].pk, "delete"), {})
    assert response.status_code == 404 and "unknown action 'delete'" in response.json()["error"]
    assert annotator_client.get(reverse("annotate-api-next"), {"exclude": "1,x"}).status_code == 400
    for bad in ({"feedback": "x"}, {"feedback": -1}):
        assert post(annotator_client, reverse("annotate-api-undo"), bad).status_code == 400
    form = annotator_client.post(judge_url(page[2].pk, "rate"), {"point": "4"})
    assert form.status_code == 400 and "send the body as JSON" in form.json()["error"]
    assert not Feedback.objects.exists()


def test_an_annotator_cannot_undo_another_persons_judgement(annotator_client, make_annotator, page):
    theirs = services.rate(page[0].pk, make_annotator("other"), "4")
    response = post(annotator_client, reverse("annotate-api-undo"), {"feedback": theirs.pk})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error == f"you have no judgement {theirs.pk} to undo: it was undone already, or is not yours"
    assert Feedback.objects.get() == theirs


def test_a_run_restricted_to_others_refuses_every_json_route_with_403(annotator_client, researcher, page, run):
    RunAnnotators.objects.create(run=run, open_to_all=False)
    assert annotator_client.get(reverse("annotate-api-next")).status_code == 403
    assert annotator_client.get(reverse("annotate-api-item", args=[page[0].pk])).status_code == 403
    refused = post(annotator_client, judge_url(page[0].pk, "rate"), {"point": "4"})
    assert refused.status_code == 403 and "you are not an annotator of run" in refused.json()["error"]
    assert "response number" not in refused.content.decode()
    assert not Feedback.objects.exists()


def test_the_json_routes_need_the_csrf_token(client, annotator, page):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(annotator)
    assert post(strict, judge_url(page[2].pk, "rate"), {"point": "4"}).status_code == 403
    assert not Feedback.objects.exists()


def test_a_missing_route_under_the_annotation_api_answers_json(annotator_client):
    """Django's own 404 there is JSON too: the page's script reads every answer as JSON."""
    response = annotator_client.get("/annotate/api/no-such-thing/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert "error" in response.json()


def test_an_edit_refused_as_the_run_finished_shows_the_response_and_keeps_the_edit(annotator_client, page):
    """The item came back with the response hidden (as while editing) and no editor: neither the
    response nor the edit typed was on the page."""
    item = page[2]
    Experience.objects.filter(pk=item.pk).update(status="consumed")
    item.run.status = "stopped"
    item.run.save()
    refused = post(annotator_client, judge_url(item.pk, "edit"), {"text": "my <fix>"})
    assert refused.status_code == 400 and refused.json()["item"]["judgeable"] is False
    html = refused.json()["item"]["html"]
    assert f'id="annotate" data-experience="{item.pk}" data-refused' in html
    assert f'id="response">{item.response_text}</div>' in html and 'id="edit-form"' not in html
    assert '<div id="unsaved-edit"><p class="muted small">Your edit, not saved:</p>' in html
    assert "my &lt;fix&gt;</textarea>" in html and not Feedback.objects.exists()
    # Asked again (annotate.js does when the run's status changes): refused, the edit slot empty and hidden.
    again = annotator_client.get(reverse("annotate-api-item", args=[item.pk])).json()["item"]
    assert again["judgeable"] is False and '<div id="unsaved-edit" hidden>' in again["html"]
