"""The runs list as a table (apps/runs/run_table.py, run_columns.py): which columns a query names,
sorting by any of them in the database (numbers as numbers, nulls last, ties by id), filters on
config keys and metrics, the columns a researcher saves, and the CSV of every matching run.
On Postgres and SQLite alike: the SQL of each column is written for both."""

import csv
import io

import pytest
from asgiref.sync import async_to_sync
from django.http import QueryDict
from django.test import Client
from django.urls import reverse

from apps.runs import run_columns, run_table, services
from apps.runs.api import token_for
from apps.runs.models import Run, RunListColumns
from workers.rft.config import RunConfig

Status = Run.Status


def config(**keys):
    """A full config (as launch stores one) with dotted keys set: config(**{"trainer.lr": 1e-5})."""
    full = RunConfig().to_dict()
    for key, value in keys.items():
        section, name = key.split(".")
        full[section][name] = value
    return full


def listed(client, **query) -> list[str]:
    response = client.get(reverse("run-list"), query)
    assert response.status_code == 200
    return [run.name for run in response.context["runs"]]


def read_csv(response) -> list[dict]:
    """A streamed download read as the ASGI server reads it (the chunks are an async iterator)."""
    assert response.status_code == 200, response.content[:500]

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return list(csv.DictReader(io.StringIO(async_to_sync(read)().decode())))


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


# ---- columns -----------------------------------------------------------------------------------


def test_a_column_id_names_a_run_field_a_config_key_or_a_metric():
    assert run_columns.column("status").kind == "run"
    lr = run_columns.column("trainer.lr")
    assert (lr.kind, lr.numeric, lr.key) == ("config", True, "trainer.lr")
    assert run_columns.column("algorithm.name").numeric is False
    assert run_columns.column("model.lora.r").kind == "config"  # a key of an optional section
    latest = run_columns.column("explorer/reward_mean")
    assert (latest.kind, latest.role, latest.key, latest.summary) == ("metric", "explorer", "reward_mean", "latest")
    best = run_columns.column("best:trainer/loss")
    assert (best.summary, best.direction, best.label) == ("best", "min", "trainer/loss (best)")
    assert run_columns.column("best:eval/accuracy").direction == "max"
    # The engine's health figures are best low (a reviewer found "best" showing the worst of each).
    for key in ("explorer/truncated_frac", "explorer/advantage/zero_variance_groups", "trainer/logprob_mismatch",
                "explorer/failed_tasks", "explorer/prompt_truncated", "system/loop/idle_share", "trainer/grad_norm"):
        assert run_columns.column(f"best:{key}").direction == "min", key
    low, high = run_columns.column("min:explorer/reward_mean"), run_columns.column("max:trainer/loss")
    assert (low.summary, low.label, low.help) == ("min", "explorer/reward_mean (min)",
                                                  "the lowest explorer/reward_mean over the run")
    assert (high.summary, high.id, high.help) == ("max", "max:trainer/loss", "the highest trainer/loss over the run")


@pytest.mark.parametrize("column_id, message", [
    ("trainer.lrr", "unknown column 'trainer.lrr'; did you mean 'trainer.lr'?"),
    ("algorithm", "unknown column 'algorithm'"),  # a section, not a key
    ("learner/loss", "unknown metric role 'learner' in 'learner/loss'"),
    ("explorer/", "'explorer/' names no metric key after explorer/"),
    ("zzz", "a column is one of the run's own"),
])
def test_an_unknown_column_is_named_with_the_closest(column_id, message):
    with pytest.raises(run_columns.UnknownColumn, match=message.replace("?", r"\?").replace("(", r"\(")):
        run_columns.column(column_id)


def test_parse_columns_keeps_the_order_drops_repeats_and_the_name_and_names_the_bad():
    columns, errors = run_table.parse_columns("trainer.lr, name,status,trainer.lr,,bogus,best:trainer/loss")
    assert [column.id for column in columns] == ["trainer.lr", "status", "best:trainer/loss"]
    assert len(errors) == 1 and "unknown column 'bogus'" in errors[0]
    many = ",".join(list(run_columns.config_columns())[:60])
    columns, errors = run_table.parse_columns(many)
    assert len(columns) == run_table.MAX_COLUMNS and "at most 40" in errors[0]


