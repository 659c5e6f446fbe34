"""A run's notes and tags: checked and saved by their owner or a curator; shown on the run page
and the runs list, which filters by tag."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from apps.accounts.services import create_user
from apps.runs.models import Run
from apps.runs.notes import NotesChanged, parse_tags, set_notes_and_tags

from .test_views import messages_of

NOTES = "/runs/{}/notes/"  # the run page's notes form (URL name run-notes)


def test_tags_are_split_on_commas_and_spaces_lowercased_and_deduplicated():
    assert parse_tags(" Baseline, lr-3e-4  v1.2 baseline,,grpo:kl ") == ["baseline", "lr-3e-4", "v1.2", "grpo:kl"]
    assert parse_tags("") == []


@pytest.mark.parametrize("text, says", [
    ("ok bad!tag", "'bad!tag': a tag has letters a-z, digits and . _ : -"),
    ("-leading", "'-leading'"),
    ("x" * 33, "at most 32 characters"),
    ('quo"te', "'quo\"te'"),
    (" ".join(f"t{i}" for i in range(11)), "11 tags: a run has at most 10"),
])
def test_bad_tags_are_refused_naming_the_problem(text, says):
    with pytest.raises(ValidationError) as raised:
        parse_tags(text)
    assert says in raised.value.messages[0]


def test_the_owner_saves_notes_and_tags(make_run, researcher):
    run = make_run("r")
    set_notes_and_tags(run, researcher, notes="  lr too high?\n", tags="baseline, sweep", version=run.notes_version)
    run.refresh_from_db()
    assert (run.notes, run.tags) == ("lr too high?", ["baseline", "sweep"])


def test_a_bad_tag_or_long_notes_change_nothing(make_run, researcher):
    run = make_run("r", notes="kept", tags=["kept"])
    for notes, tags in (("new", "ok b@d"), ("x" * 10_001, "ok")):
        with pytest.raises(ValidationError):
            set_notes_and_tags(run, researcher, notes=notes, tags=tags, version=run.notes_version)
    run.refresh_from_db()
    assert (run.notes, run.tags) == ("kept", ["kept"])


def test_another_researcher_may_not_edit_but_a_curator_may(make_run, curator):
    other = create_user("other", "pw-for-tests-123", roles=["researcher"])
    run = make_run("r")
    with pytest.raises(PermissionDenied):
        set_notes_and_tags(run, other, notes="mine now", tags="", version=run.notes_version)
    set_notes_and_tags(run, curator, notes="curated", tags="keep", version=run.notes_version)
    run.refresh_from_db()
    assert (run.notes, run.tags) == ("curated", ["keep"])


def test_the_run_page_form_saves_and_shows_them(researcher_client, make_run):
    run = make_run("r")
    response = researcher_client.post(NOTES.format(run.pk), {"notes": "try kl 0.1", "tags": "Sweep", "version": 0})
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
    html = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "try kl 0.1" in html and f'href="{reverse("run-list")}?tag=sweep"' in html
    assert 'name="tags" value="sweep"' in html  # its owner gets the form
    assert "{#" not in html  # no template comment shows


def test_the_form_says_why_it_saved_nothing(researcher_client, make_run):
    run = make_run("r", notes="before")
    response = researcher_client.post(NOTES.format(run.pk), {"notes": "after", "tags": "a,b;c", "version": 0})
    assert any("Notes and tags not saved: tag 'b;c'" in note for note in messages_of(response))
    assert Run.objects.get(pk=run.pk).notes == "before"


def test_a_refused_form_comes_back_open_with_what_was_typed_once(researcher_client, make_run):
    run = make_run("r", notes="before", tags=["kept"])
    typed = "a long note <b>worth keeping</b>\n" * 400  # over 10,000 characters: refused
    response = researcher_client.post(NOTES.format(run.pk), {"notes": typed, "tags": "new ünïcode", "version": 0})
    assert response["Location"] == reverse("run-detail", args=[run.pk]) + "#run-notes"
    html = researcher_client.get(response["Location"]).content.decode()
    assert '<details class="run-notes-edit" open>' in html
    assert 'name="tags" value="new ünïcode"' in html and escape(typed) in html
    assert "Notes and tags not saved: notes of 13,199 characters" in html  # the message says why
    again = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert '<details class="run-notes-edit">' in again and 'name="tags" value="kept"' in again
    assert (Run.objects.get(pk=run.pk).notes, Run.objects.get(pk=run.pk).tags) == ("before", ["kept"])


def test_others_read_the_notes_without_the_form(client, make_run, django_user_model):
    client.force_login(create_user("other", "pw-for-tests-123", roles=["researcher"]))
    run = make_run("r", notes="by its owner", tags=["a"])
    html = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "by its owner" in html and 'name="tags"' not in html
    assert f'href="{reverse("run-metrics-csv", args=[run.pk])}" download' in html  # its metrics, for anyone
    assert client.post(reverse("run-notes", args=[run.pk]), {"notes": "", "tags": "", "version": 0}).status_code == 403
    assert Run.objects.get(pk=run.pk).notes == "by its owner"


@pytest.mark.parametrize("tag, expected", [
    ("sweep", {"a", "b"}),
    ("Sweep", {"a", "b"}),
    ("sweep-2", {"c"}),
    ("swee", set()),  # a whole tag, not a part of one
    ("", {"a", "b", "c", "d"}),
])
def test_the_runs_list_filters_by_tag(researcher_client, make_run, tag, expected):
    make_run("a", tags=["sweep"]), make_run("b", tags=["base", "sweep"]), make_run("c", tags=["sweep-2"])
    make_run("d")
    response = researcher_client.get(reverse("run-list"), {"tag": tag})
    assert {run.name for run in response.context["runs"]} == expected


def test_the_runs_list_shows_tags_as_links_and_refuses_a_bad_one(researcher_client, make_run):
    make_run("a", tags=["sweep"])
    html = researcher_client.get(reverse("run-list")).content.decode()
    assert f'<a class="chip tag" href="{reverse("run-list")}?tag=sweep"' in html
    response = researcher_client.get(reverse("run-list"), {"tag": "no way"})
    assert "is not a tag" in response.content.decode() and len(response.context["runs"]) == 1  # not applied


def opened_version(client, run) -> str:
    """The version the run page's notes form was opened on."""
    html = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    return html.split('name="version" value="', 1)[1].split('"', 1)[0]


