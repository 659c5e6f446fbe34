// Metric charts as small multiples: one Plotly chart per metric key, in sections by role and key
// prefix ("trainer · loss" for trainer "loss/policy"). Each series keeps its raw points and shows
// them faintly under an exponential moving average. Live points are appended with
// Plotly.extendTraces; a chart is redrawn only when it is new or a step was rewritten.
"use strict";

const CHART_PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#1098ad", "#7048e8", "#f08c00", "#495057"];
const ROLE_ORDER = ["explorer", "trainer", "eval", "system"];
// Metric names are still settling: match loosely, so the charts people look at first come first.
const KEY_PRIORITY = [/reward|accuracy|acc\b/, /loss/, /kl/, /entropy/, /clip/, /grad/, /length|tokens/, /stale|version/];

// {"loss": 1, "reward": {"exact_match": 0.5}} -> {"loss": 1, "reward/exact_match": 0.5}; numbers only.
function flattenMetrics(values, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(values || {})) {
    const name = prefix ? prefix + "/" + key : key;
    if (typeof value === "number" && Number.isFinite(value)) out[name] = value;
    else if (typeof value === "boolean") out[name] = Number(value);
    else if (value && typeof value === "object" && !Array.isArray(value)) flattenMetrics(value, name, out);
  }
  return out;
}

// Plotly reads a few HTML tags in titles and trace names; run names and metric keys are plain text.
function plotlyText(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function chartSection(role, key) {
  const slash = key.indexOf("/");
  return slash > 0 ? role + " · " + key.slice(0, slash) : role;
}

function sectionRank(section) {
  const role = section.split(" · ")[0];
  const index = ROLE_ORDER.indexOf(role);
  return [index < 0 ? ROLE_ORDER.length : index, section.includes(" · ") ? 1 : 0, section];
}

function keyRank(key) {
  const index = KEY_PRIORITY.findIndex((pattern) => pattern.test(key));
  return [index < 0 ? KEY_PRIORITY.length : index, key];
}

function compareRanks(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] < b[i]) return -1;
    if (a[i] > b[i]) return 1;
  }
  return 0;
}

// System metrics (CPU, memory) are numbered by Unix time, not by step: their charts get a time axis.
function isTimeSection(section) {
  return section.split(" · ")[0] === "system";
}

function chartX(chart, steps) {
  return chart.time ? steps.map((seconds) => new Date(seconds * 1000)) : steps.slice();
}

// Debiased EMA (as TensorBoard's): the first points are not pulled towards zero.
class Ema {
  constructor(alpha) { this.alpha = alpha; this.last = 0; this.weight = 0; }
  next(value) {
    this.last = this.last * this.alpha + (1 - this.alpha) * value;
    this.weight = this.weight * this.alpha + (1 - this.alpha);
    return this.last / this.weight;
  }
}

class ChartBoard {
  constructor(container, { smoothing = 0.6, logScale = false } = {}) {
    this.container = container;
    this.smoothing = smoothing;
    this.logScale = logScale;
    this.filter = "";
    this.charts = new Map(); // chart id -> {id, title, section, element, series: Map, drawn}
    this.sections = new Map(); // section title -> {element, grid}
    this.colors = new Map(); // series name -> colour, the same in every chart
    this.redrawQueue = new Set();
    // Plotly takes ~0.1 s a chart whatever its length: only charts near the viewport are drawn;
    // the others are drawn as they scroll into view (a long run has dozens).
    this.observer = new IntersectionObserver((entries) => this._onVisibility(entries), { rootMargin: "300px" });
  }

  _onVisibility(entries) {
    for (const entry of entries) {
      const chart = entry.target.chart;
      chart.visible = entry.isIntersecting;
      if (chart.visible && chart.stale) this._redraw(chart);
    }
  }

