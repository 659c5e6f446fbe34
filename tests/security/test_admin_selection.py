"""A bulk action whose selection is no id (a crafted POST; apps/core/admin_selection.py) is refused with
a message naming it and changes nothing, on every admin of the site: `action=mark_rejected&
_selected_action=abc` to the experiences' changelist was a 500 (Django filtered pk__in with it). On
Postgres and SQLite."""
import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory

from apps.buffer.models import Experience
from apps.core.admin_selection import CheckedSelectionMixin
from apps.runs.models import Run

pytestmark = pytest.mark.django_db
HUGE = "99999999999999999999"  # past a bigint: SQLite raised OverflowError


def shown_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_a_curators_crafted_selection_is_refused_naming_it_and_nothing_changes(curator):
    run = Run.objects.create(name="r", owner=curator, config={})
    kept = Experience.objects.create(run=run, explorer_step=1, group_id="g", rollout_index=0, response_text="x")
    client = Client(raise_request_exception=False)
    client.force_login(curator)
    for bad in ("abc", HUGE):
        for confirm in ({}, {"confirm": "yes", "through": kept.pk}):  # the action, or its confirmation's Yes
            response = client.post("/admin/buffer/experience/", {"action": "mark_rejected", "index": 0,
                                                                 "_selected_action": [kept.pk, bad], **confirm},
                                   follow=True)
            assert response.status_code == 200 and response.redirect_chain[0][1] == 302
            assert shown_messages(response) == [f"Nothing was done: the selection sent {bad!r}, which is no "
                                                "experience id (a whole number)."]
    assert Experience.objects.get(pk=kept.pk).status == kept.status


def test_every_admin_checks_its_selection_before_any_action(db):
    """Each registered admin, each of its actions, as a superuser (who is offered every one)."""
    boss = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw-for-tests-123")
    client = Client(raise_request_exception=False)
    client.force_login(boss)
    request = RequestFactory().get("/admin/")
    request.user = boss
    tried = []
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, CheckedSelectionMixin), model
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for action in model_admin.get_actions(request):
            response = client.post(url, {"action": action, "index": 0, "_selected_action": "abc"})
            assert (response.status_code, response["Location"]) == (302, url), (url, action)
            tried.append((model.__name__, action))
    assert ("Experience", "mark_rejected") in tried and ("User", "delete_selected") in tried
    assert len({model for model, _ in tried}) == len(admin.site._registry)


def test_a_filter_by_an_id_past_a_bigint_goes_back_to_the_unfiltered_list(curator):
    """`?run=<20 digits>` on the experiences' changelist was a 500 on SQLite (OverflowError: Django
    guards an integer field's own exact lookup, not a foreign key's); now it is a wrong lookup, as
    `?run=abc` is (Django's ?e=1), on every id filter. A filter that fits still filters."""
    run = Run.objects.create(name="r", owner=curator, config={})
    Experience.objects.create(run=run, explorer_step=1, group_id="g", rollout_index=0, response_text="x")
    client = Client(raise_request_exception=False)
    client.force_login(curator)
    for query in (f"run={HUGE}", f"run__id__exact={HUGE}", f"id__in=1,{HUGE}", f"run=-{HUGE}", "run=abc",
                  f"explorer_step={HUGE}"):
        response = client.get(f"/admin/buffer/experience/?{query}")
        assert (response.status_code, response["Location"]) == (302, "/admin/buffer/experience/?e=1"), query
    fits = client.get(f"/admin/buffer/experience/?run={run.pk}")
    assert fits.status_code == 200 and fits.context["cl"].result_count == 1
    text = client.get(f"/admin/buffer/experience/?q={HUGE}")  # the search box takes any text
    assert text.status_code == 200