def test_a_save_from_a_page_opened_before_anothers_save_is_refused_keeping_both(
        researcher_client, make_run, curator, researcher):
    """The owner and a curator open the run page; the owner saves, then the curator saves from the
    page it had open: it used to wipe the owner's notes without a word."""
    run = make_run("r")
    client = Client()
    client.force_login(curator)
    owners, curators = opened_version(researcher_client, run), opened_version(client, run)
    researcher_client.post(NOTES.format(run.pk), {"notes": "owner: lr too high", "tags": "baseline",
                                                  "version": owners})
    response = client.post(NOTES.format(run.pk), {"notes": "curator: archived", "tags": "old", "version": curators})
    assert response["Location"] == reverse("run-detail", args=[run.pk]) + "#run-notes"
    run.refresh_from_db()
    assert (run.notes, run.tags) == ("owner: lr too high", ["baseline"])
    html = client.get(response["Location"]).content.decode()
    assert (f"Notes and tags not saved: they were changed by {researcher.username} at "
            f"{run.notes_changed_at:%Y-%m-%d %H:%M} UTC since you opened the page. Theirs are shown above, yours are "
            "in the form: merge them and Save again.") in html
    assert "owner: lr too high" in html and "curator: archived</textarea>" in html and 'value="old"' in html
    # The form goes on from the owner's version: saved again (merged), it is taken.
    merged = html.split('name="version" value="', 1)[1].split('"', 1)[0]
    client.post(NOTES.format(run.pk), {"notes": "owner: lr too high\ncurator: archived", "tags": "baseline old",
                                       "version": merged})
    run.refresh_from_db()
    assert (run.notes, run.tags, run.notes_changed_by) == ("owner: lr too high\ncurator: archived",
                                                           ["baseline", "old"], curator)


