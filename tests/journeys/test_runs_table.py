"""A researcher reads the runs list as a table (docs/runs-list.md): picks the columns (a config key,
a metric's best), sorts by the metric, narrows to one learning rate, shares the address with a
colleague who sees the same table, and downloads it as CSV; the list opens with their columns the
next day. The runs' metrics are written as the engine writes them (services.record_metrics). In
Chromium on the full stack's server, and embedded through the same views (on SQLite too)."""
import csv
import io
import re
from urllib.parse import parse_qs, urlparse

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.runs import services
from apps.runs.models import Run
from workers.rft.config import RunConfig

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests-123"
# name: (trainer.lr, its rewards step by step): the best reward and the latest order them apart
RUNS = {
    "lr-low": (1e-6, [0.1, 0.2, 0.3]),
    "lr-mid-a": (1e-5, [0.2, 0.7, 0.4]),
    "lr-mid-b": (1e-5, [0.3, 0.5, 0.6]),
    "lr-high": (1e-4, [0.9, 0.2, 0.1]),
}
COLUMNS = "status,trainer.lr,best:explorer/reward_mean"


def make_runs(owner) -> dict[str, Run]:
    runs = {}
    for name, (lr, rewards) in RUNS.items():
        config = RunConfig().to_dict()
        config["trainer"]["lr"] = lr
        runs[name] = Run.objects.create(name=name, owner=owner, config=config, status=Run.Status.COMPLETED,
                                        trainer_step=len(rewards), explorer_step=len(rewards))
        for step, reward in enumerate(rewards, 1):
            services.record_metrics(runs[name], "explorer", step, {"reward_mean": reward, "seconds": 1.0})
            services.record_metrics(runs[name], "trainer", step, {"loss": 1 - reward})
    return runs


def names_in(page) -> list[str]:
    return page.locator("table.runs tbody tr td:nth-child(2) > a").all_inner_texts()


def test_a_researcher_picks_columns_sorts_by_best_reward_shares_and_downloads(researcher, page, login, browser,
                                                                              asgi_server, tmp_path):
    make_runs(researcher)
    login(researcher, "/runs/")
    expect(page.locator("table.runs thead")).to_contain_text("algorithm.name")  # the default columns

    page.locator("#column-picker summary").click()
    search = page.get_by_label("find a column")
    search.fill("reward_mean")
    # its latest, best, lowest and highest, and the Reward column that reads it (its help says so)
    expect(page.locator("#column-picker label:visible")).to_have_count(5)
    page.locator("#column-picker").get_by_label("explorer/reward_mean (best)").check()
    search.fill("")
    for shown in ("progress", "reward", "algorithm.name", "model.path", "owner", "created"):
        page.locator(f"#column-picker input[value='{shown}']").uncheck()
    page.get_by_role("button", name="Show these columns").click()
    page.wait_for_url(re.compile(r"cols="))
    assert parse_qs(urlparse(page.url).query)["cols"] == [COLUMNS]
    headers = page.locator("table.runs thead th").all_inner_texts()
    assert [header.strip() for header in headers[1:]] == ["Run", "Status", "trainer.lr", "explorer/reward_mean (best)"]

    page.get_by_role("link", name="explorer/reward_mean (best)").click()  # a number: highest first
    expect(page.locator("th[aria-sort=descending]")).to_contain_text("explorer/reward_mean (best)")
    assert names_in(page) == ["lr-high", "lr-mid-a", "lr-mid-b", "lr-low"]
    page.get_by_role("link", name="explorer/reward_mean (best) ▼").click()
    expect(page.locator("th[aria-sort=ascending]")).to_be_visible()
    assert names_in(page) == ["lr-low", "lr-mid-b", "lr-mid-a", "lr-high"]

    page.get_by_label("filter by a column").fill("trainer.lr = 1e-5")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".run-filters-applied")).to_contain_text("trainer.lr = 1e-5")
    assert names_in(page) == ["lr-mid-b", "lr-mid-a"]  # still sorted, lowest best first
    expect(page.locator("table.runs tbody")).to_contain_text("1e-05")
    page.set_viewport_size({"width": 1366, "height": 768})
    page.screenshot(path=str(tmp_path / "runs-table.png"))
    shared = page.url

    colleague = create_user("colleague", PASSWORD, roles=[RESEARCHER])
    theirs = browser.new_context(base_url=asgi_server).new_page()
    theirs.goto(shared)
    theirs.get_by_label("Username").fill(colleague.username)
    theirs.get_by_label("Password").fill(PASSWORD)
    theirs.get_by_role("button", name="Log in").click()
    theirs.wait_for_url(lambda url: "/runs/" in url)
    assert names_in(theirs) == ["lr-mid-b", "lr-mid-a"]
    expect(theirs.locator("th[aria-sort=ascending]")).to_contain_text("explorer/reward_mean (best)")
    theirs.goto("/runs/")  # the shared view is not saved as theirs
    expect(theirs.locator("table.runs thead")).to_contain_text("algorithm.name")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    assert download.value.suggested_filename == "runs.csv"
    rows = list(csv.DictReader(io.StringIO(open(download.value.path()).read())))
    assert [(row["name"], row["trainer.lr"], row["best:explorer/reward_mean"]) for row in rows] == [
        ("lr-mid-b", "1e-05", "0.6"), ("lr-mid-a", "1e-05", "0.7")]

    page.goto("/runs/")  # the next day: their columns, and an address that shares them
    expect(page.locator("table.runs thead")).to_contain_text("explorer/reward_mean (best)")
    page.wait_for_function("() => location.search.includes('cols=')")
    assert parse_qs(urlparse(page.url).query)["cols"] == [COLUMNS]


