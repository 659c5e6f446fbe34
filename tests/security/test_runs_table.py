"""The runs list's table (apps/runs/run_table.py) under hostile input: its CSV is a researcher's, by
session or API token, never an annotator's; what a query names as a column, a sort or a filter
reaches SQL only as a parameter, and anything the list cannot read is a message (the page) or a
400 naming it (the CSV), never a 500; and a run's name, tags or config that a spreadsheet would
run as a formula stays text in the CSV."""

import csv
import io

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse

from apps.runs import services
from apps.runs.api import token_for
from apps.runs.models import Run, RunListColumns
from apps.runs.run_columns import DEFAULT_COLUMNS

HOSTILE_IDS = [
    "trainer.lr; DROP TABLE runs_run; --",
    "explorer/' OR 1=1 --",
    'explorer/a"b',  # no SQLite JSON path holds a quote
    "explorer/values__contains",  # a Django lookup's name, as a key: only ever a parameter
    "eval/" + "x" * 5000,
    "best:best:explorer/reward_mean",
    "explorer/\u202ereward",
    "trainer/\x01",
    "sqlite_master.sql",
    "config.trainer.lr",
    ",,,",
]


def body(response) -> str:
    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def short(value) -> str:
    return ascii(value)[:40]


@pytest.fixture
def make_run(researcher):
    def make(name, config=None):
        return Run.objects.create(name=name, owner=researcher, config=config or {"trainer": {"total_steps": 1}})

    return make


@pytest.fixture
def listed_run(make_run):
    run = make_run("r", config={"trainer": {"lr": 1e-5, "total_steps": 10}})
    services.record_metrics(run, "explorer", 1, {"reward_mean": 0.5, "a'b": 1.0})
    return run


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_csv_is_a_researchers_by_session_or_token(annotator, researcher, listed_run):
    url = reverse("run-list-csv")
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    assert logged_in(annotator).get(url).status_code == 403
    by_annotator_token = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token_for(annotator)}")
    assert by_annotator_token.status_code == 403 and "error" in by_annotator_token.json()
    assert Client().get(url, HTTP_AUTHORIZATION="Bearer not-a-token").status_code == 401
    assert logged_in(researcher).get(url).status_code == 200
    assert Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").status_code == 200


def test_the_column_picker_is_a_researchers_and_posted(annotator, researcher):
    url = reverse("run-list-columns")
    anonymous = Client().post(url, {"cols": "status"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    assert logged_in(annotator).post(url, {"cols": "status"}).status_code == 403
    assert logged_in(researcher).get(url).status_code == 405
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(researcher)
    assert checked.post(url, {"cols": "status"}).status_code == 403  # no CSRF token
    assert not RunListColumns.objects.exists()


@pytest.mark.parametrize("column_id", HOSTILE_IDS, ids=short)
def test_hostile_columns_and_sorts_are_named_never_a_500(researcher_client, listed_run, column_id):
    page = researcher_client.get(reverse("run-list"), {"cols": f"status,{column_id}", "sort": column_id})
    assert page.status_code == 200 and len(page.context["runs"]) == 1
    assert [column.id for column in page.context["table"].columns] == ["status"]
    assert page.context["table"].errors or column_id == ",,,"
    download = researcher_client.get(reverse("run-list-csv"), {"cols": column_id})
    assert download.status_code == (200 if column_id == ",,," else 400), column_id
    assert Run.objects.count() == 1


@pytest.mark.parametrize("where", [
    *(f"{column_id} = 1" for column_id in HOSTILE_IDS),
    "trainer.lr = '; DROP TABLE runs_run; --",
    "trainer.lr = {\"a\": 1}",
    "trainer.lr = [1, 2]",
    "explorer/reward_mean >= 1e308",
    "explorer/reward_mean >= -0",
    "trainer.lr = 1" + "0" * 400,
    "= 1",
    ">=",
    "trainer.lr >= >= 1",
], ids=short)
def test_hostile_filters_are_named_never_a_500(researcher_client, listed_run, where):
    page = researcher_client.get(reverse("run-list"), {"where": where})
    assert page.status_code == 200
    download = researcher_client.get(reverse("run-list-csv"), {"where": where})
    assert download.status_code in (200, 400), where
    if download.status_code == 400:
        assert download.content.decode().startswith("Bad request: ")
    assert Run.objects.count() == 1


def test_a_metric_key_with_a_quote_sorts(researcher_client, listed_run):
    page = researcher_client.get(reverse("run-list"), {"cols": "explorer/a'b", "sort": "-explorer/a'b"})
    assert page.context["table"].errors == []
    assert [cell["text"] for _, cell in page.context["runs"][0].columns_and_cells] == ["1"]


def test_a_nul_anywhere_in_the_query_is_a_400(researcher_client, listed_run):
    for query in ({"cols": "status\x00"}, {"where": "trainer.lr = \x00"}, {"sort\x00": "name"}):
        assert researcher_client.get(reverse("run-list"), query).status_code == 400
        assert researcher_client.get(reverse("run-list-csv"), query).status_code == 400


def test_formulas_stay_text_in_the_csv(researcher_client, make_run):
    make_run("=cmd|' /C calc'!A0", config={"model": {"path": "@SUM(1+1)"}, "trainer": {"total_steps": 1}})
    text = body(researcher_client.get(reverse("run-list-csv"), {"cols": "model.path"}))
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["name"] == "'=cmd|' /C calc'!A0" and row["model.path"] == "'@SUM(1+1)"


def test_the_saved_columns_are_each_researchers_own(researcher, curator):
    mine, theirs = logged_in(researcher), logged_in(curator)
    mine.post(reverse("run-list-columns"), {"cols": ["trainer.lr"]})
    theirs.post(reverse("run-list-columns"), {"cols": ["algorithm.name"]})
    assert [c.id for c in mine.get(reverse("run-list")).context["table"].columns] == ["trainer.lr"]
    assert [c.id for c in theirs.get(reverse("run-list")).context["table"].columns] == ["algorithm.name"]


@pytest.mark.parametrize("stored, shown", [
    ({"a": 1}, list(DEFAULT_COLUMNS)), (5, list(DEFAULT_COLUMNS)), ("trainer.lr", list(DEFAULT_COLUMNS)),
    (["trainer.lr", 5, None, "bogus", "status"], ["trainer.lr", "status"]),
])
def test_a_saved_pick_written_by_hand_reads_as_what_it_can(researcher, listed_run, stored, shown):
    RunListColumns.objects.create(user=researcher, columns=stored)
    page = logged_in(researcher).get(reverse("run-list"))
    assert page.status_code == 200 and [column.id for column in page.context["table"].columns] == shown