def test_metric_keys_are_looked_up_flat_and_nested():
    assert run_columns.metric_paths("loss") == [["loss"]]
    assert run_columns.metric_paths("reward/mean") == [["reward/mean"], ["reward", "mean"]]
    assert len(run_columns.metric_paths("a/b/c/d")) == 8 and len(run_columns.metric_paths("a/b/c/d/e")) == 2


# ---- sorting -----------------------------------------------------------------------------------


@pytest.fixture
def lr_runs(make_run):
    """Learning rates whose text order is not their number order, one run without the key, one
    with null, and two that tie."""
    runs = {}
    for name, lr in (("a", 1e-5), ("b", 3e-4), ("c", 2e-6), ("d", 1e-5), ("e", 0.1)):
        runs[name] = make_run(name, config=config(**{"trainer.lr": lr}))
    runs["missing"] = make_run("missing", config={"trainer": {"total_steps": 100}})
    runs["null"] = make_run("null", config=config(**{"trainer.lr": None}))
    return runs


def test_a_config_number_sorts_as_a_number_nulls_last_ties_by_id(researcher_client, lr_runs):
    up = listed(researcher_client, sort="trainer.lr", cols="trainer.lr")
    assert up[:5] == ["c", "a", "d", "b", "e"]  # 2e-6 < 1e-5 (a before d: ids) < 3e-4 < 0.1
    assert set(up[5:]) == {"missing", "null"}
    down = listed(researcher_client, sort="-trainer.lr", cols="trainer.lr")
    assert down[:5] == ["e", "b", "d", "a", "c"]  # ties by id the same way: d after... before a
    assert set(down[5:]) == {"missing", "null"}


def test_a_config_text_sorts_as_text_and_booleans_apart(researcher_client, make_run):
    for name, algorithm, flag in (("x", "rloo", True), ("y", "grpo", False), ("z", "sft", True)):
        make_run(name, config={**config(**{"algorithm.drop_zero_std_groups": flag}),
                               "algorithm": {"name": algorithm, "drop_zero_std_groups": flag}})
    make_run("none", config={})
    assert listed(researcher_client, sort="algorithm.name") == ["y", "x", "z", "none"]
    assert listed(researcher_client, sort="-algorithm.name") == ["z", "x", "y", "none"]
    assert listed(researcher_client, sort="algorithm.drop_zero_std_groups") == ["y", "x", "z", "none"]


@pytest.fixture
def metric_runs(make_run):
    """Runs whose latest and best rewards order them differently; one without the metric."""
    runs = {name: make_run(name, status=Status.RUNNING) for name in ("steady", "peaked", "late", "silent")}
    for name, rewards in (("steady", [0.5, 0.6, 0.7]), ("peaked", [0.2, 0.9, 0.1]), ("late", [0.0, 0.1, 0.8])):
        for step, reward in enumerate(rewards):
            services.record_metrics(runs[name], "explorer", step, {"reward_mean": reward, "note": "x"})
            services.record_metrics(runs[name], "trainer", step, {"loss": 1 - reward, "nested": {"kl": reward}})
    services.record_metrics(runs["late"], "explorer", 3, {"seconds": 2.0})  # a later point without it
    services.record_metrics(runs["silent"], "explorer", 0, {"seconds": 1.0})
    return runs


def test_metrics_sort_by_their_latest_or_best(researcher_client, metric_runs):
    assert listed(researcher_client, sort="-explorer/reward_mean") == ["late", "steady", "peaked", "silent"]
    assert listed(researcher_client, sort="explorer/reward_mean") == ["peaked", "steady", "late", "silent"]
    assert listed(researcher_client, sort="-best:explorer/reward_mean") == ["peaked", "late", "steady", "silent"]
    # a loss's best is its lowest: peaked's 0.1 first when sorted best first (ascending)
    assert listed(researcher_client, sort="best:trainer/loss") == ["peaked", "late", "steady", "silent"]
    assert listed(researcher_client, sort="-trainer/nested/kl") == ["late", "steady", "peaked", "silent"]  # nested
    # min: and max: whatever the direction: the highest loss, the lowest reward
    assert listed(researcher_client, sort="-max:trainer/loss") == ["late", "peaked", "steady", "silent"]
    assert listed(researcher_client, sort="min:explorer/reward_mean") == ["late", "peaked", "steady", "silent"]