def body(response) -> str:
    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def test_embedded_the_same_through_the_same_views(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    make_runs(researcher)
    client = Client()
    client.force_login(researcher)
    picked = client.post(reverse("run-list-columns"), {"cols": COLUMNS.split(","), "query": ""})
    assert picked.status_code == 302 and picked.url == f"{reverse('run-list')}?cols={COLUMNS}"
    listed = client.get(reverse("run-list"), {"cols": COLUMNS, "sort": "best:explorer/reward_mean",
                                              "where": "trainer.lr = 1e-5"})
    assert [run.name for run in listed.context["runs"]] == ["lr-mid-b", "lr-mid-a"]
    shared = listed.wsgi_request.get_full_path()

    colleague = Client()
    colleague.force_login(create_user("colleague", PASSWORD, roles=[RESEARCHER]))
    theirs = colleague.get(shared)
    assert [run.name for run in theirs.context["runs"]] == ["lr-mid-b", "lr-mid-a"]
    assert theirs.context["table"].cols == COLUMNS
    assert "algorithm.name" in colleague.get(reverse("run-list")).context["table"].cols

    download = client.get(f"{reverse('run-list-csv')}?{listed.context['csv_query']}")
    rows = list(csv.DictReader(io.StringIO(body(download))))
    assert [(row["name"], row["best:explorer/reward_mean"]) for row in rows] == [("lr-mid-b", "0.6"),
                                                                                  ("lr-mid-a", "0.7")]
    assert client.get(reverse("run-list")).context["table"].cols == COLUMNS  # saved


# ---- grouped (?group=) ------------------------------------------------------------------------------


def test_a_researcher_groups_runs_by_learning_rate_reads_each_groups_mean_and_opens_one(researcher, page, login):
    make_runs(researcher)
    login(researcher, f"/runs/?cols={COLUMNS}")
    page.get_by_label("group by keys").fill("trainer.lr")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"group=trainer.lr"))
    expect(page.locator("#runs-form")).to_contain_text("3 groups by trainer.lr")
    rows = page.locator("table.runs.grouped > tbody > tr.group-row")
    expect(rows).to_have_count(3)
    # newest run first: lr-high's group, then the two runs of 1e-05 (best rewards 0.7 and 0.6), then lr-low's
    assert [text.split()[1] for text in rows.locator("td.group-name").all_inner_texts()] == ["0.0001", "1e-05", "1e-06"]
    middle = rows.nth(1)
    expect(middle.locator("td").nth(1)).to_have_text("2")
    expect(middle).to_contain_text("0.65 ± 0.05")  # the mean of the group's bests, ± their std
    expect(middle).to_contain_text("0.6 – 0.7")  # and their range

    page.get_by_role("link", name="explorer/reward_mean (best)").click()  # groups by their mean, highest first
    expect(page.locator("th[aria-sort=descending]")).to_contain_text("explorer/reward_mean (best)")
    assert [text.split()[1] for text in rows.locator("td.group-name").all_inner_texts()] == ["0.0001", "1e-05", "1e-06"]
    page.locator("tr.group-row", has_text="1e-05").locator("td.group-name a").first.click()  # opens in place
    opened = page.locator("tr.group-member")
    expect(opened).to_have_count(2)
    assert sorted(opened.locator("td.run-name > a").all_inner_texts()) == ["lr-mid-a", "lr-mid-b"]
    page.set_viewport_size({"width": 1366, "height": 768})
    # its runs sit in the group's columns (they were a table of their own, its columns elsewhere):
    # the group's value and count above a run's name, then a cell of each column under the group's
    group_cells = page.locator("tr.group-row.open > td")
    run_cells = opened.first.locator("td")
    assert group_cells.count() == run_cells.count() + 1
    for index in range(1, run_cells.count()):
        assert run_cells.nth(index).bounding_box()["x"] == group_cells.nth(index + 1).bounding_box()["x"]
    page.screenshot(path="/tmp/runsgroup-grouped.png", full_page=True)
    # Grouped, the toolbar wraps and Views sits at the left edge: its menu opens on screen (it began
    # at -309 px), with the name box to save this grouping under.
    page.locator("#saved-views summary").click()
    menu = page.locator("#saved-views .column-picker-pop").bounding_box()
    assert menu["x"] >= 0 and menu["x"] + menu["width"] <= 1366
    expect(page.get_by_label("view name")).to_be_in_viewport()
    page.keyboard.press("Escape")

    page.locator("tr.group-row", has_text="1e-05").get_by_role("link", name="list").click()  # its runs alone
    expect(page.locator(".run-filters-applied")).to_contain_text("trainer.lr = 1e-05")
    assert sorted(names_in(page)) == ["lr-mid-a", "lr-mid-b"]


