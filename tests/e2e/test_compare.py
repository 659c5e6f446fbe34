"""Compare, metric downloads, tags and the charts' x axis in Chromium, against the real server:
two runs' config differences and summary, a run's metrics CSV as the browser downloads it, the
x axis a user picks (kept for the next page), and the runs list filtered by a tag a run's owner
set on its page.

Screenshots go to $RFTWEB_SCREENSHOTS (default test-artifacts/)."""

import copy
import csv
import io
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from playwright.sync_api import expect

from apps.runs import summaries
from apps.runs.models import MetricPoint, Run

from .test_dashboard import DEMO_CONFIG, seed_history

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("RFTWEB_SCREENSHOTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
SCREEN = {"width": 1366, "height": 768}
STEPS = 40
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
# The x axis of a chart as Plotly drew it, and its traces' first x (the page is compare or run).
X_AXIS = """(id) => { const el = document.querySelector(`[data-chart="${id}"]`);
  const first = (x) => (x instanceof Date ? x.toISOString() : x);
  return el && el.data ? {title: el.layout.xaxis.title.text, first: el.data.map((t) => first(t.x[0]))} : null; }"""


def seeded_run(name, owner, *, lr, seconds_a_step, **fields) -> Run:
    config = copy.deepcopy(DEMO_CONFIG)
    config["trainer"] = {**config.get("trainer", {}), "lr": lr, "total_steps": 200}
    run = Run.objects.create(name=name, owner=owner, config=config, status=Run.Status.COMPLETED,
                             trainer_step=STEPS, explorer_step=STEPS, **fields)
    seed_history(run, steps=STEPS)
    # No system points: they are numbered by times of their own. The others were recorded a step
    # every `seconds_a_step` from START.
    summaries.forget(run.metrics.filter(role="system"))
    run.metrics.update(time=ExpressionWrapper(
        Value(START) + F("step") * Value(timedelta(seconds=seconds_a_step)), output_field=DateTimeField()))
    return run


def x_axis(page, chart_id, title_prefix):
    page.locator(f'[data-chart="{chart_id}"]').scroll_into_view_if_needed()
    page.wait_for_function(f"(id) => ({X_AXIS})(id)?.title.startsWith({title_prefix!r})", arg=chart_id)
    return page.evaluate(X_AXIS, chart_id)


def test_compare_shows_the_config_diff_and_summary_and_downloads_a_runs_metrics_csv(
    page, login, researcher, page_errors
):
    fast = seeded_run("lr high", researcher, lr=0.001, seconds_a_step=30)
    slow = seeded_run("lr low", researcher, lr=0.0003, seconds_a_step=60)
    console = []
    page.on("console", lambda message: console.append(message.text))
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/compare/?runs={fast.pk}&runs={slow.pk}")

    # The config diff: the one key that differs, a column per run.
    diff = page.locator("#compare-config tbody tr")
    expect(diff).to_have_count(1)
    expect(diff.locator("th")).to_have_text("trainer.lr")
    expect(diff.locator("td")).to_have_text(["0.001", "0.0003"])
    # The summary: steps, and final and best of the key metrics, each per its direction.
    summary = page.locator("#compare-summary")
    expect(summary.locator("thead th")).to_have_text(["", re.compile("lr high"), re.compile("lr low")])
    expect(summary.locator("tr", has_text="Steps").locator("td")).to_have_text(["40 / 200", "40 / 200"])
    loss = MetricPoint.objects.get(run=fast, role="trainer", step=STEPS).values["loss"]
    expect(summary.locator("tr", has_text="Train loss, final").locator("td").first).to_have_text(f"{loss:.4g}")
    expect(summary.locator("tr", has_text="Train loss, best (lowest)")).to_be_visible()
    expect(summary.locator("tr", has_text="Held-out, best (highest)")).to_be_visible()
    thousands = re.compile(r"^\d{1,3}(,\d{3})+$")
    for tokens in ("Tokens trained (prompt + response)", "Tokens generated (responses)"):
        expect(summary.locator("tr", has_text=tokens).locator("td").first).to_have_text(thousands)
    x_axis(page, "eval/exact_match", "explorer step")  # drawn (charts are drawn as they come into view)
    # The page's legend names the runs; a legend in each chart's title row hid its title (walkthrough).
    assert page.evaluate("""() => [...document.querySelectorAll('[data-chart]')].filter((el) => el.layout)
        .every((el) => el.data.every((trace) => !trace.showlegend))""")
    expect(page.locator("#compare-legend")).to_contain_text(f"lr high #{fast.pk}")
    page.screenshot(path=SHOTS / "compare-charts.png")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=SHOTS / "compare.png")

    # The x axis: relative time counts from each run's own first point; the choice is kept.
    assert x_axis(page, "trainer/loss", "trainer step")["first"] == [1, 1, 1, 1]
    page.locator("[data-chart-x]").select_option("relative")
    # The runs' first points are their step-0 evaluations: trainer step 1 came 30 s (0.5 min) and
    # 60 s after (a line and its moving average each).
    assert x_axis(page, "trainer/loss", "time since start (min)")["first"] == [0.5, 0.5, 1, 1]
    page.goto(f"/runs/{fast.pk}/")
    expect(page.locator("[data-chart-x]")).to_have_value("relative")
    assert x_axis(page, "trainer/loss", "time since start (min)")["first"] == [0.5, 0.5]
    page.locator("[data-chart-x]").select_option("wall")
    assert x_axis(page, "trainer/loss", "time")["first"][0] == "2026-03-01T09:00:30.000Z"

    # A run's metrics as CSV, downloaded from the compare page: a row per value, long format.
    page.goto(f"/runs/compare/?runs={fast.pk}&runs={slow.pk}")
    with page.expect_download() as download:
        page.locator("#compare-summary thead th").nth(1).get_by_role("link", name="CSV").click()
    assert download.value.suggested_filename == f"lr-high-{fast.pk}-metrics.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert {row["run"] for row in rows} == {str(fast.pk)} and {row["name"] for row in rows} == {"lr high"}
    last_loss = next(row for row in rows if row["key"] == "trainer/loss" and row["step"] == str(STEPS))
    assert float(last_loss["value"]) == loss
    assert last_loss["time"] == (START + timedelta(seconds=30 * STEPS)).isoformat()
    assert len([row for row in rows if row["key"] == "eval/exact_match"]) == MetricPoint.objects.filter(
        run=fast, role="eval").count()
    assert page_errors == [] and not [line for line in console if "Content Security Policy" in line], console