  // Replace a series' points (a snapshot, or one run's metrics on the compare page).
  setSeries(chartId, section, title, seriesName, steps, values) {
    const series = this._series(chartId, section, title, seriesName);
    series.steps = steps.slice();
    series.values = values.slice();
    this._resmooth(series);
    this._redraw(this.charts.get(chartId));
  }

  // Add points after the series' last step; a step at or before it rewrites the series instead
  // (a replayed step), which is rare enough to redraw for.
  appendPoints(chartId, section, title, seriesName, steps, values) {
    const series = this._series(chartId, section, title, seriesName);
    const chart = this.charts.get(chartId);
    const last = series.steps.length ? series.steps[series.steps.length - 1] : -Infinity;
    if (!steps.every((step, i) => step > (i ? steps[i - 1] : last))) {
      const byStep = new Map(series.steps.map((step, i) => [step, series.values[i]]));
      steps.forEach((step, i) => byStep.set(step, values[i]));
      const points = [...byStep.entries()].sort((a, b) => a[0] - b[0]);
      this.setSeries(chartId, section, title, seriesName, points.map((p) => p[0]), points.map((p) => p[1]));
      return;
    }
    const smoothed = values.map((value) => series.ema.next(value));
    series.steps.push(...steps);
    series.values.push(...values);
    series.smoothed.push(...smoothed);
    const hadLine = series.steps.length - steps.length >= 2; // else it was drawn as markers, or not yet
    if (!chart.drawn || !chart.visible || this.redrawQueue.has(chart) || !hadLine) {
      this._redraw(chart);
      return;
    }
    const index = 2 * [...chart.series.keys()].indexOf(seriesName);
    const x = chartX(chart, steps);
    Plotly.extendTraces(chart.element, { x: [x, x], y: [values, smoothed] }, [index, index + 1]);
  }

  setSmoothing(alpha) {
    this.smoothing = alpha;
    for (const chart of this.charts.values()) {
      chart.series.forEach((series) => this._resmooth(series));
      this._redraw(chart);
    }
  }

  setLogScale(on) {
    this.logScale = on;
    for (const chart of this.charts.values()) {
      if (chart.drawn) Plotly.relayout(chart.element, { "yaxis.type": on ? "log" : "linear" });
    }
  }

  setFilter(text) {
    this.filter = text.trim().toLowerCase();
    this.sections.forEach((section) => this._showMatching(section));
  }

  _showMatching(section) {
    for (const chart of section.charts) {
      const hidden = Boolean(this.filter) && !chart.id.toLowerCase().includes(this.filter);
      if (chart.element.hidden && !hidden && chart.drawn) requestAnimationFrame(() => Plotly.Plots.resize(chart.element));
      chart.element.hidden = hidden;
    }
    section.element.hidden = section.charts.every((chart) => chart.element.hidden);
  }

  _series(chartId, section, title, seriesName) {
    let chart = this.charts.get(chartId);
    if (!chart) {
      chart = { id: chartId, title, section, element: document.createElement("div"), series: new Map(), drawn: false,
        visible: false, stale: false, time: isTimeSection(section) };
      chart.element.className = "chart";
      chart.element.chart = chart;
      this.charts.set(chartId, chart);
      this._place(chart);
      this.observer.observe(chart.element);
      this._showMatching(this.sections.get(chart.section));
    }
    let series = chart.series.get(seriesName);
    if (!series) {
      if (!this.colors.has(seriesName)) this.colors.set(seriesName, CHART_PALETTE[this.colors.size % CHART_PALETTE.length]);
      series = { name: seriesName, steps: [], values: [], smoothed: [], ema: new Ema(this.smoothing) };
      chart.series.set(seriesName, series);
    }
    return series;
  }

  _resmooth(series) {
    series.ema = new Ema(this.smoothing);
    series.smoothed = series.values.map((value) => series.ema.next(value));
  }

