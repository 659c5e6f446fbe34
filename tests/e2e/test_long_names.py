"""What people name things does not break the pages, in Chromium at 1366x768 against the real
server: a 200-character run name without spaces, a 3000-character token in a run's notes and a
150-character user name keep every page within the screen (the runs list's Run column was 2135 px
wide, the run page 25,573 px), and a right-to-left override (U+202E) in a run name stays inside it
(compare showed "7#" for "#7")."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.alerts.models import Alert
from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.feedback import services
from apps.runs.models import MetricPoint, Run, Sweep
from apps.tasksets.models import Task, Taskset

from .conftest import ARTIFACTS
from .test_dashboard import DEMO_CONFIG

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCREEN = {"width": 1366, "height": 768}
LONG_NAME = "sweep_" + "x" * 194
RLO = "\u202e"
# The elements that reach past the right edge of the screen: what a failure names.
PAST_THE_EDGE = """() => [...document.querySelectorAll("body *")]
  .filter((el) => el.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
  .slice(-5).map((el) => `${el.tagName.toLowerCase()}.${el.className}: ${el.getBoundingClientRect().right} px`)"""
# The x of each character of an element's text, in reading order: increasing where the text is
# laid out left to right.
CHARACTER_XS = """(el) => { const text = el.firstChild, range = document.createRange(), xs = [];
  for (let i = 0; i < text.length; i++) { range.setStart(text, i); range.setEnd(text, i + 1);
    xs.push(range.getBoundingClientRect().left); }
  return xs; }"""


def fits_the_screen(page, path):
    page.goto(path)
    page.wait_for_load_state("load")
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= SCREEN["width"], f"{path} is {width} px wide: {page.evaluate(PAST_THE_EDGE)}"


def left_to_right(locator) -> bool:
    xs = locator.evaluate(CHARACTER_XS)
    return len(xs) > 1 and xs == sorted(xs)


def follows(name, after) -> bool:
    """Whether `after` is drawn to the right of the name, as it comes after it (an override that
    leaks out of the name lays the rest of its line out right to left: `after` comes first)."""
    box = name.bounding_box()
    return after.bounding_box()["x"] >= box["x"] + box["width"] - 0.5


def isolated(locator) -> bool:
    """Whether the element holding the name isolates it (a <bdi>, or unicode-bidi: isolate)."""
    return locator.evaluate("(el) => getComputedStyle(el).unicodeBidi") == "isolate"


def test_long_names_and_notes_keep_the_pages_within_the_screen(page, login, researcher, page_errors):
    taskset = Taskset.objects.create(name="t" * 100)
    task = Task.objects.create(taskset=taskset, index=0, prompt="What is 2 + 2?", answer="4")
    config = {**DEMO_CONFIG, "buffer": {**DEMO_CONFIG["buffer"], "taskset": taskset.name}}
    run = Run.objects.create(name=LONG_NAME, owner=researcher, config=config, status=Run.Status.COMPLETED,
                             notes="n" * 3000, tags=["sweep"])
    other = Run.objects.create(name="lr low", owner=researcher, config=config, status=Run.Status.COMPLETED)
    rollouts = [Experience.objects.create(
        run=run, task=task, explorer_step=1, rollout_index=i, group_id="1-0", prompt_text=task.prompt,
        response_text=f"2 + 2 = {3 + i}", prompt_ids=[1], response_ids=[2, 3], action_mask=[1, 1], reward=1.0 - i,
        model_version=1) for i in range(2)]
    annotator = create_user("a" * 150, "pw-for-tests-123", roles=(ANNOTATOR,))
    services.rate(rollouts[0].pk, annotator, "4")
    page.set_viewport_size(SCREEN)
    login(researcher, "/runs/")
    fits_the_screen(page, "/runs/")
    runs = page.locator("table.runs")
    assert runs.evaluate("(t) => t.getBoundingClientRect().right <= t.parentElement.getBoundingClientRect().right")
    for path in (f"/runs/{run.pk}/", f"/runs/{run.pk}/rollouts/", f"/annotate/runs/{run.pk}/",
                 f"/annotate/experience/{rollouts[1].pk}/", f"/runs/compare/?runs={run.pk}&runs={other.pk}"):
        fits_the_screen(page, path)
    summary = page.locator("#compare-summary .table-scroll")
    assert summary.evaluate("(box) => box.scrollWidth <= box.clientWidth")  # both runs' columns in view
    # Ordinary names stay whole on one line.
    name = page.locator("#compare-summary thead bdi", has_text="lr low")
    assert name.evaluate("(el) => el.getClientRects().length === 1 && el.offsetHeight < 30")
    assert page_errors == []


def test_a_long_file_name_and_sweep_name_keep_tasksets_and_alerts_within_the_screen(page, login, researcher,
                                                                                    page_errors):
    """A 255-character upload file name (a taskset's Source) made the tasksets list 2,800 px wide; a
    200-character sweep name made the alerts' "Sent lately" table 2,050 px in its 840 px card."""
    shots = Path(os.environ.get("RFTWEB_SCREENSHOTS", ARTIFACTS))
    shots.mkdir(parents=True, exist_ok=True)
    taskset = Taskset.objects.create(name="long-source", source="s" * 251 + ".csv")
    sweep = Sweep.objects.create(name=LONG_NAME, owner=researcher, method="grid", space=[], count=1, base_config={})
    Alert.objects.create(user=researcher, event=Alert.Event.SWEEP_ENDED, channel=Alert.Channel.WEBHOOK, sweep=sweep,
                         subject=f"sweep {LONG_NAME!r} ended: 1 completed", payload={}, status="failed",
                         error=f"http://{'h' * 300}/ could not be reached: timed out")
    page.set_viewport_size(SCREEN)
    login(researcher, "/tasksets/")
    too_wide = []  # every page's, then the screenshots of all
    for path, shot in (("/tasksets/", "tasksets-list"), (f"/tasksets/{taskset.name}/", "taskset-detail"),
                       ("/alerts/", "alerts")):
        page.goto(path)
        page.wait_for_load_state("load")
        page.screenshot(path=shots / f"{shot}.png")
        width = page.evaluate("() => document.scrollingElement.scrollWidth")
        if width > SCREEN["width"]:
            too_wide.append(f"{path} is {width} px wide: {page.evaluate(PAST_THE_EDGE)}")
        for table in page.locator(".table-scroll").all():  # every column in view, none scrolled off
            widths = table.evaluate("(box) => [box.scrollWidth, box.clientWidth]")
            if widths[0] > widths[1]:
                too_wide.append(f"{path}: a table {widths[0]} px wide in {widths[1]} px")
    assert too_wide == [] and page_errors == []


def test_a_right_to_left_override_in_a_run_name_stays_in_the_name(page, login, researcher, page_errors):
    run = Run.objects.create(name=RLO + "evil-name", owner=researcher, config=DEMO_CONFIG,  # running: its
                             status=Run.Status.RUNNING, tags=["sweep"], notes=RLO + "a note")  # status in the legend
    other = Run.objects.create(name="plain", owner=researcher, config=DEMO_CONFIG, status=Run.Status.COMPLETED)
    page.set_viewport_size(SCREEN)
    login(researcher, "/runs/")
    cell = page.locator("table.runs td.run-name", has_text="evil-name")  # it reads "eman-live": that is its name
    assert follows(cell.locator("a").first, cell.locator(".chip.tag"))

    page.goto(f"/runs/compare/?runs={run.pk}&runs={other.pk}")
    picked = page.locator(".picker-name", has_text="evil-name")
    number = picked.locator(".muted")
    assert number.text_content() == f"#{run.pk}" and left_to_right(number)
    assert number.bounding_box()["x"] > picked.bounding_box()["x"] + 10  # after the name, not before it
    head = page.locator("#compare-summary thead th", has_text="evil-name")
    assert left_to_right(head.locator("span.muted")) and follows(head.locator("a").first, head.locator("span.muted"))
    legend = page.locator("#compare-legend label", has_text="evil-name")
    assert follows(legend.locator("bdi"), legend.locator(".status")) and isolated(legend.locator("bdi"))

    page.goto(f"/runs/{run.pk}/")
    title = page.locator(".page-head h1")
    assert isolated(title.locator("> *").first) and follows(title, page.locator("#live-dot"))
    assert isolated(page.locator(".run-notes-text > *").first)
    assert page_errors == []


# A right-to-left override, markup and a word longer than any line, in as long a name as a run may
# have (200 characters).
EVIL = RLO + "<b>x</b>" + "w" * 191
# Each character's x, in the order of the text, of the first SVG text element holding `needle`:
# increasing where it is laid out left to right. With the first index of the needle.
SVG_CHARACTER_XS = """([root, needle]) => { const text = [...document.querySelectorAll(root + " text")]
    .find((t) => t.textContent.includes(needle));
  if (!text) return null;
  const xs = []; for (let i = 0; i < text.getNumberOfChars(); i++) xs.push(text.getStartPositionOfChar(i).x);
  return {at: text.textContent.indexOf(needle), xs, text: text.textContent}; }"""


# The width of the SVG text holding `needle`, and of the same text without FSI and PDI.
ISOLATE_MARKS_WIDTH = """(needle) => { const text = [...document.querySelectorAll(".hoverlayer text")]
    .find((t) => t.textContent.includes(needle));
  const bare = text.cloneNode(false); bare.textContent = text.textContent.replace(/[\u2068\u2069]/g, "");
  text.after(bare); const widths = [text.getComputedTextLength(), bare.getComputedTextLength()]; bare.remove();
  return widths; }"""


def test_names_where_no_element_may_go_are_isolated_and_stay_text(page, login, researcher, curator, annotator,
                                                                  page_errors):
    """A flash message, the page's <title>, an <option> and Plotly's hover (SVG text) take no <bdi>:
    each has the name between FSI and PDI (the flash a <bdi> again), escaped, and the page fits."""
    shots = Path(os.environ.get("RFTWEB_SCREENSHOTS", ARTIFACTS))
    run = Run.objects.create(name=EVIL, owner=researcher, config=DEMO_CONFIG, status=Run.Status.RUNNING)
    other = Run.objects.create(name="plain", owner=researcher, config=DEMO_CONFIG, status=Run.Status.COMPLETED)
    short = Run.objects.create(name=RLO + "<b>x</b>evil", owner=researcher, config=DEMO_CONFIG)  # its "#id" in view
    for each in (run, other):
        for step in range(1, 4):
            MetricPoint.objects.create(run=each, role="explorer", step=step, values={"reward_mean": step / 4})
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/")
    assert page.title() == isolate(EVIL) + " · rftweb"
    page.locator(".page-head").get_by_role("button", name="Stop").click()
    page.locator(".confirm-pop").get_by_role("button", name="Stop run").click()
    # No worker holds it: it stops at once, and the page says so in the flash, the name still its <bdi>.
    flash = page.locator(".flash.success")
    expect(flash).to_have_text(f"{EVIL} stopped.")
    name = flash.locator("bdi")
    assert isolated(name) and name.text_content() == EVIL and flash.locator("b").count() == 0
    # " stopped." follows the name's last line (the name wraps: a 191-character word is wider than the screen).
    assert flash.evaluate("""(el) => { const range = document.createRange(); range.setStart(el.lastChild, 1);
      range.setEnd(el.lastChild, 2); const s = range.getBoundingClientRect();
      const end = [...el.querySelector("bdi").getClientRects()].at(-1);
      return s.left >= end.right - 0.5 && Math.abs(s.top - end.top) < 2; }""")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= SCREEN["width"], page.evaluate(PAST_THE_EDGE)
    page.screenshot(path=shots / "isolated-flash.png")

    page.goto(f"/runs/compare/?runs={run.pk}&runs={other.pk}")
    chart = page.locator('[data-chart="explorer/reward_mean"]')
    chart.scroll_into_view_if_needed()
    page.wait_for_function("() => document.querySelector('[data-chart=\"explorer/reward_mean\"]')?.data")
    chart.evaluate("(el) => Plotly.Fx.hover(el, {xval: 2})")
    hover = SVG_CHARACTER_XS, ['[data-chart="explorer/reward_mean"] .hoverlayer', f"{isolate(EVIL)} #{run.pk}"]
    found = page.evaluate(*hover)
    assert found, page.locator('[data-chart="explorer/reward_mean"] .hoverlayer').text_content()
    after_name = found["at"] + len(isolate(EVIL))  # " #<id>" and its value
    assert found["xs"][after_name:] == sorted(found["xs"][after_name:]), found["text"]
    assert found["xs"][after_name + 1] > found["xs"][after_name - 2]  # "#" to the right of the name's last "w"
    assert chart.locator(".hoverlayer [style*=bold]").count() == 0  # <b> shown as text, not bold
    # FSI and PDI take no room (no missing-glyph boxes): the hover's text is as wide without them.
    with_marks, without = page.evaluate(ISOLATE_MARKS_WIDTH, f"{isolate(EVIL)} #{run.pk}")
    assert abs(with_marks - without) < 0.5, (with_marks, without)
    page.screenshot(path=shots / "isolated-compare-hover.png")

    page.context.clear_cookies()
    login(curator, f"/accounts/people/{annotator.pk}/")
    fits_the_screen(page, page.url)
    option = page.locator(f'#person-runs option[value="{run.pk}"]')
    assert option.text_content() == f"{isolate(EVIL)} #{run.pk}"
    page.locator("#person-runs select").select_option(str(short.pk))
    page.locator("#person-runs").scroll_into_view_if_needed()
    page.screenshot(path=shots / "isolated-option.png")
    assert page_errors == []