def test_a_runs_owner_tags_it_and_the_runs_list_filters_by_tag(page, login, researcher, curator, page_errors):
    sweep = Run.objects.create(name="sweep a", owner=curator, config=DEMO_CONFIG, tags=["sweep"])
    both = Run.objects.create(name="sweep b", owner=curator, config=DEMO_CONFIG, tags=["baseline", "sweep"],
                              notes="the reference run")
    mine = Run.objects.create(name="mine", owner=researcher, config=DEMO_CONFIG)
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{mine.pk}/")

    # The owner adds tags and notes on the run page.
    page.get_by_text("Add notes and tags").click()
    page.get_by_label("Tags").fill("Sweep, mine")
    page.get_by_label("Notes").fill("kl 0.05: does it still learn?")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".flash")).to_contain_text("Saved the notes and tags of mine")
    expect(page.locator("#run-notes .chip")).to_have_text(["sweep", "mine"])
    expect(page.locator("#run-notes")).to_contain_text("kl 0.05: does it still learn?")
    page.screenshot(path=SHOTS / "run-page-notes.png")
    # A bad tag is refused, naming it, and nothing changes.
    page.get_by_text("Edit notes and tags").click()
    page.get_by_label("Tags").fill("sweep no!")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".flash.error")).to_contain_text("tag 'no!'")
    expect(page.locator("#run-notes .chip")).to_have_text(["sweep", "mine"])

    # Another's run: notes and tags to read, no form.
    page.goto(f"/runs/{both.pk}/")
    expect(page.locator("#run-notes")).to_contain_text("the reference run")
    expect(page.get_by_label("Tags")).to_have_count(0)

    # A tag chip on the run page leads to the runs list filtered by it.
    page.goto(f"/runs/{mine.pk}/")
    page.locator("#run-notes .chip", has_text="sweep").click()
    # (the list then writes its columns into the address, to share: docs/runs-list.md)
    expect(page).to_have_url(re.compile(r"/runs/\?tag=sweep&cols=status,progress,"))
    names = page.locator("table.runs tbody td:nth-child(2) > a")
    expect(names).to_have_text(["mine", "sweep b", "sweep a"])
    page.screenshot(path=SHOTS / "runs-list-tag.png")
    # A chip in the list filters by its tag; the filter box shows it and takes another.
    page.locator("table.runs .chip", has_text="baseline").click()
    expect(names).to_have_text(["sweep b"])
    expect(page.get_by_label("tag", exact=True)).to_have_value("baseline")
    page.get_by_label("tag", exact=True).fill("MINE")
    page.get_by_role("button", name="Filter").click()
    expect(names).to_have_text(["mine"])
    assert sweep.pk and page_errors == []


