"""The dashboard in a real browser, against the real server and a real worker: launch the quick
demo from the form, watch its figures and charts grow live, read its rollouts, stop it; a launch
with a bad value, refused next to its field; the page of a finished run with history (what it
shows first, how its charts are drawn) and how fast it loads cold.

Screenshots of the run page go to $RFTWEB_SCREENSHOTS (default test-artifacts/)."""

import os
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.runs.models import Run
from apps.tasksets.services import load_builtin_tasksets

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SHOTS = Path(os.environ.get("RFTWEB_SCREENSHOTS", ARTIFACTS))  # screenshots of the run page, to look at
SCREEN = {"width": 1366, "height": 768}  # a common laptop screen
RUN_TIMEOUT = 120_000  # ms: a worker's first steps, on a busy machine

# Points the run page has drawn: for each chart of a role, the length of its line, read off
# Plotly's own data on the chart element (what the user sees, not what the page was sent).
PLOTTED = """(role) => {
  const out = {};
  for (const [id, chart] of window.rftRunPage?.board.charts || []) {
    if (id.startsWith(role + "/") && chart.drawn && chart.element.data) out[id] = chart.element.data[0].x.length;
  }
  return out;
}"""
FINISHED = ("completed", "stopped", "failed")
QUIET_S = 7  # longer than the channel layer's blocking read


def plotted(page, role="trainer") -> dict[str, int]:
    return page.evaluate(PLOTTED, role)


def wait_for_plotted(page, more_than: int, role="trainer") -> int:
    """Wait until a chart of the role shows more than `more_than` points; fail at once if the
    run finishes first (with its error)."""
    page.wait_for_function(
        f"""([role, n, finished]) => finished.includes(document.getElementById("run-status").textContent)
              || Object.values(({PLOTTED})(role)).some((count) => count > n)""",
        arg=[role, more_than, list(FINISHED)],
        timeout=RUN_TIMEOUT,
    )
    status = page.locator("#run-status").text_content()
    assert status not in FINISHED, f"the run is {status}: {page.locator('#run-error pre').text_content()}"
    return max(plotted(page, role).values())