def test_the_page_shows_the_metric_columns(researcher_client, metric_runs):
    response = researcher_client.get(reverse("run-list"), {"cols": "explorer/reward_mean,best:explorer/reward_mean"})
    cells = {run.name: [cell["text"] for _, cell in run.columns_and_cells] for run in response.context["runs"]}
    assert cells == {"steady": ["0.7", "0.7"], "peaked": ["0.1", "0.9"], "late": ["0.8", "0.8"], "silent": [None, None]}
    html = response.content.decode()
    assert "explorer/reward_mean (best)" in html and 'title="the highest explorer/reward_mean over the run"' in html


def test_the_runs_own_columns_sort(researcher_client, make_run, curator):
    make_run("Bravo", trainer_step=50)
    make_run("alpha", owner=curator, trainer_step=10)
    make_run("charlie", mode=Run.Mode.EXPLORE, explorer_step=90, trainer_step=0)
    make_run("delta", config={})  # no total_steps: no progress, last
    assert listed(researcher_client, sort="name") == ["alpha", "Bravo", "charlie", "delta"]  # any case
    assert listed(researcher_client, sort="-progress") == ["charlie", "Bravo", "alpha", "delta"]
    assert listed(researcher_client, sort="owner")[0] == "alpha"  # cur before res
    assert listed(researcher_client) == ["delta", "charlie", "alpha", "Bravo"]  # newest first, as ever


def test_the_headers_sort_numbers_biggest_first_and_flip_on_a_second_click(researcher_client, make_run):
    make_run()
    response = researcher_client.get(reverse("run-list"), {"cols": "trainer.lr,algorithm.name,created", "page": "1",
                                                           "q": "r"})
    by_id = {header["column"].id: header for header in response.context["headers"]}
    assert by_id["trainer.lr"]["query"] == "cols=trainer.lr,algorithm.name,created&q=r&sort=-trainer.lr"  # no page
    assert QueryDict(by_id["algorithm.name"]["query"])["sort"] == "algorithm.name"  # text: A to Z first
    assert by_id["created"]["sorted"] == "descending" and QueryDict(by_id["created"]["query"])["sort"] == "created"
    assert 'aria-sort="descending"' in response.content.decode()
    flipped = researcher_client.get(reverse("run-list"), {"sort": "-trainer.lr"}).context["headers"]
    lr = next(header for header in flipped if header["column"].id == "trainer.lr")
    assert lr["sorted"] == "descending" and QueryDict(lr["query"])["sort"] == "trainer.lr"
    hidden = researcher_client.get(reverse("run-list"), {"cols": "status", "sort": "-trainer.lr"})
    assert "Sorted by trainer.lr, descending (not shown)" in hidden.content.decode()


def test_bad_columns_and_sorts_are_said_and_left_out_never_a_500(researcher_client, metric_runs):
    response = researcher_client.get(reverse("run-list"), {
        "cols": "trainer.lrr,explorer/rewrd_mean,status", "sort": "-best:bogus/x"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Columns: unknown column &#x27;trainer.lrr&#x27;; did you mean &#x27;trainer.lr&#x27;?" in html
    assert ("Columns: no run records &#x27;explorer/rewrd_mean&#x27; as a number; did you mean "
            "&#x27;explorer/reward_mean&#x27;?") in html
    assert "Sort: unknown metric role &#x27;bogus&#x27;" in html and "sorted newest first" in html
    assert [column.id for column in response.context["table"].columns] == ["status"]
    assert len(response.context["runs"]) == 4


# ---- filters -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where, expected", [
    (["trainer.lr = 1e-5"], {"a", "d"}),
    (["trainer.lr = 0.00001"], {"a", "d"}),  # the same number, written otherwise
    (["trainer.lr == 1e-05"], {"a", "d"}),
    (["trainer.lr >= 3e-4"], {"b", "e"}),
    (["trainer.lr ≥ 3e-4", "trainer.lr < 0.1"], {"b"}),
    (["trainer.lr != 1e-5"], {"b", "c", "e", "missing", "null"}),  # "differs": a run without it too
    (["trainer.lr = null"], {"null"}),
])
def test_config_filters(researcher_client, lr_runs, where, expected):
    assert set(listed(researcher_client, where=where)) == expected