def test_of_two_saves_over_one_version_the_second_changes_nothing(make_run, researcher, curator):
    run = make_run("r")
    stale = Run.objects.get(pk=run.pk)  # a second reader of the same row
    set_notes_and_tags(run, researcher, notes="first", tags="a", version=0)
    with pytest.raises(NotesChanged, match=f"changed by {researcher.username} at"):
        set_notes_and_tags(stale, curator, notes="second", tags="b", version=0)
    with pytest.raises(NotesChanged, match="did not say which version"):  # a post without one
        set_notes_and_tags(stale, curator, notes="second", tags="b", version=None)
    assert Run.objects.filter(pk=run.pk).values_list("notes", "tags", "notes_version").get() == ("first", ["a"], 1)


# ---- the admin's save of a run --------------------------------------------------------------------


def _admin_form(run: Run, **changes) -> dict:
    return {"name": run.name, "owner": run.owner_id, "error": run.error, "notes": run.notes, "tags": "[]",
            "_save": "Save", "opened_notes_version": run.notes_version, **changes}


@pytest.mark.django_db(transaction=True)
def test_a_run_page_save_during_the_admins_save_waits_for_it_and_is_refused(make_run, researcher, curator):
    """The admin checked the notes' version in clean() and saved later, unconditionally: a run-page
    save landing in between was overwritten, and both counted as version 1. The row is locked from
    the check to the commit: the run page's save waits, then finds the version moved on."""
    import threading
    import time

    from django.db import connection

    from apps.runs.admin import RunAdmin

    run = make_run("r", notes="n")
    checked, outcome = threading.Event(), {}
    real_save = RunAdmin.save_model

    def run_page_save():  # the owner's Save on the run page, opened on version 0
        checked.wait(10)
        try:
            set_notes_and_tags(Run.objects.get(pk=run.pk), researcher, notes="owner's", tags="", version=0)
            outcome["saved"] = True
        except NotesChanged as refused:
            outcome["refused"] = str(refused)
        finally:
            connection.close()

    def save_model(self, request, obj, form, change):  # past clean()'s check, before the save
        checked.set()
        time.sleep(1)  # the run page's save is under way meanwhile (it had committed, unlocked)
        return real_save(self, request, obj, form, change)

    owner = threading.Thread(target=run_page_save)
    owner.start()
    RunAdmin.save_model = save_model
    try:
        client = Client()
        client.force_login(curator)
        response = client.post(reverse("admin:runs_run_change", args=[run.pk]), _admin_form(run, notes="curator's"))
    finally:
        RunAdmin.save_model = real_save
    owner.join(30)
    run.refresh_from_db()
    assert response.status_code == 302
    assert (run.notes, run.notes_version, run.notes_changed_by) == ("curator's", 1, curator)
    assert "changed by cur" in outcome.get("refused", ""), outcome


@pytest.mark.django_db
def test_an_admin_save_writes_only_what_its_form_changed(make_run, curator, monkeypatch):
    """A worker's write between the admin reading the run and saving it (a Stop, a step) stays."""
    from apps.runs.admin import RunAdmin

    run = make_run("r", status=Run.Status.RUNNING)
    real_get = RunAdmin.get_object

    def get_object(self, request, object_id, from_field=None):
        obj = real_get(self, request, object_id, from_field)
        Run.objects.filter(pk=obj.pk).update(status=Run.Status.STOPPING, explorer_step=7)  # the worker, meanwhile
        return obj

    monkeypatch.setattr(RunAdmin, "get_object", get_object)
    client = Client()
    client.force_login(curator)
    response = client.post(reverse("admin:runs_run_change", args=[run.pk]), _admin_form(run, name="renamed"))
    run.refresh_from_db()
    assert response.status_code == 302
    assert (run.name, run.status, run.explorer_step) == ("renamed", Run.Status.STOPPING, 7)