def test_launch_the_quick_demo_watch_it_live_read_rollouts_and_stop_it(
    page, login, researcher, celery_worker_factory, page_errors
):
    load_builtin_tasksets()
    # Charts are drawn as they scroll into view: a page this tall has every one in view.
    page.set_viewport_size({"width": 1280, "height": 4000})

    # Log in on the way to the launch form, which opens on the quick demo.
    login(researcher, "/runs/new/?preset=quick-demo")
    expect(page).to_have_url(re.compile(r"/runs/new/\?preset=quick-demo$"))
    expect(page.locator("a.preset.active")).to_contain_text("Quick demo")
    expect(page.locator('[name="model.path"]')).to_have_value("tiny")
    expect(page.locator('[name="algorithm.name"]')).to_have_value("mix")

    page.get_by_label("Run name").fill("e2e demo")
    # Long enough to be still running when we stop it (the test never waits for the end).
    page.locator('[name="trainer.total_steps"]').fill("100")
    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket))
    page.get_by_role("button", name="Launch run").click()

    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(name="e2e demo")
    assert page.url.endswith(f"/runs/{run.pk}/")
    assert run.config["trainer"]["total_steps"] == 100 and run.config["algorithm"]["name"] == "mix"
    expect(page.locator(".flash.success")).to_have_text("Launched e2e demo.")
    # No worker yet: the launch says what the run will wait for, and so does its page.
    # Backquoted names show as code, not with their backquotes (issue #42, finding 8).
    expect(page.locator(".flash.warning")).to_contain_text("No live worker takes the train queue")
    expect(page.locator(".flash.warning code").first).to_have_text("train")
    expect(page.locator('[data-duty="loop"]')).to_contain_text("waiting for a train worker: none is live")
    expect(page.locator('[data-duty="loop"] code').first).to_have_text("train")
    expect(page.locator("#run-status")).to_have_text("queued")
    expect(page.locator("#live-dot")).to_have_text("live")
    page.evaluate("window.e2eSamePage = true")  # a reload would lose it

    # No worker yet: the page is quiet meanwhile, and must keep its socket (the server must not
    # drop it when nothing is sent for a while; the channel layer's blocking read waits 5 s).
    quiet_since = time.monotonic()
    celery_worker_factory()
    page.wait_for_timeout(max(0.0, QUIET_S - (time.monotonic() - quiet_since)) * 1000)
    assert len(sockets) == 1 and not sockets[0].is_closed(), "the server dropped a quiet websocket"

    # The charts fill in live: points appended as the worker reports them, with no reload, the
    # figures and the status following.
    first = wait_for_plotted(page, 0)
    expect(page.locator("#run-status")).to_have_text("running")
    # The overview is open; the other sections open on a click, and draw their charts then.
    for section in ("trainer", "system"):
        page.locator(f'[data-section="{section}"] summary').click()
    wait_for_plotted(page, first + 1)
    assert page.evaluate("window.e2eSamePage") is True
    # The quick demo evaluates from step 0: its held-out accuracy is the first figure.
    expect(page.locator('[data-figure="heldout"] .value')).to_have_text(re.compile(r"^\d\.\d{3}$"))
    expect(page.locator('[data-figure="reward"] .value')).to_have_text(re.compile(r"^\d\.\d{3}$"))
    expect(page.locator("#live-dot")).to_have_text("live")
    charts = plotted(page)
    assert {"trainer/loss", "trainer/reward_mean"} <= set(charts), charts
    assert plotted(page, "explorer")
    expect(page.locator('[data-state="trainer_step"]')).not_to_have_text("0")
    expect(page.locator(".charts-empty")).to_have_count(0)
    expect(page.locator("#charts .chart .main-svg").first).to_be_visible()
    # System metrics are numbered by Unix time: a time axis, not 1.7e9 "steps".
    cpu = "window.rftRunPage.board.charts.get('system/cpu_percent')"
    page.wait_for_function(f"() => {cpu}?.drawn")
    assert page.evaluate(f"{cpu}.element.layout.xaxis.type") == "date"
    # All on one websocket.
    assert [socket.url.split("/", 3)[-1] for socket in sockets] == [f"ws/runs/{run.pk}/"]
    assert not sockets[0].is_closed()
    page.set_viewport_size(SCREEN)
    page.evaluate("scrollTo(0, 0)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "run-page-active.png")

    # The rollout browser shows what the model wrote.
    page.get_by_role("link", name="Rollouts").click()
    page.wait_for_url(f"**/runs/{run.pk}/rollouts/")
    responses = page.locator("article.response")
    expect(responses.first).to_be_visible()
    shown = {  # experience id (from its Annotate link) -> the response text on the page
        int(re.search(r"/experience/(\d+)/$", href)[1]): text
        for href, text in responses.evaluate_all(
            """articles => articles.map((a) => [a.querySelector('a[href*="/experience/"]').href,
                                                a.querySelector('.text').textContent])"""
        )
    }
    stored = dict(Experience.objects.filter(run=run, pk__in=shown).values_list("pk", "response_text"))
    assert set(stored) == set(shown)  # each one this run's
    # As the model wrote it (an HTML parser reads line ends as \n), and not all empty.
    assert all(text == re.sub(r"\r\n?", "\n", stored[pk]) for pk, text in shown.items())
    assert any(text.strip() for text in shown.values())
    expect(page.locator("section.group .group-prompt").first).not_to_be_empty()
    expect(page.locator("article.response .chip", has_text="reward").first).to_be_visible()

    # Stop it from its page; the status follows live to "stopped".
    page.get_by_role("link", name="e2e demo").click()
    page.wait_for_url(f"**/runs/{run.pk}/")
    page.get_by_role("button", name="Stop").click()
    with page.expect_navigation():
        page.get_by_role("button", name="Stop run").click()  # it asks first
    # Until the run stops; then the flash says so (run_page.js).
    expect(page.locator(".flash")).to_have_text(re.compile(r"^(Stopping e2e demo|e2e demo stopped)\.$"))
    page.evaluate("window.e2eSamePage = true")
    try:
        expect(page.locator("#run-status")).to_have_text("stopped", timeout=60_000)
    except AssertionError as shown:
        run.refresh_from_db()
        raise AssertionError(f"the page shows {page.locator('#run-status').text_content()!r}; the database has "
                             f"{run.status!r} (live seq {run.live_seq}, heartbeats {run.heartbeats})") from shown
    expect(page.locator("#live-dot")).to_have_text("stopped")  # no longer "live"
    assert page.evaluate("window.e2eSamePage") is True
    for control in ("Stop", "Pause"):
        expect(page.get_by_role("button", name=control)).to_be_hidden()
    expect(page.get_by_role("button", name="Resume")).to_be_visible()  # from its newest checkpoint
    run.refresh_from_db()
    assert run.status == "stopped" and run.trainer_step < 100
    assert page_errors == []


def test_a_launch_with_a_bad_value_shows_the_error_next_to_that_field_and_creates_nothing(
    page, login, researcher, page_errors
):
    load_builtin_tasksets()
    login(researcher, "/runs/new/")
    page.get_by_label("Run name").fill("never launched")
    page.locator('[name="trainer.total_steps"]').fill("0")
    with page.expect_navigation():
        page.get_by_role("button", name="Launch run").click()

    expect(page).to_have_url(re.compile(r"/runs/new/$"))
    field = page.locator('.field[data-key="trainer.total_steps"]')
    expect(field).to_have_class(re.compile(r"\binvalid\b"))
    expect(field.locator(".errorlist")).to_have_text("must be >= 1, got 0")
    expect(page.locator(".field.invalid")).to_have_count(1)  # that field only
    # Listed by the Launch button too, linked to the field (no other problem box).
    expect(page.locator(".error-box")).to_have_count(1)
    expect(page.locator("#launch-problems li")).to_have_text("total_steps: must be >= 1, got 0")
    page.locator("#launch-problems a").click()
    expect(page.locator('[name="trainer.total_steps"]')).to_be_in_viewport()
    # What was typed is kept, to be corrected.
    expect(page.locator('[name="trainer.total_steps"]')).to_have_value("0")
    expect(page.get_by_label("Run name")).to_have_value("never launched")
    assert not Run.objects.exists()
    assert page_errors == []


# ---- the run page of a run with history ---------------------------------------------------------

STEPS = 200
EVAL_EVERY = 10
DEMO_CONFIG = {  # as the quick-demo preset
    "mode": "both",
    "model": {"path": "tiny"},
    "algorithm": {"name": "mix"},
    "explorer": {"eval_interval": EVAL_EVERY},
    "trainer": {"total_steps": STEPS, "save_interval": 50},
    "buffer": {"taskset": "addition", "expert_taskset": "addition", "eval_taskset": "addition-eval"},
}


def seed_history(run, steps=STEPS):
    """`steps` steps of explorer, trainer, eval (every EVAL_EVERY) and system metrics under the
    names the engine reports (workers/rft/explorer.py, trainer.py, apps/runs/supervision.py): a run whose
    held-out accuracy climbs, as the quick demo's does, with a constant learning rate."""
    import random

    from apps.runs import summaries
    from apps.runs.models import MetricPoint, MetricSummary

    rng = random.Random(0)
    rows = []
    for step in range(1, steps + 1):
        p = step / steps
        reward = min(1.0, max(0.0, 0.6 * p + rng.uniform(-0.1, 0.1)))
        rows.append(MetricPoint(run=run, role="explorer", step=step, values={
            "reward_mean": reward, "reward_std": 0.3 + rng.uniform(-0.05, 0.05), "response_length": 3.9,
            "truncated_frac": 0.8 * (1 - p), "rollouts": 64, "exact_match": reward,
            "tokens_per_s": 950 + rng.uniform(-50, 50), "advantage/zero_std_groups": rng.randrange(8),
            "written": 64, "model_version": step - 1, "seconds": 0.26 + rng.uniform(0, 0.02)}))
        rows.append(MetricPoint(run=run, role="trainer", step=step, values={
            "clip_frac": 0.0, "approx_kl": 0.001 * p, "ratio_mean": 1.0, "policy_loss": rng.uniform(-0.01, 0.01),
            "entropy": 6.2 - 3 * p, "sft_loss": 3.7 - 2 * p, "loss": 1.85 - p, "grad_norm": 3.1 - p,
            "logprob_mismatch": 2e-7, "seconds": 0.64 + rng.uniform(0, 0.05),
            "tokens_per_s": 2250 + rng.uniform(-80, 80),
            "experiences": 128, "expert_experiences": 64, "reward_mean": reward, "response_length": 3.9,
            "staleness": 0.0, "staleness_max": 0, "staleness_min": 0, "lr": 0.001}))
        rows.append(MetricPoint(run=run, role="system", step=1_700_000_000 + 5 * step, values={  # apps/runs/system.py
            "trainer": {"cpu_percent": 180 + rng.uniform(-20, 20), "memory_gb": 1.2 + p / 10},
            "explorer": {"cpu_percent": 95 + rng.uniform(-10, 10), "memory_gb": 0.8}}))
    # Jumpy, as 20 eval tasks are: a moving average would show values that were never measured.
    accuracy = [0.0, 0.0, 0.1, 0.0, 0.05, 0.2, 0.2, 0.25, 0.15, 0.15, 0.35,
                0.35, 0.5, 0.65, 0.55, 0.55, 0.5, 0.4, 0.45, 0.65, 0.55]
    for step, value in zip(range(0, steps + 1, EVAL_EVERY), accuracy):
        rows.append(MetricPoint(run=run, role="eval", step=step, values={
            "reward_mean": value, "exact_match": value, "reward_std": 0.4, "response_length": 3.9,
            "truncated_frac": 0.1, "rollouts": 20, "tasks": 20, "model_version": step}))
    MetricPoint.objects.bulk_create(rows)
    summaries.rebuild(MetricPoint, MetricSummary, run_ids=[run.pk])  # what record_metrics keeps as it writes


@pytest.fixture
def completed_run(researcher):
    run = Run.objects.create(name="demo", owner=researcher, status=Run.Status.COMPLETED, config=DEMO_CONFIG,
                             explorer_step=STEPS, trainer_step=STEPS, model_version=STEPS)
    seed_history(run)
    return run


def chart_state(page, chart_id):
    """What Plotly drew for a chart (scrolled into view, where charts are drawn): its traces'
    visibility and points, and its axes."""
    page.locator(f'[data-chart="{chart_id}"]').scroll_into_view_if_needed()
    page.wait_for_function("(id) => window.rftRunPage.board.charts.get(id)?.drawn", arg=chart_id)
    return page.evaluate(
        """(id) => {
          const el = window.rftRunPage.board.charts.get(id).element;
          const axis = (name) => ({title: el.layout[name].title?.text, range: el._fullLayout[name].range,
                                   ticks: [...el.querySelectorAll(`.${name[0]}tick text`)].map((t) => t.textContent)});
          return {traces: el.data.map((t) => ({name: t.name, visible: t.visible !== false, x: [...t.x], y: [...t.y]})),
                  xaxis: axis("xaxis"), yaxis: axis("yaxis"),
                  titles: [...el.querySelectorAll(".g-xtitle text, .g-ytitle text")].map((t) => t.textContent)};
        }""",
        chart_id,
    )


def hover_text(page, chart_id, step) -> str:
    """The hover box Plotly shows at a step (the one a mouse over that step shows)."""
    page.evaluate(
        "([id, step]) => Plotly.Fx.hover(window.rftRunPage.board.charts.get(id).element, {xval: step})",
        [chart_id, step],
    )
    return page.locator(f'[data-chart="{chart_id}"] .hoverlayer').text_content()


def test_a_run_with_two_explorers_draws_a_line_per_explorer_in_the_system_section(page, login, researcher,
                                                                                   page_errors):
    """What a user of a scaled run watches: each explorer's tokens/s, idle share and sync seconds
    as lines of one chart per figure, the trainer's idle share and sync seconds beside them."""
    from apps.runs.models import MetricPoint

    config = {**DEMO_CONFIG, "explorer": {"engine_num": 2}, "synchronizer": {"method": "nccl"}}
    run = Run.objects.create(name="two explorers", owner=researcher, status=Run.Status.COMPLETED, config=config,
                             explorer_step=6, trainer_step=6)
    for step in range(1, 7):
        MetricPoint.objects.create(run=run, role="explorer", step=step, values={
            "reward_mean": 0.1 * step, "tokens_per_s": 900, "tokens_per_s/explorer": 500,
            "tokens_per_s/explorer-1": 400, "idle_share/explorer": 0.2, "idle_share/explorer-1": 0.3,
            "sync_seconds/explorer": 0.05, "sync_seconds/explorer-1": 0.06, "sync_seconds": 0.06, "idle_share": 0.25})
        MetricPoint.objects.create(run=run, role="trainer", step=step, values={
            "loss": 1.0 / step, "idle_share": 0.4, "sync_seconds": 0.1, "staleness_share": {"0": 0.75, "1": 0.25}})
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator(".run-explorers")).to_contain_text("weights by nccl broadcast")
    section = page.locator("details", has=page.locator("summary", has_text="system · explorers"))
    expect(section).to_have_count(1)
    section.locator("summary").click()
    idle = chart_state(page, "explorer/by explorer/idle_share")
    lines = {trace["name"]: trace["y"] for trace in idle["traces"] if not trace["name"].endswith("(smoothed)")}
    assert lines == {"explorer": [0.2] * 6, "explorer-1": [0.3] * 6, "trainer": [0.4] * 6}
    assert idle["yaxis"]["title"] == "share of the time"
    tokens = chart_state(page, "explorer/by explorer/tokens_per_s")
    assert {trace["name"] for trace in tokens["traces"]} >= {"explorer", "explorer-1"}
    assert "trainer" not in {trace["name"] for trace in tokens["traces"]}  # the trainer's tokens/s is its own
    assert page.locator('[data-chart="explorer/tokens_per_s/explorer"]').count() == 0  # not a chart each as well
    section.screenshot(path=SHOTS / "run-page-explorers.png")
    assert page_errors == []