def test_config_text_and_boolean_filters(researcher_client, make_run):
    make_run("g", config=config(**{"algorithm.name": "grpo", "algorithm.drop_zero_std_groups": True}))
    make_run("s", config=config(**{"algorithm.name": "sft"}))
    assert listed(researcher_client, where="algorithm.name = grpo") == ["g"]
    assert listed(researcher_client, where='algorithm.name = "sft"') == ["s"]
    assert listed(researcher_client, where="algorithm.drop_zero_std_groups = true") == ["g"]


def test_metric_filters(researcher_client, metric_runs):
    assert set(listed(researcher_client, where="explorer/reward_mean >= 0.7")) == {"steady", "late"}
    assert set(listed(researcher_client, where="best:explorer/reward_mean > 0.85")) == {"peaked"}
    # late's latest explorer point has no reward: the Reward column's value is none
    assert set(listed(researcher_client, where="reward >= 0.5")) == {"steady"}
    assert set(listed(researcher_client, where="best:trainer/loss <= 0.2")) == {"peaked", "late"}
    assert set(listed(researcher_client, where="max:trainer/loss >= 0.8")) == {"peaked", "late"}
    assert set(listed(researcher_client, where="min:explorer/reward_mean >= 0.5")) == {"steady"}


@pytest.mark.parametrize("where, message", [
    ("trainer.lr", "is not a filter: write a column, an operator"),
    ("trainer.lrr = 1", "unknown column &#x27;trainer.lrr&#x27;; did you mean &#x27;trainer.lr&#x27;?"),
    ("trainer.lr >= abc", "&#x27;abc&#x27; is not a number in &#x27;trainer.lr &gt;= abc&#x27;"),
    ("explorer/reward_mean >= NaN", "&#x27;NaN&#x27; is not a number"),
    ("trainer.lr >= 1e999", "&#x27;1e999&#x27; is not a number"),
    ("status = running", "status is not filtered here"),
    ("trainer.total_steps = 99999999999999999999999", "too large a whole number"),
    ("x" * 400 + " = 1", "a filter of 404 characters"),
])
def test_a_bad_filter_is_named_and_not_applied(researcher_client, lr_runs, where, message):
    response = researcher_client.get(reverse("run-list"), {"where": where})
    assert response.status_code == 200
    assert message in response.content.decode()
    assert len(response.context["runs"]) == len(lr_runs)


def test_a_filter_on_a_metric_no_run_records_says_so(researcher_client, metric_runs):
    response = researcher_client.get(reverse("run-list"), {"where": "explorer/rewad_mean >= 0.5"})
    assert "Filter &#x27;explorer/rewad_mean &gt;= 0.5&#x27;: no run records" in response.content.decode()
    assert response.context["runs"] == []


def test_each_filter_is_a_chip_that_removes_it_and_the_bad_one_is_marked(researcher_client, lr_runs):
    response = researcher_client.get(reverse("run-list"), {"where": ["trainer.lr > 0", "trainer.lr > x"],
                                                           "cols": "status", "page": "1"})
    chips = response.context["where"]
    assert [(chip["text"], chip["bad"]) for chip in chips] == [("trainer.lr > 0", False), ("trainer.lr > x", True)]
    assert QueryDict(chips[0]["remove"]).lists() and QueryDict(chips[0]["remove"]).getlist("where") == [
        "trainer.lr > x"]
    assert "page" not in QueryDict(chips[1]["remove"])
    # In words, not only in colour: a reviewer read the pink chip as a filter applied.
    text = response.content.decode()
    assert '<span class="chip bad">trainer.lr &gt; x · not applied <a' in text
    assert '<span class="chip">trainer.lr &gt; 0 <a' in text


