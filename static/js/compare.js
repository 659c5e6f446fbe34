// The compare page: the metrics of each picked run (its metrics.json download, or for a run that
// has not ended its live snapshot and updates), one chart per metric, a line per run, which the
// legend shows or hides; relative time counts from each run's own first point.
"use strict";
(async function () {
  const runs = JSON.parse(document.getElementById("compare-data").textContent);
  const overview = JSON.parse(document.getElementById("compare-overview").textContent);
  const board = new ChartBoard(document.getElementById("charts"), { pinned: overview, legends: false });
  bindChartControls(board, document.querySelector("[data-chart-controls]"));
  // Names may repeat; ids do not. The name isolated (bidi.js): the charts' hover shows the label.
  const label = (run) => isolate(run.name) + " #" + run.id;

  // The page's legend names each run's line (colour and dash, in the order picked); unticking a run
  // hides its lines in every chart. Lines were told apart by colour alone, which repeats after 8.
  const legend = document.getElementById("compare-legend");
  runs.forEach((run) => {
    const { color, dashArray } = board.style(label(run));
    const item = document.createElement("label");
    item.dataset.run = run.id;
    item.title = "Show or hide this run's lines in every chart";
    item.innerHTML = '<input type="checkbox" checked><svg width="28" height="8" aria-hidden="true">'
      + '<line x1="1" y1="4" x2="27" y2="4" stroke-width="2.5"></line></svg><span><bdi></bdi></span>';
    const line = item.querySelector("line");
    line.setAttribute("stroke", color);
    if (dashArray) line.setAttribute("stroke-dasharray", dashArray);
    item.querySelector("bdi").textContent = balanced(run.name); // isolated and balanced, as the page's names are (app.css)
    item.querySelector("span").append(" #" + run.id);
    const box = item.querySelector("input");
    box.addEventListener("change", () => board.setHidden(label(run), !box.checked));
    legend.appendChild(item);
  });

  // Each run's points as series: "role/key" -> {role, key, steps, values, times}. A time is ISO 8601
  // in the metrics download and Unix seconds in a live snapshot or update.
  function seriesOf(metrics) {
    const series = new Map();
    for (const [role, points] of Object.entries(metrics)) {
      for (const { step, time, values } of points) {
        const seconds = typeof time === "number" ? time : Date.parse(time) / 1000;
        for (const [key, value] of Object.entries(flattenMetrics(values))) {
          const id = role + "/" + key;
          if (!series.has(id)) series.set(id, { role, key, steps: [], values: [], times: [] });
          series.get(id).steps.push(step);
          series.get(id).values.push(value);
          series.get(id).times.push(seconds);
        }
      }
    }
    return series;
  }

  function draw(run, metrics) {
    const series = seriesOf(metrics);
    // The run's first point: where its relative time counts from.
    let origin = Infinity;
    for (const s of series.values()) for (const t of s.times) if (t != null && t < origin) origin = t;
    if (Number.isFinite(origin)) board.setOrigin(label(run), origin);
    for (const [id, s] of series) board.setSeries(id, chartSection(s.role, s.key), s.key, label(run), s.steps, s.values, s.times);
  }

  // A run that has not ended is followed as the run page follows it (live.js): its snapshot, then
  // its points and status as they come. The others are drawn once from their metrics download.
  const legendStatus = (run, status) => {
    const chip = legend.querySelector(`[data-run="${run.id}"] .status`);
    if (chip) { chip.className = "status " + status; chip.textContent = status; }
  };
  runs.forEach((run) => {
    if (!run.live_url) return;
    const chip = document.createElement("span");
    chip.className = "status " + run.status;
    chip.textContent = run.status;
    legend.querySelector(`[data-run="${run.id}"]`).appendChild(chip);
  });

  // Fetched together, drawn in the order picked: each chart's lines (and their hover) in that order.
  const ended = runs.filter((run) => !run.live_url);
  const fetched = await Promise.all(ended.map(async (run) => {
    const response = await fetch(run.metrics_url, { headers: { Accept: "application/json" } });
    return response.ok ? (await response.json()).metrics : {};
  }));
  ended.forEach((run, i) => draw(run, fetched[i]));
  const following = runs.filter((run) => run.live_url).map((run) => {
    const live = new LiveRun({
      snapshotUrl: run.live_url,
      socketUrl: liveSocketUrl(run.ws_path),
      onSnapshot: (snapshot) => { draw(run, snapshot.metrics); legendStatus(run, snapshot.run.status); },
      onUpdates: (updates) => {
        const points = {};
        for (const update of updates) {
          if (update.type === "status") legendStatus(run, update.status);
          else if (update.type === "metrics") (points[update.role] ||= []).push(update);
        }
        for (const [id, s] of seriesOf(points)) {
          board.appendPoints(id, chartSection(s.role, s.key), s.key, label(run), s.steps, s.values, s.times);
        }
      },
    });
    live.start();
    return live;
  });
  window.rftCompare = { board, following }; // a handle for browser tests and the console
  const empty = document.querySelector("#charts .charts-empty");
  if (empty) empty.textContent = "These runs have no metrics yet.";
})();
