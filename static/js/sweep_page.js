// The sweep page's parallel-coordinates chart, drawn with plotly's scatter (the basic bundle has
// no parcoords): an axis per swept key and one for the result, each scaled to 0..1 (a key whose
// values span 100x or more on a log scale), and a line per run coloured by its result.
"use strict";
(function () {
  let data = JSON.parse(document.getElementById("sweep-data").textContent);
  const element = document.getElementById("sweep-chart");
  const COLORS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]; // viridis, low to high
  // A numeric axis with at most this many distinct values (a grid's) gets a tick at each; one with
  // more (a random search's, a result) at its ends. With ticks at the ends only, a grid's middle
  // value (lr 0.001 between 0.0005 and 0.002) had no label.
  const TICK_EACH = 8;

  function scaleOf(values) {
    const present = values.filter((v) => v !== null && v !== undefined);
    if (present.length && present.every((v) => typeof v === "number")) {
      const low = Math.min(...present), high = Math.max(...present);
      const log = low > 0 && high / low >= 100;
      const at = (v) => (log ? Math.log(v) : v);
      const span = at(high) - at(low);
      const position = (v) => (v === null || v === undefined ? null : span ? (at(v) - at(low)) / span : 0.5);
      const distinct = [...new Set(present)].sort((a, b) => a - b);
      const ticked = distinct.length <= TICK_EACH ? distinct : [low, high];
      return { position, ticks: ticked.map((v) => [position(v), v]), log: log };
    }
    const names = [...new Set(present.map((v) => JSON.stringify(v)))].sort();
    const step = names.length > 1 ? 1 / (names.length - 1) : 0;
    const offset = names.length > 1 ? 0 : 0.5;
    return { position: (v) => (v === null || v === undefined ? null : offset + names.indexOf(JSON.stringify(v)) * step),
      ticks: names.map((name, i) => [offset + i * step, JSON.parse(name)]), log: false };
  }

  function color(fraction) {
    if (fraction === null) return "#9aa0a6";
    const scaled = fraction * (COLORS.length - 1), i = Math.min(Math.floor(scaled), COLORS.length - 2);
    const mix = (a, b, t) => Math.round(a + (b - a) * t);
    const [from, to] = [COLORS[i], COLORS[i + 1]].map((c) => [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16)));
    return "rgb(" + from.map((v, k) => mix(v, to[k], scaled - i)).join(",") + ")";
  }

  // Plotly reads a few HTML tags in its text: run names, keys and values are plain text (a run name
  // isolated too: bidi.js).
  function plain(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function short(value) {
    if (typeof value !== "number") return String(value);
    return Math.abs(value) >= 1000 || (value !== 0 && Math.abs(value) < 0.01) ? value.toExponential(1) : String(+value.toPrecision(3));
  }

  function draw() {
    if (!data.runs.length) {
      element.innerHTML = '<p class="charts-empty">No runs.</p>';
      return;
    }
    const scales = data.axes.map((_, i) => scaleOf(data.runs.map((run) => run.values[i])));
    const result = scales[scales.length - 1];
    const traces = data.runs.map((run) => ({
      x: data.axes.map((_, i) => i), y: run.values.map((v, i) => scales[i].position(v)),
      mode: "lines+markers", line: { color: color(result.position(run.values[run.values.length - 1])), width: 2 },
      marker: { size: 6 }, name: plain(isolate(run.name)), customdata: data.axes.map(() => run.url),
      hovertemplate: plain(isolate(run.name)) + "<br>" + data.axes.map((axis, i) => plain(axis + ": " + short(run.values[i] ?? "—"))).join("<br>")
        + "<extra></extra>",
      connectgaps: false,
    }));
    // Axis names above the plot, in paper coordinates: at y 1.12 in data coordinates they lay
    // outside the axis range, and Plotly did not draw them. Tick labels left of their axis, on a
    // white ground: the runs' lines run through there and drew over them.
    const annotations = [];
    data.axes.forEach((axis, i) => {
      annotations.push({ x: i, y: 1, yref: "paper", yanchor: "bottom", yshift: 8, showarrow: false, xanchor: "center",
        text: "<b>" + plain(axis) + "</b>" + (scales[i].log ? " (log)" : ""), font: { size: 12, color: "#1d2330" } });
      scales[i].ticks.forEach(([y, value]) => annotations.push({ x: i, y: y, text: plain(short(value)), showarrow: false,
        xanchor: "right", xshift: -7, font: { size: 11, color: "#5f6368" }, bgcolor: "rgba(255,255,255,0.9)", borderpad: 1 }));
    });
    if (!element.data) element.replaceChildren(); // the "Loading" line
    const shapes = data.axes.map((_, i) => ({ type: "line", x0: i, x1: i, y0: 0, y1: 1, line: { color: "#bdc1c6", width: 1 } }));
    const drawn = Boolean(element.data);
    Plotly.react(element, traces, {
      showlegend: false, height: 380, margin: { l: 70, r: 40, t: 40, b: 20 }, hovermode: "closest",
      xaxis: { visible: false, range: [-0.4, data.axes.length - 0.6] }, yaxis: { visible: false, range: [-0.05, 1.05] },
      annotations: annotations, shapes: shapes,
    }, { displaylogo: false, responsive: true });
    if (!drawn) element.on("plotly_click", (event) => { window.location = event.points[0].customdata; });
  }

  // While a run of the sweep has not ended, the table, the chart and the head's Stop follow them:
  // the page itself is fetched again every REFRESH_MS and its parts swapped in (W&B's sweep page
  // fills as runs finish; this one showed the runs as they stood when it loaded).
  const REFRESH_MS = 5000;
  async function refresh() {
    let fresh;
    try {
      const response = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!response.ok) throw new Error(response.status);
      fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    } catch (error) {
      setTimeout(refresh, 3 * REFRESH_MS); // offline, or the server restarting: try again later
      return;
    }
    const runs = fresh.getElementById("sweep-runs"); // moved into this page below
    document.getElementById("sweep-runs").replaceWith(runs);
    document.getElementById("sweep-state").replaceWith(fresh.getElementById("sweep-state"));
    const stop = document.getElementById("sweep-stop");
    if (stop && !stop.querySelector(".confirm-pop")) stop.replaceWith(fresh.getElementById("sweep-stop") || "");
    data = JSON.parse(fresh.getElementById("sweep-data").textContent);
    if (window.Plotly) draw();
    if (runs.dataset.live) setTimeout(refresh, REFRESH_MS);
  }

  if (window.Plotly) draw();
  else document.addEventListener("DOMContentLoaded", draw, { once: true });
  if (document.getElementById("sweep-runs").dataset.live) setTimeout(refresh, REFRESH_MS);
})();