def test_eleven_filters_are_too_many(researcher_client, lr_runs):
    response = researcher_client.get(reverse("run-list"), {"where": ["trainer.lr > 0"] * 11})
    assert "11 filters: at most 10" in response.content.decode()


# ---- the columns a researcher saves -------------------------------------------------------------


def test_the_picker_saves_the_columns_and_the_list_opens_with_them(researcher_client, researcher, metric_runs):
    response = researcher_client.post(reverse("run-list-columns"), {
        "cols": ["trainer.lr", "best:explorer/reward_mean", "bogus"], "query": "q=e&page=3&cols=status"})
    assert response.status_code == 302
    assert response["Location"] == reverse("run-list") + "?q=e&cols=trainer.lr,best:explorer/reward_mean"
    assert RunListColumns.objects.get(user=researcher).columns == ["trainer.lr", "best:explorer/reward_mean"]
    shown = researcher_client.get(reverse("run-list")).context["table"]
    assert [column.id for column in shown.columns] == ["trainer.lr", "best:explorer/reward_mean"]
    shared = researcher_client.get(reverse("run-list"), {"cols": "status"}).context["table"]
    assert [column.id for column in shared.columns] == ["status"]  # a link's columns win, and are not saved
    assert RunListColumns.objects.get(user=researcher).columns == ["trainer.lr", "best:explorer/reward_mean"]
    reset = researcher_client.post(reverse("run-list-columns"), {"reset": "", "query": "q=e&cols=status"})
    assert reset["Location"] == reverse("run-list") + "?q=e"
    assert not RunListColumns.objects.exists()
    default = researcher_client.get(reverse("run-list")).context["table"]
    assert tuple(column.id for column in default.columns) == run_columns.DEFAULT_COLUMNS


def test_a_pick_of_unknown_columns_only_keeps_the_saved_columns(researcher_client, researcher, metric_runs):
    """It saved an empty pick: the list showed names alone ("Columns 0") though nobody chose that."""
    researcher_client.post(reverse("run-list-columns"), {"cols": ["trainer.lr"], "query": ""})
    response = researcher_client.post(reverse("run-list-columns"), {"cols": ["bogus", "nope"], "query": "q=e"},
                                      follow=True)
    assert RunListColumns.objects.get(user=researcher).columns == ["trainer.lr"]
    assert [column.id for column in response.context["table"].columns] == ["trainer.lr"]
    said = [str(message) for message in response.context["messages"]]
    assert "Columns: none of the picked columns exists; your columns are as they were." in said
    assert any("bogus" in message for message in said)
    nothing = researcher_client.post(reverse("run-list-columns"), {"query": ""})  # every box unticked: names alone
    assert nothing.status_code == 302 and RunListColumns.objects.get(user=researcher).columns == []


def test_the_picker_offers_the_runs_metrics_latest_and_best(researcher_client, metric_runs):
    picker = researcher_client.get(reverse("run-list"), {"cols": "trainer.lr"}).context["picker"]
    groups = {group["title"]: [item["id"] for item in group["items"]] for group in picker}
    assert groups["Shown"] == ["trainer.lr"]
    assert "trainer.lr" not in groups["Config: trainer"] and "trainer.total_steps" in groups["Config: trainer"]
    assert groups["Metrics: explorer"] == [
        "explorer/reward_mean", "best:explorer/reward_mean", "min:explorer/reward_mean", "max:explorer/reward_mean",
        "explorer/seconds", "best:explorer/seconds", "min:explorer/seconds", "max:explorer/seconds"]
    assert "best:trainer/nested/kl" in groups["Metrics: trainer"]
    assert "explorer/note" not in groups["Metrics: explorer"]  # text is no metric


def test_the_home_dashboard_keeps_its_columns(researcher_client, researcher, make_run):
    make_run("shown")
    RunListColumns.objects.create(user=researcher, columns=["trainer.lr"])
    response = researcher_client.get(reverse("home"))
    assert [column.id for column in response.context["table"].columns] == list(run_table.HOME_COLUMNS)
    assert "shown" in response.content.decode()


# ---- CSV ---------------------------------------------------------------------------------------


