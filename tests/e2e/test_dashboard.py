"""The dashboard in a real browser, against the real server and a real worker: launch the quick
demo from the form, watch its charts grow live, read its rollouts, stop it; and a launch with a
bad value, refused next to its field."""

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
RUN_TIMEOUT = 120_000  # ms: a worker's first steps, on a busy machine

# Points the run page has drawn: for each chart of a role, the length of its smoothed line, read
# off Plotly's own data on the chart element (what the user sees, not what the page was sent).
PLOTTED = """(role) => {
  const out = {};
  for (const [id, chart] of window.rftRunPage?.board.charts || []) {
    if (id.startsWith(role + "/") && chart.drawn && chart.element.data) out[id] = chart.element.data[1].x.length;
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
    expect(page.locator(".flash")).to_have_text("Launched e2e demo.")
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
    wait_for_plotted(page, first + 1)
    assert page.evaluate("window.e2eSamePage") is True
    charts = plotted(page)
    assert {"trainer/loss", "trainer/reward_mean"} <= set(charts), charts
    assert plotted(page, "explorer")
    expect(page.locator('[data-state="trainer_step"]')).not_to_have_text("0")
    expect(page.locator(".charts-empty")).to_have_count(0)
    expect(page.locator("#charts .chart .main-svg").first).to_be_visible()
    # System metrics are numbered by Unix time: a time axis, not 1.7e9 "steps".
    cpu = "window.rftRunPage.board.charts.get('system/cpu_percent')"
    page.wait_for_function(f"{cpu}?.drawn")
    assert page.evaluate(f"{cpu}.element.layout.xaxis.type") == "date"
    # All on one websocket.
    assert [socket.url.split("/", 3)[-1] for socket in sockets] == [f"ws/runs/{run.pk}/"]
    assert not sockets[0].is_closed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "run-page-live.png")

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
    with page.expect_navigation():
        page.get_by_role("button", name="Stop").click()
    expect(page.locator(".flash")).to_have_text("Stopping e2e demo.")
    page.evaluate("window.e2eSamePage = true")
    expect(page.locator("#run-status")).to_have_text("stopped", timeout=60_000)
    assert page.evaluate("window.e2eSamePage") is True
    for control in ("Stop", "Pause", "Resume"):
        expect(page.get_by_role("button", name=control)).to_be_hidden()
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
    expect(page.locator(".error-box")).to_have_count(0)
    # What was typed is kept, to be corrected.
    expect(page.locator('[name="trainer.total_steps"]')).to_have_value("0")
    expect(page.get_by_label("Run name")).to_have_value("never launched")
    assert not Run.objects.exists()
    assert page_errors == []