def test_the_charts_view_travels_in_the_link_the_samples_form_and_a_saved_report(page, login, researcher,
                                                                                  page_errors):
    """A typed filter was lost by Save report (/reports/1/ opened unfiltered) and by the Samples
    panel's Show, which also reset the smoothing: the toolbar only ever got ?filter= from the server."""
    fast = seeded_run("lr high", researcher, lr=0.001, seconds_a_step=30)
    slow = seeded_run("lr low", researcher, lr=0.0003, seconds_a_step=60)
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/compare/?runs={fast.pk}&runs={slow.pk}")
    x_axis(page, "eval/exact_match", "explorer step")  # drawn
    page.locator("[data-chart-filter]").fill("kl")
    page.locator("[data-chart-smoothing]").fill("0.9")  # a range input: fill sets it and fires change
    page.locator("[data-chart-log]").check()
    expect(page).to_have_url(re.compile(r"[?&]filter=kl(&|$)"))
    assert re.search(r"[?&]smoothing=0\.9(&|$)", page.url) and re.search(r"[?&]log=1(&|$)", page.url)
    shown = """() => [...document.querySelectorAll('[data-chart]')].filter((el) => !el.hidden)
        .map((el) => el.dataset.chart)"""
    assert page.evaluate(shown) == ["trainer/approx_kl"]

    # The samples panel's Show reloads the page with them.
    page.locator("#compare-samples").get_by_role("button", name="Show").click()
    page.wait_for_load_state()
    expect(page.locator("[data-chart-filter]")).to_have_value("kl")
    expect(page.locator("[data-chart-smoothing]")).to_have_value("0.9")
    expect(page.locator("[data-chart-log]")).to_be_checked()

    # A saved report opens as it was saved.
    page.locator("#save-report").get_by_label("Name").fill("kl of both")
    page.get_by_role("button", name="Save report").click()
    page.wait_for_url(re.compile(r"/reports/\d+/$"))
    expect(page.locator("[data-chart-filter]")).to_have_value("kl")
    expect(page.locator("[data-chart-smoothing]")).to_have_value("0.9")
    page.wait_for_function(f"() => ({shown})().length === 1")
    assert page.evaluate(shown) == ["trainer/approx_kl"]
    page.screenshot(path=SHOTS / "report-filtered.png")
    assert page_errors == []


def test_nine_runs_differ_by_colour_then_dash_and_the_legend_hides_a_runs_lines(page, login, researcher,
                                                                                 page_errors):
    """The palette has 8 colours and the 9th run's line was the 1st's, told apart by nothing."""
    runs = [seeded_run(f"sweep run {i}", researcher, lr=0.001 * (i + 1), seconds_a_step=30) for i in range(9)]
    page.set_viewport_size(SCREEN)
    login(researcher, "/runs/compare/?" + "&".join(f"runs={run.pk}" for run in runs))
    x_axis(page, "eval/exact_match", "explorer step")
    styles = """() => document.querySelector('[data-chart="eval/exact_match"]').data.filter((t, i) => i % 2 === 0)
        .map((t) => [t.line.color, t.line.dash, t.visible])"""
    drawn = page.evaluate(styles)
    assert len(drawn) == 9 and len({(color, dash) for color, dash, _ in drawn}) == 9
    assert drawn[8][0] == drawn[0][0] and (drawn[0][1], drawn[8][1]) == ("solid", "dash")
    assert page.locator("#compare-legend line").nth(8).get_attribute("stroke-dasharray") == "6 3"

    # Unticking a run in the legend hides its lines in every chart; ticking shows them again.
    page.locator("#compare-legend label", has_text=f"sweep run 8 #{runs[8].pk}").locator("input").uncheck()
    page.wait_for_function(f"() => ({styles})()[8][2] === false")
    loss = """() => document.querySelector('[data-chart="trainer/loss"]').data.map((t) => t.visible)"""
    page.locator('[data-chart="trainer/loss"]').scroll_into_view_if_needed()
    page.wait_for_function(f"() => ({loss})().length === 18 && ({loss})()[16] === false")
    page.screenshot(path=SHOTS / "compare-nine-runs.png")
    page.locator("#compare-legend label", has_text=f"sweep run 8 #{runs[8].pk}").locator("input").check()
    page.wait_for_function(f"() => ({loss})()[16] === true")
    assert page_errors == []


