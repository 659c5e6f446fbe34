"""The sweep page's parallel-coordinates chart in Chromium at 1366x768 (static/js/sweep_page.js):
each axis named above the plot, a tick at each value of a grid's key, tick labels on a ground of
their own. Screenshots go to $RFTWEB_SCREENSHOTS (default test-artifacts/)."""
import itertools

import pytest
from playwright.sync_api import expect

from apps.runs import services
from apps.runs.models import Run, Sweep

from .test_dashboard import DEMO_CONFIG, SCREEN, SHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SPACE = [{"key": "trainer.lr", "values": [0.0005, 0.001, 0.002]}, {"key": "algorithm.repeat_times", "values": [4, 8]}]


def test_the_sweep_chart_names_its_axes_and_ticks_each_grid_value(page, login, researcher, page_errors):
    sweep = Sweep.objects.create(name="lr sweep", owner=researcher, method="grid", space=SPACE, count=6,
                                 base_config=DEMO_CONFIG)
    for index, (lr, repeat) in enumerate(itertools.product(*(axis["values"] for axis in SPACE))):
        run = Run.objects.create(name=f"lr sweep · lr={lr} · repeat_times={repeat}", owner=researcher,
                                 config=DEMO_CONFIG, status=Run.Status.COMPLETED, sweep=sweep,
                                 swept={"trainer.lr": lr, "algorithm.repeat_times": repeat})
        services.record_metrics(run, "eval", 4, {"exact_match": index / 20})
    page.set_viewport_size(SCREEN)
    login(researcher, f"/sweeps/{sweep.pk}/")
    expect(page.locator("#sweep-chart .scatterlayer .trace")).to_have_count(6)
    # Each run's name isolated in its hover (static/js/bidi.js), as Plotly's text takes no <bdi>.
    hovers = page.evaluate("() => document.getElementById('sweep-chart').data.map((trace) => trace.hovertemplate)")
    assert all(hover.startswith("\u2068lr sweep · lr=") and "\u2069<br>" in hover for hover in hovers), hovers
    texts = page.evaluate("() => [...document.querySelectorAll('#sweep-chart .annotation-text')].map((a) => "
                          "a.textContent)")
    # The axis names were placed at y 1.12 in data coordinates, past the range: Plotly drew none.
    for name in ("trainer.lr", "algorithm.repeat_times", "Held-out accuracy (best)"):
        assert name in texts, texts
    # Every grid value has its tick; lr's middle value had none (ticks only at the ends).
    assert {"5.0e-4", "1.0e-3", "2.0e-3", "4", "8"} <= set(texts), texts
    # Each name above the plot area, inside the chart.
    boxes = page.evaluate("""() => { const chart = document.querySelector('#sweep-chart').getBoundingClientRect();
        const plot = document.querySelector('#sweep-chart .nsewdrag').getBoundingClientRect();
        return [...document.querySelectorAll('#sweep-chart .annotation')].filter((a) => a.textContent.includes('.')
          && !/^[0-9]/.test(a.textContent)).map((a) => { const box = a.getBoundingClientRect();
          return [a.textContent, box.top >= chart.top, box.bottom <= plot.top + 2]; }); }""")
    assert boxes and all(inside and above for _, inside, above in boxes), boxes
    expect(page.locator("#sweep-runs h2")).to_have_text("Runs, ranked by held-out accuracy (best)")
    page.locator("#sweep-chart").scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "sweep-chart.png")
    assert page_errors == []
