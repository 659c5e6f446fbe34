"""Issue #41, findings 8, 13, 14 and 16, each re-tried as the issue wrote it.

8: a run's tags an admin (or anything else) wrote that are no list of tags ("baseline", [1, 2],
{"a": 1}, 5, null) made the runs pages and the API a 500 for every researcher; null and a
5,000-deep list were a 500 on the admin's save. 13: refused uploads piled up in uploads/staged/
(ten of 21 MB: 213 MB for 24 h). 14: a websocket to an unknown path was an HTTP 500 with a
traceback. 16: a refused checkpoint's error quoted torch's advice to load with weights_only=False.
"""
import logging
import os

import pytest
import torch
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db.models import JSONField, Value
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.core.consumers import CLOSE_NOT_FOUND
from apps.runs import supervision
from apps.runs.api import token_for
from apps.runs.models import Checkpoint, Run
from apps.tasksets import staging
from apps.tasksets.models import Taskset, TasksetImport
from rftweb.asgi import application
from tests.workers.test_tasks import grpo_config, make_taskset
from workers.rft.config import RunConfig
from workers.rft.trainer_checkpoints import UnsafeCheckpoint, load_tensors

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users

# ---- 8: tags ------------------------------------------------------------------------------------

BAD_STORED_TAGS = ["baseline", [1, 2], {"a": 1}, 5, None]


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="tagged", owner=researcher, config={}, tags=["kept"])


def api_get(user, url) -> Client:
    return Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")


@pytest.mark.django_db
@pytest.mark.parametrize("value", BAD_STORED_TAGS, ids=repr)
def test_tags_that_are_no_list_of_tags_show_as_none_and_break_no_page(researcher_client, researcher, run, value):
    # Straight to the database, as JSON (None as JSON null, not SQL NULL: the column is NOT NULL).
    Run.objects.filter(pk=run.pk).update(tags=Value(value, output_field=JSONField()))
    for url in ("/", reverse("run-list"), reverse("run-detail", args=[run.pk])):
        response = researcher_client.get(url)  # the test client raises what would be a 500
        assert response.status_code == 200, url
        assert "runs tagged" not in response.content.decode(), url
    listed = api_get(researcher, reverse("api-runs"))
    one = api_get(researcher, reverse("api-run", args=[run.pk]))
    assert (listed.status_code, one.status_code) == (200, 200)
    assert listed.json()["results"][0]["tags"] == [] and one.json()["tags"] == []


@pytest.mark.django_db
def test_tags_nested_too_deep_to_read_show_as_none(researcher_client, researcher, run):
    """A 5,000-deep list written by hand: Python's JSON decoder raises RecursionError reading it."""
    from django.db import connection

    if connection.vendor == "sqlite":
        pytest.skip("SQLite's JSON_VALID check refuses nesting past 1,000: the database cannot hold it")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_run SET tags = %s::jsonb WHERE id = %s", ["[" * 5000 + "]" * 5000, run.pk])
    assert Run.objects.get(pk=run.pk).tags is None
    for url in ("/", reverse("run-list"), reverse("run-detail", args=[run.pk])):
        assert researcher_client.get(url).status_code == 200, url
    assert api_get(researcher, reverse("api-run", args=[run.pk])).json()["tags"] == []


@pytest.mark.django_db
def test_the_tag_filter_matches_only_a_list_of_tags(researcher_client, researcher, run):
    other = Run.objects.create(name="string", owner=researcher, config={})
    Run.objects.filter(pk=other.pk).update(tags=Value("kept", output_field=JSONField()))
    runs = researcher_client.get(reverse("run-list"), {"tag": "kept"}).context["runs"]
    assert [r.name for r in runs] == ["tagged"] and runs[0].shown_tags == ["kept"]


def admin_form(run: Run, **changes) -> dict:
    """The admin change form's POST for `run`, with `changes`."""
    return {"name": run.name, "owner": run.owner_id, "error": run.error, "notes": run.notes, "_save": "Save",
            "opened_notes_version": run.notes_version, **changes}


@pytest.mark.django_db
@pytest.mark.parametrize("text, message", [
    ("null", "tags are a JSON list of words"),
    ("[" * 5000 + "]" * 5000, "tags of 10,000 characters"),
    ("[1, 2]", "tags are a JSON list of words"),
    ('"baseline"', "tags are a JSON list of words"),
    ('{"a": 1}', "tags are a JSON list of words"),
    ("5", "tags are a JSON list of words"),
    ("[[[[1]]]]", "tags are a JSON list of words"),
    ("not json", "tags are a JSON list of words"),
    ('["two words"]', "tag &#x27;two words&#x27;: a tag has letters a-z, digits"),
    (str([f"t{i}" for i in range(11)]).replace("'", '"'), "11 tags: a run has at most 10"),
], ids=["null", "5000-deep", "ints", "string", "mapping", "number", "nested", "not-json", "bad-word", "eleven"])
def test_the_admin_refuses_tags_that_are_no_list_of_tags(client, curator, run, text, message):
    client.force_login(curator)
    response = client.post(reverse("admin:runs_run_change", args=[run.pk]), admin_form(run, tags=text))
    assert response.status_code == 200 and message in response.content.decode()
    run.refresh_from_db()
    assert run.tags == ["kept"]


