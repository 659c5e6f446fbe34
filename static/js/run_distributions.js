// The run page's Distributions panel (apps/runs/distributions.py): for the reward and the
// response length, the middle 90 % and 50 % of each explorer step's rollouts as shaded bands and
// their median as a line. Fetched when the panel opens, and again every REFRESH_MS while it is
// open and the run trains.
"use strict";
(function () {
  const panel = document.getElementById("run-distributions");
  if (!panel) return;
  const REFRESH_MS = 15000;
  const BAND = "rgba(26, 115, 232, 0.14)"; // both bands the same fill: where they overlap, the middle half is darker
  const LINE = "#1a73e8";
  const empty = panel.querySelector("[data-distributions-empty]");
  let timer = null;

  function band(steps, low, high, name) {
    // The lower edge, then the upper one filled down to it.
    return [
      { x: steps, y: low, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false },
      { x: steps, y: high, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: BAND, name,
        hoverinfo: "skip", showlegend: false },
    ];
  }

  function draw(element, name, steps, bands) {
    const traces = [
      ...band(steps, bands["0.05"], bands["0.95"], "5–95 %"),
      ...band(steps, bands["0.25"], bands["0.75"], "25–75 %"),
      { x: steps, y: bands["0.5"], mode: "lines", line: { color: LINE, width: 2 }, name: "median",
        customdata: steps.map((_, i) => [bands["0.05"][i], bands["0.25"][i], bands["0.75"][i], bands["0.95"][i]]),
        hovertemplate: "step %{x}<br>median %{y:.4~g}<br>25–75 %: %{customdata[1]:.4~g} – %{customdata[2]:.4~g}"
          + "<br>5–95 %: %{customdata[0]:.4~g} – %{customdata[3]:.4~g}<extra></extra>" },
    ];
    Plotly.react(element, traces, {
      title: { text: name, x: 0.02, xanchor: "left", font: { size: 13 } },
      margin: { l: 62, r: 14, t: 32, b: 40 }, height: 260, showlegend: false, hovermode: "closest",
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, sans-serif", size: 11, color: "#1d2330" },
      xaxis: { title: { text: "explorer step", font: { size: 10, color: "#6b7385" } }, gridcolor: "#eef0f4", zeroline: false },
      yaxis: { title: { text: name, font: { size: 10, color: "#6b7385" } }, gridcolor: "#eef0f4", zeroline: false,
        tickformat: "~g" },
    }, { displaylogo: false, responsive: true });
  }

  async function load() {
    clearTimeout(timer);
    let found;
    try {
      const response = await fetch(panel.dataset.url, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      found = await response.json();
    } catch (error) {
      empty.hidden = false;
      empty.textContent = `Could not load the distributions (${error.message}).`;
      return;
    }
    empty.hidden = found.rollouts > 0;
    empty.textContent = "No rollouts in the buffer yet" + (found.active ? ": bands appear as the explorer steps." : ".");
    const steps = found.step_width > 1 ? found.steps.map((s) => s + (found.step_width - 1) / 2) : found.steps;
    for (const element of panel.querySelectorAll("[data-distribution]")) {
      const figure = found.figures[element.dataset.distribution];
      element.hidden = !figure;
      if (figure && window.Plotly) draw(element, element.dataset.distribution, steps, figure.bands);
    }
    if (found.active && panel.open) timer = setTimeout(load, REFRESH_MS);
  }

  panel.addEventListener("toggle", () => { if (panel.open) load(); else clearTimeout(timer); });
})();
