"""A NUL typed or pasted into a page's form is an error beside its field, with the form as sent: the
middleware's plain-text 400 ("Bad request: the form field 'name' holds a NUL...") replaced the
whole form, and everything typed into it was lost. Pages whose forms read a field themselves, and
a NUL in a field's name, are still refused by the middleware (test_round3_web_errors). On Postgres
and SQLite."""
import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from apps.alerts.models import AlertSettings
from apps.runs.forms import LaunchForm
from apps.runs.models import Checkpoint, Report, Run
from apps.runs.presets import preset_config
from apps.saved_models.models import SavedModel
from apps.tasksets.models import Taskset, TasksetImport
from tests.apps.runs.test_launch import posted

NOTES = "/runs/{}/notes/"  # the run page's notes form (URL name run-notes)

pytestmark = pytest.mark.django_db
NUL_REFUSED = "Null characters are not allowed."  # Django's CharField


@pytest.fixture
def tasksets(db):
    return [Taskset.objects.create(name=name) for name in ("addition", "addition-eval", "arithmetic")]


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={}, notes="before")


def test_the_launch_form_names_a_nul_in_the_run_name_and_keeps_the_rest(researcher_client, tasksets):
    data = posted(LaunchForm.for_config(preset_config("quick-demo")), name="lr\x00 sweep",
                  **{"trainer.lr": "0.0003", "sweep": "trainer.lr: 1e-5, 3e-5"})
    response = researcher_client.post(reverse("run-launch"), data)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    form = response.context["form"]
    assert form.errors == {"name": [NUL_REFUSED]}  # and nothing about the config
    assert (form["name"].value(), form["trainer.lr"].value(), form["sweep"].value()) == \
        ("lr\x00 sweep", "0.0003", "trainer.lr: 1e-5, 3e-5")
    assert not Run.objects.exists()


def test_a_nul_in_the_yaml_box_is_named_there_and_not_as_an_empty_box(researcher_client, tasksets):
    yaml_box = "mode: both\x00\n"
    data = {**posted(LaunchForm.for_config(preset_config("quick-demo"), editor="yaml")), "yaml": yaml_box}
    response = researcher_client.post(reverse("run-launch"), data)
    assert response.context["form"].errors == {"yaml": [NUL_REFUSED]}
    assert response.context["form"]["yaml"].value() == yaml_box and not Run.objects.exists()


def test_a_report_names_a_nul_in_its_name_and_keeps_its_note(researcher_client, run):
    response = researcher_client.post(reverse("report-save"), {"runs": str(run.pk), "name": "a\x00b",
                                                               "note": "what these show"})
    assert response.status_code == 400 and response.context["report_form"].errors == {"name": [NUL_REFUSED]}
    assert "what these show</textarea>" in response.content.decode() and not Report.objects.exists()


def test_notes_name_a_nul_and_the_run_page_keeps_the_draft(researcher_client, run):
    response = researcher_client.post(NOTES.format(run.pk), {"notes": "typed\x00 here", "tags": "t", "version": 0})
    page = researcher_client.get(response["Location"]).content.decode()
    assert "Notes and tags not saved: the notes must not contain a NUL character (\\x00)." in page
    assert "typed\x00 here</textarea>" in page and Run.objects.get(pk=run.pk).notes == "before"


@pytest.fixture
def curator_client(curator):
    client = Client()
    client.force_login(curator)
    return client


def test_the_other_pages_forms_name_a_nul_beside_its_field(curator_client, run, tasksets, tmp_path):
    """People, alerts, Save as model and the taskset upload: each comes back with its form."""
    Checkpoint.objects.create(run=run, version=1, step=1, path=str(tmp_path / "v1"))
    forms = [
        (reverse("people"), {"username": "new\x00person", "password": "a-long-password-42", "email": "x@example.com"},
         "username", lambda: get_user_model().objects.filter(username__startswith="new").exists()),
        (reverse("alert-settings"), {"on_finish": "on", "stall_minutes": "45", "address": "me\x00@example.com"},
         "address", lambda: AlertSettings.objects.filter(stall_minutes=45).exists()),
        (reverse("model-save", args=[run.pk, 1]), {"name": "mine\x00", "note": "the best one"}, "name",
         SavedModel.objects.exists),
        (reverse("taskset-upload"), {"name": "sums\x00", "format": "auto", "prompt_field": "prompt",
                                     "answer_field": "answer", "description": "typed here",
                                     "file": SimpleUploadedFile("t.jsonl", b'{"prompt": "1+1", "answer": "2"}\n')},
         "name", TasksetImport.objects.exists),
    ]
    for url, data, field, stored in forms:
        response = curator_client.post(url, data)
        assert response.status_code in (200, 400) and response["Content-Type"].startswith("text/html"), url
        form = response.context["form"]
        assert NUL_REFUSED in form.errors[field], (url, form.errors)
        kept = next(key for key in data if key not in (field, "password", "file", "on_finish", "format"))
        assert escape(data[kept]) in response.content.decode(), (url, kept)
        assert not stored(), url


def test_a_nul_in_a_field_name_is_still_the_middlewares_400(researcher_client, tasksets):
    response = researcher_client.post(reverse("run-launch"), {"name": "x", "na\x00me": "y"})
    assert response.status_code == 400 and "the form field 'na?me' holds a NUL character" in response.content.decode()