  // Keep sections, and charts within a section, in rank order as they appear.
  _place(chart) {
    this.container.querySelector(".charts-empty")?.remove();
    let section = this.sections.get(chart.section);
    if (!section) {
      const element = document.createElement("div");
      element.className = "chart-section";
      element.innerHTML = "<h3></h3><div class=\"chart-grid\"></div>";
      element.querySelector("h3").textContent = chart.section;
      section = { element, grid: element.querySelector(".chart-grid"), rank: sectionRank(chart.section), charts: [] };
      const next = [...this.sections.values()].filter((other) => compareRanks(other.rank, section.rank) > 0)
        .sort((a, b) => compareRanks(a.rank, b.rank))[0];
      this.container.insertBefore(element, next ? next.element : null);
      this.sections.set(chart.section, section);
    }
    const rank = keyRank(chart.title);
    const index = section.charts.findIndex((other) => compareRanks(keyRank(other.title), rank) > 0);
    const next = index < 0 ? null : section.charts[index];
    section.charts.splice(index < 0 ? section.charts.length : index, 0, chart);
    section.grid.insertBefore(chart.element, next ? next.element : null);
  }

  // Redraws are batched into the next animation frame: a snapshot touches each chart many times.
  _redraw(chart) {
    this.redrawQueue.add(chart);
    if (this.redrawQueue.size === 1) requestAnimationFrame(() => this._flush());
  }

  _flush() {
    const charts = [...this.redrawQueue];
    this.redrawQueue.clear();
    for (const chart of charts) {
      if (!chart.visible) {
        chart.stale = true; // drawn when it scrolls into view
        continue;
      }
      Plotly.react(chart.element, this._traces(chart), this._layout(chart), { displaylogo: false, responsive: true,
        modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"] });
      chart.drawn = true;
      chart.stale = false;
    }
  }

  // Two traces a series: the raw points, faint (hidden without smoothing), and the smoothed line.
  _traces(chart) {
    const traces = [];
    for (const series of chart.series.values()) {
      const color = this.colors.get(series.name);
      const mode = series.steps.length < 2 ? "markers" : "lines";
      const common = { mode, name: plotlyText(series.name), showlegend: false, marker: { color },
        x: chartX(chart, series.steps) };
      traces.push({ ...common, y: series.values.slice(), hoverinfo: "skip", line: { color, width: 1 }, opacity: 0.25,
        visible: this.smoothing > 0 });
      traces.push({ ...common, y: series.smoothed.slice(), line: { color, width: 2 } });
    }
    return traces;
  }

  _layout(chart) {
    return {
      title: { text: plotlyText(chart.title), x: 0.02, xanchor: "left", font: { size: 13 } },
      margin: { l: 56, r: 14, t: 32, b: 30 },
      height: 238,
      hovermode: "x unified",
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, sans-serif", size: 11, color: "#1d2330" },
      xaxis: { gridcolor: "#eef0f4", zeroline: false, ...(chart.time ? { type: "date" } : {}) },
      yaxis: { gridcolor: "#eef0f4", zeroline: false, tickformat: "~g", hoverformat: ".4~g", type: this.logScale ? "log" : "linear" },
      uirevision: chart.id, // keep the user's zoom across redraws
    };
  }
}

// Wires a toolbar (_chart_toolbar.html) to a board.
function bindChartControls(board, toolbar) {
  const filter = toolbar.querySelector("[data-chart-filter]");
  const smoothing = toolbar.querySelector("[data-chart-smoothing]");
  const log = toolbar.querySelector("[data-chart-log]");
  const output = smoothing.parentElement.querySelector("output");
  filter.addEventListener("input", () => board.setFilter(filter.value));
  smoothing.addEventListener("input", () => { output.textContent = Number(smoothing.value).toFixed(2); });
  smoothing.addEventListener("change", () => board.setSmoothing(Number(smoothing.value)));
  log.addEventListener("change", () => board.setLogScale(log.checked));
  board.smoothing = Number(smoothing.value);
  board.logScale = log.checked;
}
