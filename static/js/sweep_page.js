// The sweep page's parallel-coordinates chart, drawn with plotly's scatter (the basic bundle has
// no parcoords): an axis per swept key and one for the result, each scaled to 0..1 (a key whose
// values span 100x or more on a log scale), and a line per run coloured by its result.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("sweep-data").textContent);
  const element = document.getElementById("sweep-chart");
  const COLORS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]; // viridis, low to high

  function scaleOf(values) {
    const present = values.filter((v) => v !== null && v !== undefined);
    if (present.length && present.every((v) => typeof v === "number")) {
      const low = Math.min(...present), high = Math.max(...present);
      const log = low > 0 && high / low >= 100;
      const at = (v) => (log ? Math.log(v) : v);
      const span = at(high) - at(low);
      return { position: (v) => (v === null || v === undefined ? null : span ? (at(v) - at(low)) / span : 0.5),
        ticks: low === high ? [[0.5, low]] : [[0, low], [1, high]], log: log };
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
      marker: { size: 6 }, name: run.name, customdata: data.axes.map(() => run.url),
      hovertemplate: run.name + "<br>" + data.axes.map((axis, i) => axis + ": " + short(run.values[i] ?? "—")).join("<br>") + "<extra></extra>",
      connectgaps: false,
    }));
    const annotations = [];
    data.axes.forEach((axis, i) => {
      annotations.push({ x: i, y: 1.12, text: "<b>" + axis + "</b>" + (scales[i].log ? " (log)" : ""), showarrow: false, xanchor: "center" });
      scales[i].ticks.forEach(([y, value]) => annotations.push({ x: i, y: y, text: short(value), showarrow: false, xanchor: "right", xshift: -6, font: { size: 11, color: "#5f6368" } }));
    });
    element.replaceChildren(); // the "Loading" line
    const shapes = data.axes.map((_, i) => ({ type: "line", x0: i, x1: i, y0: 0, y1: 1, line: { color: "#bdc1c6", width: 1 } }));
    Plotly.newPlot(element, traces, {
      showlegend: false, height: 360, margin: { l: 70, r: 40, t: 50, b: 20 }, hovermode: "closest",
      xaxis: { visible: false, range: [-0.4, data.axes.length - 0.6] }, yaxis: { visible: false, range: [-0.05, 1.05] },
      annotations: annotations, shapes: shapes,
    }, { displaylogo: false, responsive: true });
    element.on("plotly_click", (event) => { window.location = event.points[0].customdata; });
  }

  if (window.Plotly) draw();
  else document.addEventListener("DOMContentLoaded", draw, { once: true });
})();
