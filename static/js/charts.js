// Metric charts as small multiples: one Plotly chart per metric key, in collapsible sections by
// role and key prefix ("trainer · loss" for trainer "loss/policy"), with an "overview" section of
// the charts a page pins first. Noisy series are drawn faintly under an exponential moving
// average; eval series, counters, settings and short series are drawn as they are. Live points
// are appended with Plotly.extendTraces; a chart is redrawn only when it is new, a step was
// rewritten or its look changes (smoothed or not, a flat series, a short step range). The x axis
// (step, wall time or relative time) is chart_axes.js's, which the pages load first; the toolbar
// that sets the filter, smoothing, log scale and axis is chart_toolbar.js's, loaded after this.
"use strict";

const CHART_PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#1098ad", "#7048e8", "#f08c00", "#495057"];
// After the palette's 8 colours the lines come again dashed, dotted...: a sweep compares up to 32
// runs, and the 9th run's line was the 1st's. Plotly's dash names, with their SVG dash arrays (legends).
const CHART_DASHES = [["solid", ""], ["dash", "6 3"], ["dot", "2 2"], ["dashdot", "6 2 2 2"]];
const ROLE_ORDER = ["eval", "explorer", "trainer", "system"];
const OVERVIEW = "overview";
// After the page's own (held-out score, train reward): what a policy-gradient run is watched by.
const OVERVIEW_CHARTS = [["trainer/loss"], ["trainer/kl", "trainer/approx_kl"], ["trainer/entropy"], ["explorer/response_length"]];
// Metric names are still settling: match loosely, so the charts people look at first come first.
const KEY_PRIORITY = [/reward|accuracy|acc\b/, /loss/, /kl/, /entropy/, /clip/, /grad/, /length|tokens/, /stale|version/];
// Eval steps are few and each one counts; a moving average over them would show values that never
// were (0.045 for a step at 0.1). Series this short are not smoothed either.
const MIN_SMOOTHED_POINTS = 20;
// Counters and settings are exact: smoothing only blurs a step change. (Integer-valued series are
// counters too, whatever their name.)
const EXACT_KEY = /(^|\/)(lr|learning_rate|model_version|step|staleness\w*)$/;
const MARKER_POINTS = 60; // an unsmoothed series shorter than this shows each point as a dot
const Y_UNITS = [
  [/(^|\/)staleness_share\//, "share of the batch"], [/(^|\/)idle_share$/, "share of the time"],
  [/tokens_per_s$/, "tokens/s"], [/(^|\/)seconds$/, "seconds"], [/_gb$/, "GiB"], [/_percent$/, "%"],
  [/(^|\/)response_length$/, "tokens"], [/(^|\/)(lr|learning_rate)$/, "learning rate"], [/_frac$/, "fraction"],
  [/(^|\/)staleness/, "model versions"],
];
const SECTIONS_KEY = "rftweb.chartSections"; // which sections a user keeps open, on every page

// plotly.js is the pages' last deferred script (they fetch their data meanwhile): it has run by
// DOMContentLoaded.
const plotlyReady = new Promise((resolve) => {
  if (window.Plotly) resolve();
  else document.addEventListener("DOMContentLoaded", resolve, { once: true });
});

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
  if (section === OVERVIEW) return [-1];
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

function yTitle(key) {
  const unit = Y_UNITS.find(([pattern]) => pattern.test(key));
  return unit ? unit[1] : key.slice(key.lastIndexOf("/") + 1).replace(/_/g, " ");
}

// A flat series gets an axis around its value: autorange would zoom into float noise, or draw a
// single tick.
function flatRange(value, log) {
  if (log) return value > 0 ? [Math.log10(value) - 1, Math.log10(value) + 1] : null;
  // At 0 (a count, a rate, an accuracy not yet above it) the axis rises from just below it.
  return value === 0 ? [-0.05, 1] : [value - Math.abs(value) / 2, value + Math.abs(value) / 2];
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
  // pinned: groups of chart ids ("role/key"); the first chart of each group that exists goes to
  // the overview section, in group order, followed by OVERVIEW_CHARTS. legends: false where the
  // page names the lines itself (compare: long run names in each chart's title row hid its title).
  constructor(container, { smoothing = 0, logScale = false, pinned = [], legends = true, stepTitles = {} } = {}) {
    this.container = container;
    this.legends = legends;
    this.smoothing = smoothing;
    this.logScale = logScale;
    this.pinned = [...pinned, ...OVERVIEW_CHARTS];
    this.filter = "";
    this.charts = new Map(); // chart id -> {id, role, title, home, section, element, series: Map, drawn, look}
    this.xAxis = new ChartXAxis(this.charts, stepTitles); // the toolbar sets the user's choice (bindChartControls)
    this.sections = new Map(); // section title -> {element, grid, count, rank, charts}
    this.styles = new Map(); // series name -> {color, dash, dashArray}, the same in every chart (style)
    this.hidden = new Set(); // series names whose lines the user hid, in every chart (setHidden)
    this.redrawQueue = new Set();
    this.openSections = this._loadOpenSections();
    // Plotly takes tens of ms a chart whatever its length: only charts in open sections near the
    // viewport are drawn; the others as they come into view.
    this.observer = new IntersectionObserver((entries) => this._onVisibility(entries), { rootMargin: "200px" });
  }

  _onVisibility(entries) {
    for (const entry of entries) {
      const chart = entry.target.chart;
      chart.visible = entry.isIntersecting;
      if (chart.visible && chart.stale) this._redraw(chart);
    }
  }

  // One series' points, or undefined.
  series(chartId, seriesName) {
    return this.charts.get(chartId)?.series.get(seriesName);
  }

  // Replace a series' points (a snapshot, or one run's metrics on the compare page). `times`:
  // when each point was recorded, in Unix seconds (null where unknown).
  setSeries(chartId, section, title, seriesName, steps, values, times = []) {
    const series = this._series(chartId, section, title, seriesName);
    series.steps = steps.slice();
    series.values = values.slice();
    series.times = steps.map((_, i) => times[i] ?? null);
    this._resmooth(series);
    this._redraw(this.charts.get(chartId));
  }

  // Add points after the series' last step; a step at or before it rewrites the series instead
  // (a replayed step), which is rare enough to redraw for.
  appendPoints(chartId, section, title, seriesName, steps, values, times = []) {
    const series = this._series(chartId, section, title, seriesName);
    const chart = this.charts.get(chartId);
    const last = series.steps.length ? series.steps[series.steps.length - 1] : -Infinity;
    if (!steps.every((step, i) => step > (i ? steps[i - 1] : last))) {
      const byStep = new Map(series.steps.map((step, i) => [step, [series.values[i], series.times[i]]]));
      steps.forEach((step, i) => byStep.set(step, [values[i], times[i] ?? null]));
      const points = [...byStep.entries()].sort((a, b) => a[0] - b[0]);
      this.setSeries(chartId, section, title, seriesName, points.map((p) => p[0]), points.map((p) => p[1][0]),
        points.map((p) => p[1][1]));
      return;
    }
    const smoothed = values.map((value) => series.ema.next(value));
    const start = series.steps.length;
    series.steps.push(...steps);
    series.values.push(...values);
    series.times.push(...steps.map((_, i) => times[i] ?? null));
    series.smoothed.push(...smoothed);
    const drawnLook = chart.look;
    if (!chart.drawn || !chart.visible || this.redrawQueue.has(chart) || JSON.stringify(this._look(chart)) !== drawnLook) {
      this._redraw(chart);
      return;
    }
    const index = 2 * [...chart.series.keys()].indexOf(seriesName);
    const x = this.xAxis.x(chart, series, JSON.parse(drawnLook).x, start);
    Plotly.extendTraces(chart.element, { x: [x, x], y: [values, smoothed], customdata: [steps, steps] }, [index, index + 1]);
  }

  // A series' colour and dash, given in the order series first appear (the compare page names its
  // runs first, in the order picked).
  style(seriesName) {
    if (!this.styles.has(seriesName)) {
      const index = this.styles.size, colors = CHART_PALETTE.length;
      const [dash, dashArray] = CHART_DASHES[Math.floor(index / colors) % CHART_DASHES.length];
      this.styles.set(seriesName, { color: CHART_PALETTE[index % colors], dash, dashArray });
    }
    return this.styles.get(seriesName);
  }

  // Hide or show a series' lines in every chart (the compare page's legend).
  setHidden(seriesName, hidden) {
    if (hidden) this.hidden.add(seriesName);
    else this.hidden.delete(seriesName);
    this.charts.forEach((chart) => { if (chart.series.has(seriesName)) this._redraw(chart); });
  }

  // Step, wall time or relative time: every chart is drawn again on the new axis.
  setXMode(mode) {
    this.xAxis.setMode(mode);
    this.charts.forEach((chart) => this._redraw(chart));
  }

  // Where the relative time of a series counts from (ChartXAxis.setOrigin).
  setOrigin(seriesName, seconds) {
    this.xAxis.setOrigin(seriesName, seconds);
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
    this.charts.forEach((chart) => this._redraw(chart));
  }

  // Show the charts whose id contains the text; a section with a match opens while filtering.
  setFilter(text) {
    this.filter = text.trim().toLowerCase();
    this.sections.forEach((section, name) => {
      this._showMatching(section);
      this._setOpen(section, this.filter && !section.element.hidden ? true : this._isOpen(name));
    });
  }

  _showMatching(section) {
    for (const chart of section.charts) {
      const hidden = Boolean(this.filter) && !chart.id.toLowerCase().includes(this.filter);
      if (chart.element.hidden && !hidden && chart.drawn) requestAnimationFrame(() => Plotly.Plots.resize(chart.element));
      chart.element.hidden = hidden;
    }
    section.element.hidden = section.charts.every((chart) => chart.element.hidden);
    section.count.textContent = section.charts.length + (section.charts.length === 1 ? " chart" : " charts");
  }

  _loadOpenSections() {
    try {
      return JSON.parse(localStorage.getItem(SECTIONS_KEY)) || {};
    } catch {
      return {};
    }
  }

  _isOpen(name) {
    return name in this.openSections ? this.openSections[name] : name === OVERVIEW;
  }

  _setOpen(section, open) {
    if (section.element.open !== open) section.element.open = open;
  }

  // Remembers what the user opens and closes. The page's own changes (while filtering, or back
  // to the remembered state) are not remembered.
  _onToggle(name, section) {
    if (this.filter || section.element.open === this._isOpen(name)) return;
    this.openSections[name] = section.element.open;
    try {
      localStorage.setItem(SECTIONS_KEY, JSON.stringify(this.openSections));
    } catch { /* storage full or disabled: the choice lasts for this page */ }
  }

  _series(chartId, section, title, seriesName) {
    let chart = this.charts.get(chartId);
    if (!chart) {
      const role = chartId.slice(0, chartId.indexOf("/"));
      chart = { id: chartId, role, title, home: section, section: null, element: document.createElement("div"),
        series: new Map(), drawn: false, visible: false, stale: false, time: role === "system", look: null };
      chart.element.className = "chart";
      chart.element.dataset.chart = chartId;
      chart.element.chart = chart;
      this.charts.set(chartId, chart);
      this._placePinned(chartId);
      this.observer.observe(chart.element);
    }
    let series = chart.series.get(seriesName);
    if (!series) {
      this.style(seriesName);
      series = { name: seriesName, steps: [], values: [], times: [], smoothed: [], ema: new Ema(this.smoothing) };
      chart.series.set(seriesName, series);
    }
    return series;
  }

  // The overview's order for a chart that is the first existing chart of a pin group, else null.
  _overviewRank(chartId) {
    for (let group = 0; group < this.pinned.length; group++) {
      if (this.pinned[group].find((id) => this.charts.has(id)) === chartId) return [group, this.pinned[group].indexOf(chartId)];
    }
    return null;
  }

  // A new chart goes to the overview if it comes first in a pin group; the one it displaces
  // there goes back to its own section.
  _placePinned(chartId) {
    const affected = new Set([chartId, ...this.pinned.filter((ids) => ids.includes(chartId)).flat()]);
    const moves = [...affected].map((id) => this.charts.get(id)).filter(Boolean)
      .map((chart) => [chart, this._overviewRank(chart.id) ? OVERVIEW : chart.home])
      .filter(([chart, section]) => chart.section !== section);
    // Out of the overview first: the overview's order is only defined for the charts it keeps.
    moves.sort(([, a], [, b]) => (a === OVERVIEW) - (b === OVERVIEW));
    moves.forEach(([chart, section]) => this._place(chart, section));
  }

  _chartRank(chart, section) {
    return section === OVERVIEW ? this._overviewRank(chart.id) : keyRank(chart.title);
  }

  // Keep sections, and charts within a section, in rank order as they appear.
  _place(chart, name) {
    this.container.querySelector(".charts-empty")?.remove();
    if (chart.section) {
      const old = this.sections.get(chart.section);
      old.charts.splice(old.charts.indexOf(chart), 1);
      this._showMatching(old);
    }
    chart.section = name;
    const section = this.sections.get(name) || this._newSection(name);
    const rank = this._chartRank(chart, name);
    const index = section.charts.findIndex((other) => compareRanks(this._chartRank(other, name), rank) > 0);
    const next = index < 0 ? null : section.charts[index];
    section.charts.splice(index < 0 ? section.charts.length : index, 0, chart);
    section.grid.insertBefore(chart.element, next ? next.element : null);
    this._showMatching(section);
    if (chart.drawn) this._redraw(chart); // its title names its role in the overview
  }

  _newSection(name) {
    const element = document.createElement("details");
    element.className = "chart-section";
    element.dataset.section = name;
    element.innerHTML = "<summary><h3></h3> <span class=\"count\"></span></summary><div class=\"chart-grid\"></div>";
    element.querySelector("h3").textContent = name;
    const section = { element, grid: element.querySelector(".chart-grid"), count: element.querySelector(".count"),
      rank: sectionRank(name), charts: [] };
    this._setOpen(section, this._isOpen(name) || Boolean(this.filter));
    element.addEventListener("toggle", () => this._onToggle(name, section));
    const next = [...this.sections.values()].filter((other) => compareRanks(other.rank, section.rank) > 0)
      .sort((a, b) => compareRanks(a.rank, b.rank))[0];
    this.container.insertBefore(element, next ? next.element : null);
    this.sections.set(name, section);
    return section;
  }

  _resmooth(series) {
    series.ema = new Ema(this.smoothing);
    series.smoothed = series.values.map((value) => series.ema.next(value));
  }

  // Redraws are batched into the next animation frame: a snapshot touches each chart many times.
  _redraw(chart) {
    this.redrawQueue.add(chart);
    if (this.redrawQueue.size === 1) requestAnimationFrame(() => this._flush());
  }

  // Draws the visible charts top first, a few per frame, so the first ones show before the rest
  // are drawn; the others are drawn when they come into view.
  _flush() {
    if (!window.Plotly) {
      plotlyReady.then(() => requestAnimationFrame(() => this._flush()));
      return;
    }
    const started = performance.now();
    const queued = [...this.redrawQueue];
    for (const chart of queued.filter((chart) => !chart.visible)) {
      chart.stale = true;
      this.redrawQueue.delete(chart);
    }
    const visible = queued.filter((chart) => chart.visible)
      .map((chart) => [chart.element.getBoundingClientRect().top, chart]).sort((a, b) => a[0] - b[0]);
    for (const [, chart] of visible) {
      if (performance.now() - started > 30) break;
      this.redrawQueue.delete(chart);
      const look = this._look(chart);
      Plotly.react(chart.element, this._traces(chart, look), this._layout(chart, look), { displaylogo: false, responsive: true,
        modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"] });
      chart.look = JSON.stringify(look);
      chart.drawn = true;
      chart.stale = false;
    }
    if (this.redrawQueue.size) requestAnimationFrame(() => this._flush());
  }

  // How a chart is drawn, from its points: smoothed or not, a fixed y range for a flat series,
  // a tick per step for a short step range, dots for a short unsmoothed series. A point that
  // changes it redraws the chart.
  _look(chart) {
    let min = Infinity, max = -Infinity, points = 0, integers = true, first = Infinity, last = -Infinity;
    for (const series of chart.series.values()) {
      if (this.hidden.has(series.name)) continue; // the shown lines decide the axes
      points = Math.max(points, series.values.length);
      for (const value of series.values) {
        if (value < min) min = value;
        if (value > max) max = value;
        if (integers && !Number.isInteger(value)) integers = false;
      }
      if (series.steps.length) {
        first = Math.min(first, series.steps[0]);
        last = Math.max(last, series.steps[series.steps.length - 1]);
      }
    }
    const smooth = this.smoothing > 0 && chart.role !== "eval" && points >= MIN_SMOOTHED_POINTS && !integers
      && !EXACT_KEY.test(chart.title);
    const flat = points > 0 && max - min <= 1e-9 * Math.max(Math.abs(min), Math.abs(max));
    const x = this.xAxis.look(chart);
    return {
      smooth,
      range: flat ? flatRange(min, this.logScale) : null,
      x,
      // A few steps: a tick at each, half a step of room either side (so the points clear the axes).
      steps: x.mode === "step" && last - first < 6 ? [first - 0.5, last + 0.5] : null,
      markers: !smooth && points < MARKER_POINTS,
      log: this.logScale,
    };
  }

  // Two traces a series: its values, and their moving average (hidden when not smoothed). The
  // values stay in the hover either way.
  _traces(chart, look) {
    const traces = [];
    // On a time axis the hover still says which step a point is (each trace's customdata).
    const hovertemplate = look.x.mode !== "step" && !chart.time
      ? `%{y:.4~g} · ${this.xAxis.stepTitle(chart) || "step"} %{customdata}` : undefined;
    for (const series of chart.series.values()) {
      const { color, dash } = this.style(series.name);
      const shown = !this.hidden.has(series.name);
      const x = this.xAxis.x(chart, series, look.x);
      const name = plotlyText(series.name);
      const mode = series.steps.length < 2 ? "markers" : look.markers ? "lines+markers" : "lines";
      const customdata = series.steps.slice();
      traces.push({ x, y: series.values.slice(), customdata, hovertemplate, name, mode, showlegend: this.legends && chart.series.size > 1,
        marker: { color, size: 5 }, cliponaxis: false, line: { color, dash, width: look.smooth ? 1 : 2 }, opacity: look.smooth ? 0.3 : 1,
        visible: shown });
      traces.push({ x, y: series.smoothed.slice(), customdata, hovertemplate, name: name + " (smoothed)", mode: "lines",
        showlegend: false, line: { color, dash, width: 2 }, visible: shown && look.smooth });
    }
    return traces;
  }

  _layout(chart, look) {
    const xAxis = this.xAxis.layout(chart, look);
    return {
      title: { text: plotlyText(chart.section === OVERVIEW ? chart.role + " · " + chart.title : chart.title), x: 0.02, xanchor: "left", font: { size: 13 } },
      margin: { l: 62, r: 14, t: 32, b: 40 },
      height: 238,
      hovermode: "x unified",
      hoverlabel: { namelength: -1 },
      // Several lines (explorers, compared runs): named in the title's row, on the right.
      legend: { orientation: "h", x: 1, xanchor: "right", y: 1.02, yanchor: "bottom", font: { size: 10 }, bgcolor: "rgba(0,0,0,0)" },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, sans-serif", size: 11, color: "#1d2330" },
      xaxis: {
        gridcolor: "#eef0f4", zeroline: false, ...xAxis,
        title: { text: xAxis.title, standoff: 4, font: { size: 10, color: "#6b7385" } },
      },
      yaxis: {
        title: { text: plotlyText(yTitle(chart.title)), standoff: 4, font: { size: 10, color: "#6b7385" } },
        gridcolor: "#eef0f4", zeroline: false, tickformat: "~g", hoverformat: ".4~g",
        type: look.log ? "log" : "linear", ...(look.range ? { range: look.range, autorange: false } : { autorange: true }),
      },
      uirevision: chart.id + (look.range ? " flat" : "") + look.x.mode, // keep the user's zoom across redraws
    };
  }
}
