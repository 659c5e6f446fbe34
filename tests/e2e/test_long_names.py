"""What people name things does not break the pages, in Chromium at 1366x768 against the real
server: a 200-character run name without spaces, a 3000-character token in a run's notes and a
150-character user name keep every page within the screen (the runs list's Run column was 2135 px
wide, the run page 25,573 px), and a right-to-left override (U+202E) in a run name stays inside it
(compare showed "7#" for "#7")."""

import pytest

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import services
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

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
