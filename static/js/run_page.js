// The run page: key figures, charts and status from the live snapshot and updates (LiveRun,
// ChartBoard). A key figure shows the newest value of the first of its candidate charts the run
// reports (apps/runs/queries.key_figures), with a sparkline of that chart.
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("run-page-data").textContent);
  const figureSpecs = page.figures.filter((figure) => figure.candidates);
  const board = new ChartBoard(document.getElementById("charts"), { pinned: page.overview, stepTitles: page.step_titles });
  bindChartControls(board, document.querySelector("[data-chart-controls]"));
  const badge = document.getElementById("run-status");
  const dot = document.getElementById("live-dot");
  const errorBox = document.getElementById("run-error");
  const progress = document.getElementById("run-progress");
  const counterElements = Object.fromEntries([...document.querySelectorAll("[data-state]")].map((el) => [el.dataset.state, el]));
  const SPARK_POINTS = 120; // a sparkline is 100 units wide: more points would not show
  const SERIES = "value"; // the run page's one series a chart
  const PER_EXPLORER = /^(tokens_per_s|idle_share|sync_seconds)\/(explorer(?:-\d+)?)$/;
  const TRAINER_BESIDE = ["idle_share", "sync_seconds"];
  const EXPLORERS_SECTION = "system · explorers";
  // A system point holds each duty's figures under its name (apps/runs/system.py): a chart a
  // figure, a line a duty.
  const PER_DUTY = /^(server|loop|trainer|explorer(?:-\d+)?|trainer-node-\d+)\/([^/]+)$/;
  // The share of groups whose rewards were all equal (workers/rft/algorithms/advantages.py): over
  // ZERO_VARIANCE_SHARE on average in the last ZERO_VARIANCE_STEPS explorer steps, the page says
  // that most of the batch trains nothing.
  const ZERO_VARIANCE = "explorer/advantage/zero_variance_groups";
  const ZERO_VARIANCE_STEPS = 5;
  const ZERO_VARIANCE_MIN_STEPS = 3;
  const ZERO_VARIANCE_SHARE = 0.8;
  // A run whose task selector learns pass rates logs this (workers/rft/task_selectors.py): it draws
  // the tasks nearest its target already, and is not told to.
  const SELECTOR_LEARNS = "explorer/selector/target_gap";
  const zeroVarianceHint = document.getElementById("zero-variance-hint");
  const runName = document.querySelector(".page-head h1").textContent;
  // The flash a control left ("Stopping <run>.", from its form's post) says what the run was
  // becoming: once its status moves on, the flash says where it is now.
  const CONTROL_FLASHES = { stopping: `Stopping ${runName}.`, paused: `Paused ${runName}.` };

  // Step counters and model version move forward with updates (a replayed step must not move them
  // back); a snapshot sets them (after a trainer's rewind, back to its checkpoint's).
  const counters = {};
  let status = badge.dataset.status; // the run's own; the badge may say it as the runs list does (run_duties.js)
  let connection = "connecting";

  function showCounter(name, value) {
    if (value === undefined || value === null || !counterElements[name] || value < counters[name]) return;
    counters[name] = value;
    counterElements[name].textContent = value;
    if (name === page.progress_counter && page.total_steps) {
      progress.style.width = Math.min(100, (100 * value) / page.total_steps) + "%";
    }
  }

  function formatFigure(value, format) {
    return format === "rate" ? Math.round(value).toLocaleString("en-US") : value.toFixed(3);
  }

  function drawSparkline(svg, values) {
    const every = Math.ceil(values.length / SPARK_POINTS);
    const shown = values.filter((_, i) => i % every === 0 || i === values.length - 1);
    const min = Math.min(...shown), max = Math.max(...shown);
    const points = shown.map((value, i) => {
      const x = shown.length > 1 ? (100 * i) / (shown.length - 1) : 100;
      const y = max > min ? 30 - (28 * (value - min)) / (max - min) : 16;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    if (points.length === 1) points.unshift("0," + points[0].split(",")[1]);
    svg.querySelector("polyline").setAttribute("points", points.join(" "));
  }

  // The line under a figure's value: where it was measured, and what else helps read it.
  function figureNote(figure, id, series) {
    const role = id.slice(0, id.indexOf("/"));
    const step = series.steps[series.steps.length - 1];
    // A bench run's score is of a model version, not of an explorer step (Loop.bench).
    if (figure.id === "heldout" && page.bench) return `${id.slice(id.indexOf("/") + 1)} · model v${step}`;
    if (figure.id === "heldout") return `explorer step ${step} · best ${formatFigure(Math.max(...series.values), figure.format)}`;
    if (figure.id === "throughput") {
      const seconds = board.series(role + "/seconds", SERIES);
      const perStep = seconds ? ` · ${seconds.values[seconds.values.length - 1].toFixed(2)} s a step` : "";
      return `${role}${perStep}`;
    }
    return `${role === "trainer" ? "trainer" : "explorer"} step ${step}`;
  }

  function showFigures() {
    for (const figure of figureSpecs) {
      const found = figure.candidates.find(([id]) => board.series(id, SERIES)?.values.length);
      if (!found) continue;
      const [id, label] = found;
      const series = board.series(id, SERIES);
      const element = document.querySelector(`[data-figure="${figure.id}"]`);
      element.title = "from " + id.replace("/", " · "); // which metric it is
      element.querySelector(".label").textContent = label;
      element.querySelector(".value").textContent = formatFigure(series.values[series.values.length - 1], figure.format)
        + (figure.unit ? " " + figure.unit : "");
      element.querySelector(".sub").textContent = figureNote(figure, id, series);
      drawSparkline(element.querySelector("svg"), series.values);
    }
  }

  // "live" only while the run is active: a finished run says what it finished as.
  function showDot() {
    const finished = page.finished_statuses.includes(status);
    dot.className = "live-dot " + (finished ? "finished" : connection);
    dot.textContent = finished ? status
      : { connecting: "connecting", live: "live", offline: "reconnecting…", forbidden: "not allowed to watch" }[connection];
  }

  function showZeroVarianceHint() {
    const series = board.series(ZERO_VARIANCE, SERIES);
    const recent = series ? series.values.slice(-ZERO_VARIANCE_STEPS) : [];
    const share = recent.reduce((sum, value) => sum + value, 0) / (recent.length || 1);
    zeroVarianceHint.hidden = recent.length < ZERO_VARIANCE_MIN_STEPS || share < ZERO_VARIANCE_SHARE;
    if (zeroVarianceHint.hidden) return;
    zeroVarianceHint.textContent = `${Math.round(100 * share)}% of groups had equal rewards in the last `
      + `${recent.length} explorer steps: they carry no learning signal (GRPO advantages are 0). `
      + (page.algorithm === "mix"
        // The demo's own preset trips this in its first minute: a random model's 8 answers all
        // score 0 until the expert half has taught it the format (#42, finding 7).
        ? "Expected early in a MIX run: the expert half (SFT) teaches until the model's own answers start "
          + "to differ. Later it means the tasks are all solved (or all failed) by the model: make them harder "
          + "(or easier), or raise repeat_times or temperature."
        : "Make tasks harder or easier, raise repeat_times or temperature, or use a graded reward.")
      + (board.series(SELECTOR_LEARNS, SERIES) ? ""
        : " Or let buffer.task_selector difficulty_based draw the tasks the model passes about half the time.");
  }

  function updateControlFlashes() {
    const finished = page.finished_statuses.includes(status);
    document.querySelectorAll(".flash.success").forEach((flash) => {
      const becoming = Object.keys(CONTROL_FLASHES).find((state) => flash.textContent === CONTROL_FLASHES[state]);
      // The name stays the flash's <bdi> (the server isolates it: apps/core/bidi.py).
      if (becoming && becoming !== status) flash.replaceChildren(flash.querySelector("bdi"), finished ? ` ${status}.` : ` is ${status}.`);
    });
  }

  function showStatus(newStatus, error) {
    const changed = newStatus !== status;
    status = newStatus;
    badge.dataset.status = status;
    if (status === "completed") showCounter("evaluation", 1); // a bench run's one (views.run_detail)
    if (changed) { // unchanged, the badge keeps what the runs list says ("queued": run_duties.js)
      badge.textContent = status;
      badge.className = "status " + status;
    }
    document.querySelectorAll("form[data-statuses]").forEach((form) => {
      form.hidden = !form.dataset.statuses.split(" ").includes(status);
    });
    if (error !== undefined) {
      errorBox.hidden = !error;
      errorBox.querySelector("pre").textContent = error || "";
    }
    showDot();
    updateControlFlashes();
    // The Logs panel and the duty lines read again at each change: an end brings the workers' last
    // lines (a stop's checkpoint, a failure's traceback), and a run resumed from elsewhere (the
    // API, `rft_resume`, another tab) polls again: both had stopped at "stopped", and the resumed
    // duty's lines and worker never showed on the open page.
    if (changed) {
      window.rftRunLogs?.load();
      window.rftRunDuties?.poll();
      if (page.bench) reloadBenchResults();
    }
  }

  // The checkpoints table, newest first ({version, step, saved: Unix seconds, url, save_url,
  // models: the names of the models saved from it} each).
  function showCheckpoints(checkpoints) {
    const table = document.getElementById("run-checkpoints");
    if (!table) return; // a bench run's page has none: it trains nothing
    const rows = checkpoints.map(({ version, step, saved, url, save_url, models }) => {
      const row = document.createElement("tr");
      row.innerHTML = "<td></td><td></td><td class=\"muted\"></td><td><a download>Download .tar</a></td>";
      row.cells[0].textContent = "v" + version;
      row.cells[1].textContent = step;
      row.cells[2].textContent = ago(saved);
      row.cells[2].title = new Date(saved * 1000).toLocaleString();
      row.querySelector("a").href = url;
      const links = [...models.map((name) => [`saved as ${name}`, `${table.dataset.models}#model-${name}`]),
                     ["Save as model", save_url]];
      for (const [text, href] of links) {
        const link = document.createElement("a");
        link.textContent = text;
        link.href = href;
        row.cells[3].append(" · ", link);
      }
      return row;
    });
    if (!rows.length) {
      rows.push(document.createElement("tr"));
      rows[0].innerHTML = "<td colspan=\"4\" class=\"muted\"></td>";
      rows[0].cells[0].textContent = table.dataset.empty;
    }
    table.tBodies[0].replaceChildren(...rows);
  }

  // A bench run's Evaluation card (templates/runs/_bench_results.html) is the server's: read again
  // from the page when its scores arrive or its status changes (it said "No score yet" to the end).
  async function reloadBenchResults() {
    const card = document.getElementById("bench-results");
    if (!card) return;
    const response = await fetch(location.pathname, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html").getElementById("bench-results");
    if (fresh) card.replaceWith(document.importNode(fresh, true));
  }

  // "12 s ago", "4 min ago", "3 h ago", "2 days ago".
  function ago(seconds) {
    const passed = Math.max(0, Date.now() / 1000 - seconds);
    const [size, unit] = [[86400, "day"], [3600, "h"], [60, "min"]].find(([each]) => passed >= each) || [1, "s"];
    const count = Math.floor(passed / size);
    return count + " " + unit + (unit === "day" && count !== 1 ? "s" : "") + " ago";
  }

  function showProgress(values) {
    ["explorer_step", "trainer_step", "model_version"].forEach((name) => showCounter(name, values[name]));
  }

  // Points of one role grouped by chart and line: {id + line: {id, line, section, title, steps, values}}.
  // A run with several explorers also draws each explorer's figures (tokens_per_s/explorer-1...)
  // as lines of one chart per figure, with the trainer's idle share and sync seconds beside them,
  // in the "system · explorers" section, and each duty's system figures as lines of one chart.
  function chartPoints(role, points, into = new Map()) {
    let time; // the point's, in Unix seconds: the charts' time axes
    const add = (id, line, section, title, step, value) => {
      const entry = id + "\n" + line;
      if (!into.has(entry)) into.set(entry, { id, line, section, title, steps: [], values: [], times: [] });
      into.get(entry).steps.push(step);
      into.get(entry).values.push(value);
      into.get(entry).times.push(time ?? null);
    };
    for (const point of points) {
      const { step, values } = point;
      time = point.time;
      const flat = flattenMetrics(values);
      for (const [key, value] of Object.entries(flat)) {
        const each = role === "explorer" && PER_EXPLORER.exec(key);
        const duty = role === "system" && PER_DUTY.exec(key);
        if (each) add("explorer/by explorer/" + each[1], each[2], EXPLORERS_SECTION, each[1], step, value);
        else if (duty) add("system/" + duty[2], duty[1], "system", duty[2], step, value);
        else add(role + "/" + key, SERIES, chartSection(role, key), key, step, value);
        if (role === "trainer" && TRAINER_BESIDE.includes(key) && board.charts.has("explorer/by explorer/" + key)) {
          add("explorer/by explorer/" + key, "trainer", EXPLORERS_SECTION, key, step, value);
        }
      }
    }
    const last = points[points.length - 1];
    if (last && (role === "explorer" || role === "trainer")) showCounter(role + "_step", last.step);
    if (last) showCounter("model_version", flattenMetrics(last.values).model_version);
    return into;
  }

  function onSnapshot(snapshot) {
    // The explorer's first: the trainer's lines join the per-explorer charts (chartPoints).
    const roles = Object.entries(snapshot.metrics).sort(([a], [b]) => (b === "explorer") - (a === "explorer"));
    const lines = new Set();
    for (const [role, points] of roles) {
      for (const [line, chart] of chartPoints(role, points)) {
        board.setSeries(chart.id, chart.section, chart.title, chart.line, chart.steps, chart.values, chart.times);
        lines.add(line);
      }
    }
    // A line the snapshot no longer has: a trainer rewound to step 0 took all its points.
    for (const chart of board.charts.values()) {
      for (const name of chart.series.keys()) {
        if (!lines.has(chart.id + "\n" + name)) board.setSeries(chart.id, chart.home, chart.title, name, [], []);
      }
    }
    showFigures();
    showZeroVarianceHint();
    // The run's counters say where it is: after a rewind, behind its explorer points' model versions.
    Object.keys(counters).forEach((name) => delete counters[name]);
    showProgress(snapshot.run);
    showCheckpoints(snapshot.checkpoints);
    showStatus(snapshot.run.status, snapshot.run.error);
  }

  function onUpdates(updates) {
    const charts = new Map();
    for (const update of updates) {
      if (update.type === "status") showStatus(update.status, update.error);
      else if (update.type === "progress") showProgress(update);
      else if (update.type === "checkpoints") showCheckpoints(update.checkpoints);
      else if (update.type === "metrics") chartPoints(update.role, [update], charts);
      else if (update.type === "activity") window.rftRunDuties?.hear(update); // the duty line (run_duties.js)
    }
    for (const chart of charts.values()) {
      board.appendPoints(chart.id, chart.section, chart.title, chart.line, chart.steps, chart.values, chart.times);
    }
    if (page.bench && updates.some((update) => update.type === "metrics" && update.role === "eval")) reloadBenchResults();
    if (charts.size) {
      showFigures();
      showZeroVarianceHint();
    }
  }

  function onConnection(state) {
    connection = state;
    showDot();
  }

  const live = new LiveRun({ snapshotUrl: page.live_url, socketUrl: liveSocketUrl(page.ws_path), onSnapshot, onUpdates, onConnection });
  window.rftRunPage = { live, board }; // a handle for browser tests and the console
  live.start();
})();