@pytest.mark.django_db
def test_the_admin_saves_tags_by_the_run_pages_rule_and_shows_a_bad_stored_value(client, curator, run):
    client.force_login(curator)
    url = reverse("admin:runs_run_change", args=[run.pk])
    response = client.post(url, admin_form(run, tags='["Baseline", "lr-sweep", "baseline"]'))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.tags == ["baseline", "lr-sweep"]
    Run.objects.filter(pk=run.pk).update(tags=Value({"a": 1}, output_field=JSONField()))
    assert "{&quot;a&quot;: 1}" in client.get(url).content.decode()  # shown as stored, to be fixed here


@pytest.mark.django_db
def test_an_admin_save_of_notes_over_a_save_made_meanwhile_is_refused_and_counts_as_a_save(
    client, curator, researcher, run
):
    """The run page's notes and tags carry a version; the admin's form saved over them unchecked."""
    from apps.runs import notes

    client.force_login(curator)
    url = reverse("admin:runs_run_change", args=[run.pk])
    opened = admin_form(run, notes="curator's note")
    notes.set_notes_and_tags(run, researcher, notes="owner's note", tags="kept", version=run.notes_version)
    refused = client.post(url, opened)
    run.refresh_from_db()
    assert refused.status_code == 200 and "they were changed by res" in refused.content.decode()
    assert run.notes == "owner's note"
    saved = client.post(url, admin_form(run, notes="both notes"))
    assert saved.status_code == 302
    run.refresh_from_db()
    assert (run.notes, run.notes_version, run.notes_changed_by) == ("both notes", 2, curator)
    # the run page's form opened before the admin's save is refused in turn
    with pytest.raises(notes.NotesChanged):
        notes.set_notes_and_tags(run, researcher, notes="stale", tags="kept", version=1)


# ---- 13: staged uploads -------------------------------------------------------------------------

UPLOAD_URL = "/tasksets/imports/new/"
MB = 1000 * 1000


@pytest.fixture
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def upload_form(size: int, name="big.jsonl", **fields) -> dict:
    """The upload form with a file of `size` bytes, refused for its taskset name (taken)."""
    return {"file": SimpleUploadedFile(name, b"0" * size), "name": "taken", "format": "auto", "prompt_field": "q",
            "answer_field": "a", "metadata_fields": "", "difficulty_field": "", "description": "",
            "default_workflow": "single_turn", "default_reward_fn": "numeric", **fields}


def staged(media_root) -> list:
    directory = media_root / "staged"
    return sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime) if directory.exists() else []


@pytest.mark.django_db
def test_ten_refused_21_mb_uploads_keep_no_more_than_the_persons_cap(researcher_client, media_root):
    Taskset.objects.create(name="taken")
    pages = []
    for _ in range(10):
        response = researcher_client.post(UPLOAD_URL, upload_form(21 * MB))
        assert response.status_code == 200 and "already exists" in response.content.decode()
        pages.append(response)
        assert sum(p.stat().st_size for p in staged(media_root)) <= 64 * 1024**2
    # The person's newest three are kept (63 MB of their 64 MiB), the older seven are gone (210 MB were kept).
    assert len(staged(media_root)) == 3
    tokens = [page.context["kept"].token for page in pages]
    user = pages[0].wsgi_request.user
    assert [staging.find(token, user) is not None for token in tokens] == [False] * 7 + [True] * 3
    assert not TasksetImport.objects.exists()


@pytest.mark.django_db
def test_a_file_over_the_persons_cap_is_not_kept_and_the_page_says_so(researcher_client, media_root):
    Taskset.objects.create(name="taken")
    first = researcher_client.post(UPLOAD_URL, upload_form(1 * MB))
    token = first.context["kept"].token
    assert len(staged(media_root)) == 1

    response = researcher_client.post(UPLOAD_URL, upload_form(staging.USER_MAX_BYTES + MB, staged=token))

    assert response.status_code == 200 and response.context["kept"] is None
    assert response.context["form"].errors["file"] == [
        "65.0\xa0MB is more than the 64.0\xa0MB kept for a person between tries, so this file is not kept: "
        "choose it again when you send the form."
    ]
    assert "so this file is not kept" in response.content.decode()
    assert staged(media_root) == [], "neither the refused file nor the one it replaced is left"


