// The x axis of the metric charts (charts.js): the step, the wall time or the time since the run's
// first point (each point's recorded time). The user's choice is made in the chart toolbar
// (_chart_toolbar.html) and remembered in this browser, on every page; a link may name one (?x=).
// System metrics are numbered by Unix time: their charts are always on a time axis.
"use strict";

const X_AXIS_KEY = "rftweb.chartXAxis"; // step, wall or relative: the user's choice, on every page
const X_MODES = ["step", "wall", "relative"];
const X_TITLES = { eval: "explorer step", explorer: "explorer step", trainer: "trainer step", system: "time" };
// Relative time is shown in the largest unit of which the run has lasted at least two: [seconds, name].
const TIME_UNITS = [[3600, "h"], [60, "min"], [1, "s"]];

function loadXMode() {
  try {
    const mode = localStorage.getItem(X_AXIS_KEY);
    return X_MODES.includes(mode) ? mode : "step";
  } catch {
    return "step";
  }
}

// A board's x axis. charts: the board's chart id -> chart map (ChartBoard.charts), read for the
// default origin of relative time.
// stepTitles: {role: its step axis's title} where a page's steps are not X_TITLES' (a bench run's
// eval points are numbered by the model version they scored).
class ChartXAxis {
  constructor(charts, stepTitles = {}) {
    this.charts = charts;
    this.stepTitles = stepTitles;
    this.mode = "step"; // the toolbar sets the user's (bindXAxisControl)
    this.origins = new Map(); // series name -> Unix seconds its relative time counts from (setOrigin)
  }

  setMode(mode) {
    this.mode = X_MODES.includes(mode) ? mode : "step";
  }

  // Where the relative time of a series counts from: its run's first point (the compare page
  // sets one per run). Without one, the first point recorded of any series on the board (the
  // run page's one run).
  setOrigin(seriesName, seconds) {
    this.origins.set(seriesName, seconds);
  }

  origin(seriesName) {
    if (this.origins.has(seriesName)) return this.origins.get(seriesName);
    let origin = Infinity;
    for (const chart of this.charts.values()) {
      for (const series of chart.series.values()) {
        const first = series.times.find((time) => time !== null);
        if (first !== undefined && first < origin) origin = first;
      }
    }
    return origin;
  }

  // When each point was recorded. System metrics are numbered by Unix time: their steps are it.
  times(chart, series) {
    return chart.time ? series.steps : series.times;
  }

  // What a chart's steps are where the page says (stepTitles), else undefined.
  stepTitle(chart) {
    return this.stepTitles[chart.role];
  }

  // The axis a chart is drawn on: system charts are always on a time axis (wall time for "step").
  chartMode(chart) {
    return chart.time && this.mode === "step" ? "wall" : this.mode;
  }

  // x of a series' points from `start` on, for the axis of a look (look's x).
  x(chart, series, axis, start = 0) {
    if (axis.mode === "step") return series.steps.slice(start);
    const times = this.times(chart, series).slice(start);
    if (axis.mode === "wall") return times.map((time) => (time === null ? null : new Date(time * 1000)));
    const origin = this.origin(series.name);
    return times.map((time) => (time === null ? null : (time - origin) / axis.seconds));
  }

  // The x axis: its mode and, for relative time, its unit (the largest the longest series reaches twice).
  look(chart) {
    const mode = this.chartMode(chart);
    if (mode !== "relative") return { mode };
    let span = 0;
    for (const series of chart.series.values()) {
      const times = this.times(chart, series);
      let last = times.length - 1;
      while (last >= 0 && times[last] === null) last--;
      if (last >= 0) span = Math.max(span, times[last] - this.origin(series.name));
    }
    const [seconds, unit] = TIME_UNITS.find(([each]) => span >= 2 * each) || TIME_UNITS[TIME_UNITS.length - 1];
    return { mode, seconds, unit };
  }

  // Plotly's x axis for a chart's look (ChartBoard._look): its title (text), type and tick format.
  // A short step range (look.steps) gets a tick at each step.
  layout(chart, look) {
    const steps = look.steps ? { tickmode: "linear", tick0: 0, dtick: 1, range: look.steps, autorange: false } : {};
    return {
      step: { title: this.stepTitle(chart) || X_TITLES[chart.role] || "step", type: "linear", tickformat: "d", hoverformat: "d", rangemode: "nonnegative",
        ...steps },
      wall: { title: "time", type: "date" },
      relative: { title: `time since start (${look.x.unit})`, type: "linear", tickformat: "~g", hoverformat: ".2f",
        rangemode: "nonnegative" },
    }[look.x.mode];
  }
}

// Wires the toolbar's x axis select to a board: the link's choice (data-linked, from ?x=), else
// the user's remembered one.
function bindXAxisControl(board, select) {
  board.xAxis.setMode(select.dataset.linked || loadXMode());
  select.value = board.xAxis.mode;
  select.addEventListener("change", () => {
    board.setXMode(select.value);
    try {
      localStorage.setItem(X_AXIS_KEY, select.value);
    } catch { /* storage full or disabled: the choice lasts for this page */ }
  });
}