def test_embedded_groups_through_the_same_views(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    make_runs(researcher)
    client = Client()
    client.force_login(researcher)
    response = client.get(reverse("run-list"), {"cols": COLUMNS, "group": "trainer.lr",
                                                "sort": "-best:explorer/reward_mean"})
    groups = response.context["groups"]
    assert [(group.values, len(group.runs)) for group in groups] == [((1e-4,), 1), ((1e-5,), 2), ((1e-6,), 1)]
    best = dict((column.id, cell) for column, cell in groups[1].cells)["best:explorer/reward_mean"]
    assert (round(best["mean"], 6), round(best["std"], 6), best["min"], best["max"]) == (0.65, 0.05, 0.6, 0.7)
    opened = client.get(f"{reverse('run-list')}?{groups[1].expand}")
    assert sorted(run.name for run in opened.context["runs"]) == ["lr-mid-a", "lr-mid-b"]
    alone = client.get(f"{reverse('run-list')}?{groups[1].listed}")
    assert sorted(run.name for run in alone.context["runs"]) == ["lr-mid-a", "lr-mid-b"]
    rows = list(csv.DictReader(io.StringIO(body(client.get(f"{reverse('run-list-csv')}?"
                                                            f"{response.context['csv_query']}")))))
    assert [(row["trainer.lr"], row["runs"], row["best:explorer/reward_mean max"]) for row in rows] == [
        ("0.0001", "1", "0.9"), ("1e-05", "2", "0.7"), ("1e-06", "1", "0.3")]