def test_the_csv_has_the_columns_of_every_matching_run_in_order(researcher_client, metric_runs, monkeypatch):
    monkeypatch.setattr(run_table, "CSV_CHUNK_RUNS", 2)  # chunks join up
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {
        "cols": "status,progress,trainer.total_steps,explorer/reward_mean,best:trainer/loss,owner",
        "sort": "-best:explorer/reward_mean", "page": "2"}))
    assert [row["name"] for row in rows] == ["peaked", "late", "steady", "silent"]  # all, not a page
    assert list(rows[0]) == ["id", "name", "tags", "status", "progress", "trainer.total_steps",
                             "explorer/reward_mean", "best:trainer/loss", "owner"]
    assert rows[0]["explorer/reward_mean"] == "0.1" and float(rows[0]["best:trainer/loss"]) == pytest.approx(0.1)
    assert rows[3]["explorer/reward_mean"] == "" and rows[0]["owner"] == "res" and rows[0]["status"] == "running"
    assert rows[0]["trainer.total_steps"] == "100" and rows[0]["progress"] == "0.0"


def test_the_csv_filters_as_the_list_and_keeps_formulas_text(researcher_client, make_run):
    make_run("=HYPERLINK(1)", config=config(**{"trainer.lr": 1e-5, "algorithm.name": "grpo"}), tags=["keep"])
    make_run("other", config=config(**{"trainer.lr": 1e-4}))
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {
        "cols": "trainer.lr,algorithm.name", "where": "trainer.lr = 1e-5"}))
    assert rows == [{"id": str(Run.objects.get(tags=["keep"]).pk), "name": "'=HYPERLINK(1)", "tags": "keep",
                     "trainer.lr": "1e-05", "algorithm.name": "grpo"}]
    assert read_csv(researcher_client.get(reverse("run-list-csv"), {"where": "trainer.lr > 1"})) == []


@pytest.mark.parametrize("query, message", [
    ({"cols": "trainer.lrr"}, "Columns: unknown column 'trainer.lrr'; did you mean 'trainer.lr'?"),
    ({"sort": "nope"}, "Sort: unknown column 'nope'"),
    ({"where": "trainer.lr >= x"}, "where: 'x' is not a number"),
    ({"tag": "no way"}, "tag: 'no way' is not a tag"),
    ({"sortt": "name"}, "unknown query parameter: 'sortt'; did you mean 'sort'?"),
    ({"a": "1", "b": "2"}, "unknown query parameters: 'a', 'b'; known query parameters: q, status"),
])
def test_the_csv_refuses_what_it_would_leave_out(researcher_client, make_run, query, message):
    make_run()
    response = researcher_client.get(reverse("run-list-csv"), query)
    assert response.status_code == 400 and message in response.content.decode()


def test_the_pages_csv_link_carries_its_view(researcher_client, make_run):
    make_run()
    response = researcher_client.get(reverse("run-list"), {"tag": "no way", "q": "r", "page": "1",
                                                          "cols": "trainer.lr", "sort": "trainer.lr"})
    assert response.context["csv_query"] == "q=r&cols=trainer.lr&sort=trainer.lr"  # the bad tag left out
    assert f'href="{reverse("run-list-csv")}?q=r&amp;cols=trainer.lr&amp;sort=trainer.lr"' in response.content.decode()


def test_a_script_downloads_the_csv_with_its_token(script, make_run):
    make_run("by-token")
    rows = read_csv(script.get(reverse("run-list-csv"), {"cols": "status"}))
    assert [row["name"] for row in rows] == ["by-token"]
    refused = script.get(reverse("run-list-csv"), {"cols": "bogus"})
    assert refused.status_code == 400 and "unknown column 'bogus'" in refused.json()["error"]


def test_metric_points_of_other_roles_do_not_count(researcher_client, make_run):
    services.record_metrics(make_run("r"), "eval", 1, {"reward_mean": 5.0})
    services.record_metrics(make_run("other"), "explorer", 1, {"reward_mean": 1.0})
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {
        "cols": "explorer/reward_mean,eval/reward_mean", "sort": "name"}))
    assert [(row["explorer/reward_mean"], row["eval/reward_mean"]) for row in rows] == [("1.0", ""), ("", "5.0")]