@pytest.mark.django_db
def test_everyones_files_together_are_capped_and_the_oldest_swept(client, media_root, monkeypatch):
    monkeypatch.setattr(staging, "USER_MAX_BYTES", 100_000)
    monkeypatch.setattr(staging, "TOTAL_MAX_BYTES", 250_000)
    Taskset.objects.create(name="taken")
    tokens = {}
    for name in ("first", "second", "third"):
        user = create_user(name, PASSWORD, roles=[RESEARCHER])
        client.force_login(user)
        tokens[name] = (user, client.post(UPLOAD_URL, upload_form(100_000)).context["kept"].token)
    assert sum(p.stat().st_size for p in staged(media_root)) == 200_000
    assert [staging.find(token, user) is not None for user, token in tokens.values()] == [False, True, True]
    # The swept file's form asks for the file again, as an expired one's does.
    user, token = tokens["first"]
    client.force_login(user)
    response = client.post(UPLOAD_URL, upload_form(0, file="", staged=token, name="fresh"))
    assert response.context["form"].errors["file"] == ["The file chosen earlier is no longer kept; choose it again."]


# ---- 14: unknown websocket paths ----------------------------------------------------------------


def socket(path: str, client: Client | None = None) -> WebsocketCommunicator:
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost")]
    if client is not None:
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/ws/workers/", "/ws/runs/abc/", "/nothing", "/ws/" + "x" * 5000 + "\n"],
                         ids=["workers", "runs-abc", "nothing", "5000-chars"])
@pytest.mark.parametrize("logged_in", [True, False], ids=["researcher", "anonymous"])
def test_an_unknown_websocket_path_is_closed_with_4404_and_one_log_line(researcher, caplog, path, logged_in):
    client = Client()
    client.force_login(researcher)

    async def scenario():
        ws = socket(path, client if logged_in else None)
        connected, _ = await ws.connect()
        closed = await ws.receive_output(timeout=5)
        await ws.disconnect()
        return connected, closed

    with caplog.at_level(logging.INFO):
        assert async_to_sync(scenario)() == (True, {"type": "websocket.close", "code": CLOSE_NOT_FOUND})
    lines = [r for r in caplog.records if "unknown path" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0].getMessage()) < 300 and "\n" not in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records), "no traceback"


# ---- 16: a refused checkpoint's error -----------------------------------------------------------


class Payload:
    """Unpickling it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class ShellPayload(Payload):
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# torch words its refusal two ways (an allowlist it could be added to, or a module it blocks).
UNSAFE_ADVICE = ("weights_only=False", "weights_only` set to `False`", "add_safe_globals", "safe_globals")


@pytest.mark.parametrize("payload, names", [(Payload, "io.open"), (ShellPayload, "posix.system")])
def test_a_crafted_checkpoint_file_is_refused_in_our_words(tmp_path, payload, names):
    crafted = tmp_path / "step_3" / "rng.pt"
    crafted.parent.mkdir()
    torch.save({"python": payload(tmp_path / "pwned")}, crafted)
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_tensors(crafted)
    message = str(refused.value)
    assert message.startswith(f"rng.pt of checkpoint {crafted.parent} was refused as unsafe and not loaded")
    assert f"(it names {names})" in message and not any(advice in message for advice in UNSAFE_ADVICE)
    assert not (tmp_path / "pwned").exists()
    assert refused.value.__cause__ is None and refused.value.__suppress_context__  # torch's text nowhere


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_resumed_from_a_crafted_checkpoint_fails_without_advising_unsafe_loading(researcher, tmp_path):
    """The issue's run: its own checkpoint's rng.pt replaced by a pickle naming code, then resumed."""
    make_taskset()
    run = Run.objects.create(name="crafted", owner=researcher, status=Run.Status.STARTING,
                             config=RunConfig.from_dict(grpo_config(1)).to_dict())
    assert supervision.serve(run.pk, "loop") == "completed"
    checkpoint = Checkpoint.objects.filter(run=run).latest("version")
    marker = tmp_path / "pwned"
    rng = torch.load(f"{checkpoint.path}/rng.pt", weights_only=True)
    torch.save({**rng, "python": Payload(marker)}, f"{checkpoint.path}/rng.pt")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.STARTING, heartbeats={})

    assert supervision.serve(run.pk, "loop") == "failed"

    run.refresh_from_db()
    assert "rng.pt of checkpoint runs/" in run.error and "was refused as unsafe and not loaded" in run.error, run.error
    assert not any(advice in run.error for advice in UNSAFE_ADVICE), run.error
    assert not marker.exists()
