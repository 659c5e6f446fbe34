"""A researcher's saved views of the runs list (apps/runs/saved_views.py, RunListView): the columns,
grouping, sort and filters saved under a name, opened again from the list, a name once (refused,
saying how to replace it), deleted; their own alone; bad names and filters said. On Postgres and
SQLite alike."""

import html
from urllib.parse import parse_qs

import pytest
from django.http import QueryDict
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from apps.runs import saved_views
from apps.runs.models import RunListView

from .test_run_table import config

QUERY = "cols=trainer.lr,status&group=algorithm.name&sort=-trainer.lr&where=trainer.lr+%3E%3D+1e-5&status=completed"


def save(client, name, query=QUERY):
    return client.post(reverse("run-list-views"), {"name": name, "query": query}, follow=True)


def page_text(response) -> str:
    """The page's text, a name's <bdi> (apps.core.bidi.isolate, the ticks filter) dropped."""
    return html.unescape(response.content.decode().replace("<bdi>", "").replace("</bdi>", ""))


def test_a_view_saves_columns_grouping_sort_and_filters_and_opens_again(researcher_client, researcher, make_run):
    make_run("a", config=config(**{"trainer.lr": 1e-5, "algorithm.name": "grpo"}), status="completed")
    response = save(researcher_client, "  lr sweep  ")
    assert "Saved the view lr sweep." in page_text(response)
    saved = RunListView.objects.get(user=researcher)
    assert saved.name == "lr sweep"
    stored = parse_qs(saved.query)
    assert (stored["cols"], stored["group"], stored["sort"], stored["where"], stored["status"]) == (
        ["trainer.lr,status"], ["algorithm.name"], ["-trainer.lr"], ["trainer.lr >= 1e-5"], ["completed"])
    opened = researcher_client.get(f"{reverse('run-list')}?{saved.query}")
    assert opened.context["current_view"] == saved
    assert [group.values for group in opened.context["groups"]] == [("grpo",)]
    assert f'href="?{html.escape(saved.query)}" aria-current="page"' in opened.content.decode()
    assert researcher_client.get(reverse("run-list")).context["current_view"] is None


def test_several_views_listed_by_name_and_a_name_twice_refused_keeping_the_first(researcher_client, researcher):
    save(researcher_client, "b-view", "cols=status")
    save(researcher_client, "a-view", "cols=owner")
    refused = save(researcher_client, "b-view", "cols=created")
    assert ("You have a view named 'b-view' already: delete it first to save this one under its name, or pick "
            "another name") in page_text(refused)
    assert [(view.name, view.query) for view in refused.context["saved_views"]] == [
        ("a-view", "cols=owner&sort=-created"), ("b-view", "cols=status&sort=-created")]


def test_a_view_is_deleted_by_its_owner_alone(researcher_client, researcher, django_user_model, client):
    from apps.accounts.services import create_user

    other = create_user("other", "pw-for-tests-123", roles=[RESEARCHER])
    theirs = RunListView.objects.create(user=other, name="theirs", query="cols=status")
    mine = RunListView.objects.create(user=researcher, name="mine", query="cols=status")
    assert researcher_client.get(reverse("run-list")).context["saved_views"] == [mine]
    refused = researcher_client.post(reverse("run-list-views"), {"delete": theirs.pk}, follow=True)
    assert "No such view of yours" in page_text(refused) and RunListView.objects.filter(pk=theirs.pk).exists()
    deleted = researcher_client.post(reverse("run-list-views"), {"delete": mine.pk, "query": "cols=owner"}, follow=True)
    assert "Deleted the view mine." in page_text(deleted) and not RunListView.objects.filter(pk=mine.pk).exists()
    assert deleted.redirect_chain[-1][0] == f"{reverse('run-list')}?cols=owner"


@pytest.mark.parametrize("name, message", [
    ("   ", "Name the view to save it"),
    ("x" * 101, "A view's name of 101 characters: at most 100"),
    ("a\x07b", "A view's name holds a control character"),
    ("lr groups\u200b", "A view's name holds an invisible character (U+200B)"),  # read as "lr groups"
    ("evil\u202eweiv", "A view's name holds an invisible character (U+202E)"),
])
def test_a_bad_name_is_refused_and_nothing_saved(researcher_client, name, message):
    assert message in page_text(save(researcher_client, name))
    assert not RunListView.objects.exists()


def test_what_the_list_did_not_apply_is_left_out_of_the_view_and_said(researcher_client, researcher):
    response = save(researcher_client, "half", "cols=status,bogus&group=nope&where=trainer.lr+%3E%3D+x&q=a")
    text = page_text(response)
    assert "Saved the view half, without what was not applied" in text and "unknown column 'bogus'" in text
    assert QueryDict(RunListView.objects.get().query).dict() == {"q": "a", "cols": "status", "sort": "-created"}


def test_views_past_the_most_one_keeps_are_refused(researcher_client, researcher, monkeypatch):
    monkeypatch.setattr(saved_views, "MAX_VIEWS", 2)
    save(researcher_client, "one")
    save(researcher_client, "two")
    assert "You have 2 saved views, the most one keeps: delete one first" in page_text(save(researcher_client, "3"))
    assert RunListView.objects.count() == 2


def test_saving_a_view_needs_the_researcher_role(annotator_client):
    assert annotator_client.post(reverse("run-list-views"), {"name": "x", "query": ""}).status_code == 403
    assert not RunListView.objects.exists()
