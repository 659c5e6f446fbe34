// The compare page: the metrics of each picked run (its metrics.json download), one chart per
// metric, a line per run, which the legend shows or hides; relative time counts from each run's
// own first point.
"use strict";
(async function () {
  const runs = JSON.parse(document.getElementById("compare-data").textContent);
  const overview = JSON.parse(document.getElementById("compare-overview").textContent);
  const board = new ChartBoard(document.getElementById("charts"), { pinned: overview, legends: false });
  bindChartControls(board, document.querySelector("[data-chart-controls]"));
  const label = (run) => run.name + " #" + run.id; // names may repeat; ids do not

  // The page's legend names each run's line (colour and dash, in the order picked); unticking a run
  // hides its lines in every chart. Lines were told apart by colour alone, which repeats after 8.
  const legend = document.getElementById("compare-legend");
  runs.forEach((run) => {
    const { color, dashArray } = board.style(label(run));
    const item = document.createElement("label");
    item.title = "Show or hide this run's lines in every chart";
    item.innerHTML = '<input type="checkbox" checked><svg width="28" height="8" aria-hidden="true">'
      + '<line x1="1" y1="4" x2="27" y2="4" stroke-width="2.5"></line></svg><span></span>';
    const line = item.querySelector("line");
    line.setAttribute("stroke", color);
    if (dashArray) line.setAttribute("stroke-dasharray", dashArray);
    item.querySelector("span").textContent = label(run);
    const box = item.querySelector("input");
    box.addEventListener("change", () => board.setHidden(label(run), !box.checked));
    legend.appendChild(item);
  });

  // Fetched together, drawn in the order picked: each chart's lines (and their hover) in that order.
  const fetched = await Promise.all(runs.map(async (run) => {
    const response = await fetch(run.metrics_url, { headers: { Accept: "application/json" } });
    return response.ok ? (await response.json()).metrics : {};
  }));
  runs.forEach((run, i) => {
    const series = new Map(); // "role/key" -> {role, key, steps, values, times}
    let origin = Infinity; // the run's first point: where its relative time counts from
    for (const [role, points] of Object.entries(fetched[i])) {
      for (const { step, time, values } of points) {
        const seconds = Date.parse(time) / 1000; // ISO 8601
        if (seconds < origin) origin = seconds;
        for (const [key, value] of Object.entries(flattenMetrics(values))) {
          const id = role + "/" + key;
          if (!series.has(id)) series.set(id, { role, key, steps: [], values: [], times: [] });
          series.get(id).steps.push(step);
          series.get(id).values.push(value);
          series.get(id).times.push(seconds);
        }
      }
    }
    board.setOrigin(label(run), origin);
    for (const [id, s] of series) board.setSeries(id, chartSection(s.role, s.key), s.key, label(run), s.steps, s.values, s.times);
  });
  const empty = document.querySelector("#charts .charts-empty");
  if (empty) empty.textContent = "These runs have no metrics yet.";
})();
