// The run page: charts and figures from the live snapshot and updates (LiveRun, ChartBoard).
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("run-page-data").textContent);
  const board = new ChartBoard(document.getElementById("charts"));
  bindChartControls(board, document.querySelector("[data-chart-controls]"));
  const badge = document.getElementById("run-status");
  const dot = document.getElementById("live-dot");
  const errorBox = document.getElementById("run-error");
  const progress = document.getElementById("run-progress");
  const figures = Object.fromEntries([...document.querySelectorAll("[data-state]")].map((el) => [el.dataset.state, el]));

  const counters = {}; // step counters and model version only move forward (a replayed step must not move them back)

  function showFigure(name, value) {
    if (value === undefined || value === null || !figures[name]) return;
    if (name !== "latest_reward") {
      if (value < counters[name]) return;
      counters[name] = value;
    }
    figures[name].textContent = typeof value === "number" && !Number.isInteger(value) ? value.toFixed(3) : value;
    if (name === "trainer_step" && page.total_steps) {
      progress.style.width = Math.min(100, (100 * value) / page.total_steps) + "%";
    }
  }

  function showStatus(status, error) {
    badge.textContent = status;
    badge.className = "status " + status;
    document.querySelectorAll("form[data-statuses]").forEach((form) => {
      form.hidden = !form.dataset.statuses.split(" ").includes(status);
    });
    if (error !== undefined) {
      errorBox.hidden = !error;
      errorBox.querySelector("pre").textContent = error || "";
    }
  }

  // The figures one role's metrics move: its step counter, the model version, the reward.
  function showMetricFigures(role, step, values) {
    if (role === "explorer" || role === "trainer") showFigure(role + "_step", step);
    showFigure("model_version", values.model_version);
    if (role === "explorer") showFigure("latest_reward", page.reward_keys.map((key) => values[key]).find(Number.isFinite));
  }

  // Points of one role grouped by chart: {chartId: {section, title, steps, values}}.
  function chartPoints(role, points, into = new Map()) {
    for (const { step, values } of points) {
      const flat = flattenMetrics(values);
      for (const [key, value] of Object.entries(flat)) {
        const id = role + "/" + key;
        if (!into.has(id)) into.set(id, { section: chartSection(role, key), title: key, steps: [], values: [] });
        into.get(id).steps.push(step);
        into.get(id).values.push(value);
      }
    }
    const last = points[points.length - 1];
    if (last) showMetricFigures(role, last.step, flattenMetrics(last.values));
    return into;
  }

  function onSnapshot(snapshot) {
    for (const [role, points] of Object.entries(snapshot.metrics)) {
      for (const [id, chart] of chartPoints(role, points)) board.setSeries(id, chart.section, chart.title, "value", chart.steps, chart.values);
    }
    const run = snapshot.run;
    ["explorer_step", "trainer_step", "model_version"].forEach((name) => showFigure(name, run[name]));
    showStatus(run.status, run.error);
  }

  function onUpdates(updates) {
    const charts = new Map();
    for (const update of updates) {
      if (update.type === "status") showStatus(update.status, update.error);
      else if (update.type === "progress") ["explorer_step", "trainer_step", "model_version"].forEach((name) => showFigure(name, update[name]));
      else if (update.type === "metrics") chartPoints(update.role, [update], charts);
    }
    for (const [id, chart] of charts) board.appendPoints(id, chart.section, chart.title, "value", chart.steps, chart.values);
  }

  function onConnection(state) {
    dot.className = "live-dot " + state;
    dot.textContent = { live: "live", offline: "reconnecting…", forbidden: "not allowed to watch" }[state];
  }

  const live = new LiveRun({ snapshotUrl: page.live_url, socketUrl: liveSocketUrl(page.ws_path), onSnapshot, onUpdates, onConnection });
  window.rftRunPage = { live, board }; // a handle for browser tests and the console
  live.start();
})();
