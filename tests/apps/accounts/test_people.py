"""People (issue #44, item 5): a curator adds a person with roles, changes their roles, stops them
logging in and assigns them to runs, from the app's pages; nobody locks themselves out, a
superuser's roles stay the admin's, and a role taken away closes their live connections."""
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import ANNOTATOR, CURATOR, REVIEWER, roles_of
from apps.accounts.services import create_user
from apps.feedback import services as feedback
from apps.feedback.models import RunAnnotators
from apps.runs.models import Run


@pytest.fixture
def curator_client(curator):
    client = Client()
    client.force_login(curator)
    return client


def person(name):
    user = get_user_model().objects.get(username=name)
    user._rftweb_roles = None  # roles_of caches them on the object
    return user


def test_a_curator_adds_a_person_with_roles(curator_client):
    added = curator_client.post(reverse("people"), {"username": "dana", "email": "dana@example.org",
                                                    "password": "a long enough one 42", "roles": ["annotator"]})
    dana = person("dana")
    assert added.url == reverse("person-detail", args=[dana.pk])
    assert roles_of(dana) == {ANNOTATOR} and dana.check_password("a long enough one 42")
    listed = curator_client.get(reverse("people")).content.decode()
    assert "dana" in listed and "annotator" in listed
    refused = curator_client.post(reverse("people"), {"username": "DANA", "password": "x", "roles": ["wizard"]})
    errors = refused.context["form"].errors
    assert set(errors) == {"username", "roles"} and "taken" in errors["username"][0]
    weak = curator_client.post(reverse("people"), {"username": "eve", "password": "123"})
    assert "too short" in weak.context["form"].errors["password"][0]
    assert not get_user_model().objects.filter(username="eve").exists()


def test_roles_change_and_a_curator_is_staff(curator_client, annotator):
    curator_client.post(reverse("person-roles", args=[annotator.pk]), {"roles": [REVIEWER, CURATOR], "active": "on"})
    ann = person(annotator.username)
    assert roles_of(ann) >= {REVIEWER, CURATOR} and ann.is_staff
    curator_client.post(reverse("person-roles", args=[annotator.pk]), {"roles": [ANNOTATOR], "active": "on"})
    ann = person(annotator.username)
    assert roles_of(ann) == {ANNOTATOR} and not ann.is_staff
    curator_client.post(reverse("person-roles", args=[annotator.pk]), {"roles": [ANNOTATOR]})  # not active
    assert not person(annotator.username).is_active
    client = Client()
    assert not client.login(username=annotator.username, password="pw-for-tests-123")


def test_nobody_locks_themselves_out(curator_client, curator):
    answer = curator_client.post(reverse("person-roles", args=[curator.pk]), {"roles": [ANNOTATOR], "active": "on"},
                                 follow=True)
    assert "cannot take your own curator role" in answer.content.decode()
    curator_client.post(reverse("person-roles", args=[curator.pk]), {"roles": [CURATOR]})
    me = person(curator.username)
    assert CURATOR in roles_of(me) and me.is_active
    root = create_user("root", "pw-for-tests-123", is_superuser=True)
    said = curator_client.post(reverse("person-roles", args=[root.pk]), {"roles": [], "active": "on"}, follow=True)
    assert "superuser" in said.content.decode() and person("root").is_superuser
    curator_client.post(reverse("person-roles", args=[root.pk]), {"roles": []})  # and no login: neither happens
    assert person("root").is_active


def test_a_curator_assigns_an_annotator_to_a_run(curator_client, annotator, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    RunAnnotators.objects.create(run=run, open_to_all=False)
    assert not feedback.may_annotate(run, annotator)
    curator_client.post(reverse("person-assign", args=[annotator.pk]), {"run": run.pk})
    assert feedback.may_annotate(run, annotator)
    page = curator_client.get(reverse("person-detail", args=[annotator.pk])).content.decode()
    assert "Runs they are assigned to annotate" in page and "><bdi>r</bdi></a>" in page
    curator_client.post(reverse("person-assign", args=[annotator.pk]), {"run": run.pk, "action": "remove"})
    assert not feedback.may_annotate(run, annotator)
    nobody = create_user("nobody", "pw-for-tests-123")
    said = curator_client.post(reverse("person-assign", args=[nobody.pk]), {"run": run.pk}, follow=True)
    assert "no annotator role" in said.content.decode()


def test_only_curators_see_people(researcher_client, annotator):
    assert researcher_client.get(reverse("people")).status_code == 403
    assert researcher_client.post(reverse("person-roles", args=[annotator.pk]), {"roles": [CURATOR]}).status_code == 403