def test_the_run_picker_keeps_each_badge_whole_and_finds_older_runs(page, login, researcher, page_errors):
    old = Run.objects.create(name="the march baseline with a long descriptive name", owner=researcher,
                             config=DEMO_CONFIG, status=Run.Status.COMPLETED)
    for i in range(50):
        Run.objects.create(name=f"lr sweep · lr=0.0005 · repeat_times={i}", owner=researcher, config=DEMO_CONFIG,
                           status=Run.Status.COMPLETED)
    page.set_viewport_size(SCREEN)
    login(researcher, "/runs/compare/")
    picker = page.locator(".compare-picker")
    expect(picker.locator("label")).to_have_count(50)
    # Each badge inside the picker's box (they were cut at its right edge).
    cut = page.evaluate("""() => { const picker = document.querySelector('.compare-picker');
        // Inside its scrollbar.
        const right = picker.getBoundingClientRect().left + picker.clientLeft + picker.clientWidth;
        return [...picker.querySelectorAll('.status')]
          .filter((badge) => badge.getBoundingClientRect().right > right + 0.5 || badge.scrollWidth > badge.clientWidth)
          .map((badge) => badge.closest('label').textContent.trim()); }""")
    assert cut == []
    page.get_by_label("find runs by name or id").fill("march")
    page.get_by_role("button", name="Find").click()
    expect(picker.locator("label")).to_have_count(1)
    picker.get_by_label(re.compile("the march baseline")).check()
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#compare-summary thead")).to_contain_text(f"#{old.pk}")
    page.screenshot(path=SHOTS / "compare-picker-search.png")
    assert page_errors == []


def test_the_run_page_opens_as_its_link_says_and_keeps_changes_in_its_url(page, login, researcher, page_errors):
    """The run page ignored ?filter= (compare honoured it), and its smoothing, log scale and x axis
    lived in no link: a shared run page opened as the reader's own."""
    run = seeded_run("shared", researcher, lr=0.001, seconds_a_step=30)
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/?filter=loss&smoothing=0.3&log=1&x=wall")
    expect(page.locator("[data-chart-filter]")).to_have_value("loss")
    expect(page.locator("[data-chart-smoothing]")).to_have_value("0.3")
    expect(page.locator("[data-chart-log]")).to_be_checked()
    expect(page.locator("[data-chart-x]")).to_have_value("wall")
    assert x_axis(page, "trainer/loss", "time")["first"][0] == "2026-03-01T09:00:30.000Z"
    shown = """() => [...document.querySelectorAll('[data-chart]')].filter((el) => !el.hidden)
        .map((el) => el.dataset.chart).sort()"""
    assert page.evaluate(shown) == ["trainer/loss", "trainer/policy_loss", "trainer/sft_loss"]
    assert page.evaluate("() => document.querySelector('[data-chart=\"trainer/loss\"]').layout.yaxis.type") == "log"
    # Changes go into the URL: a copied link opens the page so.
    page.locator("[data-chart-filter]").fill("entropy")
    page.locator("[data-chart-x]").select_option("step")
    expect(page).to_have_url(re.compile(r"\?filter=entropy&smoothing=0\.3&log=1&x=step$"))
    page.reload()
    expect(page.locator("[data-chart-filter]")).to_have_value("entropy")
    expect(page.locator("[data-chart-x]")).to_have_value("step")
    assert page_errors == []


