// The compare page: the metrics of each picked run (JSON API), one chart per metric, a line per run.
"use strict";
(async function () {
  const runs = JSON.parse(document.getElementById("compare-data").textContent);
  const overview = JSON.parse(document.getElementById("compare-overview").textContent);
  const board = new ChartBoard(document.getElementById("charts"), { pinned: overview });
  bindChartControls(board, document.querySelector("[data-chart-controls]"));
  const label = (run) => run.name + " #" + run.id; // names may repeat; ids do not

  const legend = document.getElementById("compare-legend");
  runs.forEach((run, i) => {
    board.colors.set(label(run), CHART_PALETTE[i % CHART_PALETTE.length]);
    const item = document.createElement("span");
    item.innerHTML = "<i></i><a></a>";
    item.querySelector("i").style.background = board.colors.get(label(run));
    item.querySelector("a").href = run.url;
    item.querySelector("a").textContent = label(run);
    legend.appendChild(item);
  });

  await Promise.all(runs.map(async (run) => {
    const response = await fetch(run.metrics_url, { headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const { metrics } = await response.json();
    for (const [role, points] of Object.entries(metrics)) {
      const series = new Map();
      for (const { step, values } of points) {
        for (const [key, value] of Object.entries(flattenMetrics(values))) {
          if (!series.has(key)) series.set(key, { steps: [], values: [] });
          series.get(key).steps.push(step);
          series.get(key).values.push(value);
        }
      }
      for (const [key, s] of series) board.setSeries(role + "/" + key, chartSection(role, key), key, label(run), s.steps, s.values);
    }
  }));
  const empty = document.querySelector("#charts .charts-empty");
  if (empty) empty.textContent = "These runs have no metrics yet.";
})();