def test_a_lost_last_message_reaches_the_page_through_the_next_pong(page, login, researcher, page_errors):
    """The page of a stopping run whose final "stopped" Channels dropped (no later message shows
    the gap): the next pong carries the newest number, and the page refetches."""
    from django.db.models import F

    run = Run.objects.create(name="stopping", owner=researcher, config={}, status="stopping")
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator("#live-dot")).to_have_text("live")
    Run.objects.filter(pk=run.pk).update(status="stopped", live_seq=F("live_seq") + 1)  # numbered, never sent
    expect(page.locator("#run-status")).to_have_text("stopped", timeout=20_000)  # a ping every 10 s
    expect(page.locator("#live-dot")).to_have_text("stopped")


def test_a_finished_run_shows_held_out_accuracy_first_unsmoothed_with_titled_axes(
    page, login, researcher, completed_run, page_errors
):
    run = completed_run
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/")
    page.wait_for_function("() => document.querySelector('[data-figure=heldout] .value').textContent !== '—'")

    # Held-out accuracy is the first figure, in the first screen, with the last eval's value.
    heldout = page.locator('[data-figure="heldout"]')
    expect(heldout.locator(".label")).to_have_text("Held-out accuracy")
    expect(heldout.locator(".value")).to_have_text("0.550")
    expect(heldout.locator(".sub")).to_have_text("explorer step 200 · best 0.650")
    box = heldout.bounding_box()
    assert box["y"] + box["height"] <= SCREEN["height"], box
    assert heldout.locator("polyline").get_attribute("points").count(",") == 21  # one point an eval
    expect(page.locator('[data-figure="reward"] .label')).to_have_text("Train reward")
    expect(page.locator('[data-figure="step"] .value')).to_have_text("200 / 200")
    expect(page.locator('[data-figure="throughput"] .value')).to_have_text(re.compile(r"^2,\d{3} tokens/s$"))
    # Finished: the dot says how, not "live".
    expect(page.locator("#live-dot")).to_have_text("completed")
    expect(page.locator("#live-dot")).not_to_have_class(re.compile(r"(^|\s)live(\s|$)"))

    # The eval chart leads the overview, drawn as measured: no moving average, and the hover
    # shows the stored value.
    overview = page.evaluate("window.rftRunPage.board.sections.get('overview').charts.map((chart) => chart.id)")
    assert overview == ["eval/exact_match", "explorer/reward_mean", "trainer/loss", "trainer/approx_kl",
                        "trainer/entropy", "explorer/response_length"]
    page.wait_for_function("() => window.rftRunPage.board.sections.get('overview').charts.every((c) => c.drawn)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "run-page-completed.png")
    eval_chart = chart_state(page, "eval/exact_match")
    stored = {point.step: point.values["exact_match"] for point in run.metrics.filter(role="eval")}
    shown = [trace for trace in eval_chart["traces"] if trace["visible"]]
    assert len(shown) == 1 and dict(zip(shown[0]["x"], shown[0]["y"])) == stored
    hover = hover_text(page, "eval/exact_match", 20)
    assert stored[20] == 0.1 and "value : 0.1" in hover and "smoothed" not in hover, hover
    assert eval_chart["xaxis"]["title"] == "explorer step" and eval_chart["yaxis"]["title"] == "exact match"
    assert all(re.fullmatch(r"\d+", tick) for tick in eval_chart["xaxis"]["ticks"]), eval_chart["xaxis"]["ticks"]
    # A noisy train series is smoothed, and its raw values stay in the hover.
    reward = chart_state(page, "explorer/reward_mean")
    assert [trace["visible"] for trace in reward["traces"]] == [True, True]
    raw = dict(zip(reward["traces"][0]["x"], reward["traces"][0]["y"]))
    hover = hover_text(page, "explorer/reward_mean", 100)
    assert f"value : {raw[100]:.4g}" in hover and "value (smoothed) : " in hover, hover
    # Every chart drawn has both axis titles, as the user sees them.
    for chart_id in overview:
        assert len(chart_state(page, chart_id)["titles"]) == 2, chart_id

    # The other sections are folded: their charts are drawn when opened. A constant learning
    # rate gets an axis around its value, unsmoothed.
    trainer = page.locator('[data-section="trainer"]')
    assert trainer.get_attribute("open") is None
    assert not page.evaluate("window.rftRunPage.board.charts.get('trainer/lr').drawn")
    # Filtering opens the sections with a match, for as long as it filters.
    page.get_by_placeholder(re.compile("filter charts")).fill("grad_norm")
    expect(trainer).to_have_attribute("open", "")
    expect(page.locator("#charts .chart:visible")).to_have_count(1)
    expect(page.locator('[data-section="overview"]')).to_be_hidden()
    page.get_by_placeholder(re.compile("filter charts")).fill("")
    expect(page.locator('[data-section="overview"]')).to_be_visible()
    assert trainer.get_attribute("open") is None
    trainer.locator("summary").click()
    lr = chart_state(page, "trainer/lr")
    assert lr["yaxis"]["range"] == [0.0005, 0.0015] and lr["yaxis"]["title"] == "learning rate"
    assert [trace["visible"] for trace in lr["traces"]] == [True, False]
    assert lr["xaxis"]["title"] == "trainer step"
    system = page.locator('[data-section="system"]')
    system.locator("summary").click()
    cpu = chart_state(page, "system/cpu_percent")
    assert cpu["xaxis"]["title"] == "time" and cpu["yaxis"]["title"] == "%"
    # A chart a figure, a line a duty.
    assert {trace["name"].removesuffix(" (smoothed)") for trace in cpu["traces"]} == {"trainer", "explorer"}
    page.screenshot(path=SHOTS / "run-page-completed-full.png", full_page=True)
    # What was opened stays open on the next visit.
    page.reload()
    expect(page.locator('[data-section="trainer"]')).to_have_attribute("open", "")
    # The compare page leads with the same overview.
    page.goto(f"/runs/compare/?runs={run.pk}")
    expect(page.locator('[data-section="overview"] .chart').first).to_have_attribute("data-chart", "eval/exact_match")
    expect(page.locator('[data-chart="eval/exact_match"] .g-xtitle')).to_have_text("explorer step")
    assert page_errors == []


# Records when the page first shows its figures, and every chart in view drawn, in ms from
# navigation start (checked every frame).
COLD_LOAD_PROBE = """
window.coldLoad = {};
(function poll() {
  const now = performance.now();
  const figures = [...document.querySelectorAll("#key-figures [data-figure] .value")];
  if (!("figures" in coldLoad) && figures.length && figures.every((el) => el.textContent.trim() !== "—"))
    coldLoad.figures = now;
  const charts = [...document.querySelectorAll("#charts .chart")].filter((el) => {
    const box = el.getBoundingClientRect();
    return box.height > 0 && box.bottom > 0 && box.top < innerHeight;
  });
  if (!("charts" in coldLoad) && charts.length && charts.every((el) => el.querySelector(".main-svg")))
    coldLoad.charts = now;
  if (!("figures" in coldLoad && "charts" in coldLoad)) requestAnimationFrame(poll);
})();
"""
COLD_LOADS = 7


def test_cold_load_of_a_run_page_with_200_steps(page, login, browser, asgi_server, researcher, completed_run):
    """Navigation start to key figures and every chart in the first screen drawn, with an empty
    browser cache, at 1366x768: the median of COLD_LOADS loads (the first, which warms the
    server, is left out). Prints the figures (`pytest -s -k cold_load`); it fails only when the page
    never draws them: speed is measured, not a pass/fail line a busy CI machine crosses. The aim is
    1.5 s (about 1 s on a quiet 2-core machine, 1.3 s on a busy one; the page with the full plotly
    bundle and every section open took 3 s)."""
    login(researcher)
    cookies = page.context.cookies()  # the session, for fresh contexts
    loads = []
    for _ in range(COLD_LOADS + 1):
        # Nothing cached. The CSP would block the probe's polling (Playwright evaluates it as a
        # string); tests/e2e/test_csp.py checks the policy itself.
        context = browser.new_context(base_url=asgi_server, viewport=SCREEN, bypass_csp=True)
        try:
            context.add_cookies(cookies)
            context.add_init_script(COLD_LOAD_PROBE)
            cold = context.new_page()
            cold.goto(f"/runs/{completed_run.pk}/")
            cold.wait_for_function("() => 'figures' in coldLoad && 'charts' in coldLoad", timeout=30_000)
            loads.append(cold.evaluate("coldLoad"))
        finally:
            context.close()
    median = {name: sorted(load[name] for load in loads[1:])[COLD_LOADS // 2] for name in ("figures", "charts")}
    print(f"\ncold load, median of {COLD_LOADS}: figures {median['figures']:.0f} ms, charts {median['charts']:.0f} ms;",
          "each (figures, charts):", [(round(load["figures"]), round(load["charts"])) for load in loads[1:]])
    assert median["figures"] > 0 and median["charts"] > 0, median