def test_a_run_that_is_still_training_grows_on_the_compare_page_as_it_does_on_its_own(page, login, researcher,
                                                                                     page_errors):
    """W&B's panels follow live runs; the compare page drew each run as it was when it loaded."""
    from apps.runs import services

    done = seeded_run("finished", researcher, lr=0.001, seconds_a_step=30)
    training = seeded_run("still training", researcher, lr=0.0003, seconds_a_step=30)
    Run.objects.filter(pk=training.pk).update(status=Run.Status.RUNNING)
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/compare/?runs={done.pk}&runs={training.pk}")
    points = """([id, name]) => { const el = document.querySelector(`[data-chart="${id}"]`);
        return el && el.data ? Math.max(0, ...el.data.filter((t) => t.name === name).map((t) => t.x.length)) : 0; }"""
    line = ["trainer/loss", f"\u2068still training\u2069 #{training.pk}"]  # the name isolated (bidi.js)
    page.locator('[data-chart="trainer/loss"]').scroll_into_view_if_needed()
    page.wait_for_function(f"(arg) => ({points})(arg) > 0", arg=line)
    before = page.evaluate(points, line)
    legend = page.locator("#compare-legend label", has_text=f"still training #{training.pk}")
    expect(legend.locator(".status")).to_have_text("running")
    expect(page.locator("#compare-legend label", has_text=f"finished #{done.pk}").locator(".status")).to_have_count(0)

    services.record_metrics(training, "trainer", STEPS + 1, {"loss": 0.01})
    page.wait_for_function(f"(arg) => ({points})(arg) === {before + 1}", arg=line)
    services.set_status(Run.objects.get(pk=training.pk), Run.Status.COMPLETED)
    expect(legend.locator(".status")).to_have_text("completed")
    legend.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "compare-live.png")
    assert page_errors == []


def test_a_sweeps_page_fills_in_as_its_runs_finish(page, login, researcher, page_errors):
    """W&B's sweep page fills as runs end; this one showed its runs as they stood when it loaded."""
    from apps.runs import services
    from apps.runs.models import Sweep

    sweep = Sweep.objects.create(name="lr sweep", owner=researcher, method="grid", count=2, base_config={},
                                 space=[{"key": "trainer.lr", "values": [0.001, 0.0003]}])
    done = seeded_run("lr 0.001", researcher, lr=0.001, seconds_a_step=30, sweep=sweep, swept={"trainer.lr": 0.001})
    training = Run.objects.create(name="lr 0.0003", owner=researcher, config=done.config, status=Run.Status.RUNNING,
                                  sweep=sweep, swept={"trainer.lr": 0.0003},
                                  heartbeats={"loop": {"at": datetime.now(UTC).isoformat(), "worker": "w"}})
    page.set_viewport_size(SCREEN)
    login(researcher, f"/sweeps/{sweep.pk}/")
    row = page.locator("#sweep-runs tbody tr", has_text="lr 0.0003")
    expect(row.locator(".status")).to_have_text("running")
    expect(page.get_by_role("button", name="Stop the sweep")).to_be_visible()

    services.record_metrics(training, "eval", 10, {"exact_match": 0.9})
    services.set_status(Run.objects.get(pk=training.pk), Run.Status.COMPLETED)
    expect(row.locator(".status")).to_have_text("completed", timeout=20_000)
    expect(page.locator("#sweep-runs tbody tr").first).to_contain_text("lr 0.0003")  # 0.9 ranks it first
    expect(page.get_by_role("button", name="Stop the sweep")).to_have_count(0)
    page.wait_for_function("() => document.getElementById('sweep-chart').data?.length === 2")
    page.screenshot(path=SHOTS / "sweep-live.png", full_page=True)
    assert page_errors == []


def test_the_run_pages_distributions_panel_draws_each_steps_bands(page, login, researcher, page_errors):
    import random

    from apps.buffer.models import Experience

    run = seeded_run("spread", researcher, lr=0.001, seconds_a_step=30)
    draw = random.Random(0)
    Experience.objects.bulk_create(
        Experience(run=run, source="rollout", explorer_step=step, rollout_index=i,
                   reward=min(1.0, max(0.0, draw.gauss(step / 40, 0.2))), prompt_ids=[1],
                   response_ids=[7] * (4 + draw.randrange(step + 1)))
        for step in range(STEPS) for i in range(16)
    )
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/")
    panel = page.locator("#run-distributions")
    panel.locator("summary").click()
    for name in ("reward", "response tokens"):
        page.wait_for_function(f"() => document.querySelector('[data-distribution=\"{name}\"]').data?.length === 5")
    expect(panel.locator("[data-distributions-empty]")).to_be_hidden()
    panel.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "run-distributions.png")
    assert page_errors == []
