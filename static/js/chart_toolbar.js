// The metric charts' toolbar (_chart_toolbar.html): its filter, smoothing, log scale and x axis
// set a ChartBoard (charts.js, loaded first) and stay in the page's URL and in the forms that reload
// or save the page.
"use strict";

// Wires a toolbar (_chart_toolbar.html) to a board. It starts from what the page was given (a
// link's ?filter=, ?smoothing=, ?log=1, ?x=, or a saved report's) and keeps each change in the
// page's URL and in the fields of the forms that reload the page or save it (keepChartView): a
// typed filter was lost by Save report, and by the Samples panel's Show.
function bindChartControls(board, toolbar) {
  const filter = toolbar.querySelector("[data-chart-filter]");
  const smoothing = toolbar.querySelector("[data-chart-smoothing]");
  const log = toolbar.querySelector("[data-chart-log]");
  const x = toolbar.querySelector("[data-chart-x]");
  bindXAxisControl(board, x);
  const output = smoothing.parentElement.querySelector("output");
  const byDefault = Number(smoothing.dataset.default); // views.CHART_SMOOTHING, which a link leaves out
  const keep = () => keepChartView({ filter: filter.value.trim(), smoothing: Number(smoothing.value) === byDefault ? ""
    : String(Number(smoothing.value)), log: log.checked ? "1" : "", x: x.value });
  filter.addEventListener("input", () => { board.setFilter(filter.value); keep(); });
  smoothing.addEventListener("input", () => { output.textContent = Number(smoothing.value).toFixed(2); });
  smoothing.addEventListener("change", () => { board.setSmoothing(Number(smoothing.value)); keep(); });
  log.addEventListener("change", () => { board.setLogScale(log.checked); keep(); });
  x.addEventListener("change", keep);
  board.smoothing = Number(smoothing.value);
  board.logScale = log.checked;
  if (filter.value) board.setFilter(filter.value);
}

// The toolbar's settings ({filter, smoothing, log, x}: "" for the default) into the URL
// (history.replaceState: a copied link opens the charts so) and into every form field marked
// data-chart-view (the Samples panel's, the run picker's, Save report's); an empty one is not sent.
function keepChartView(values) {
  const params = new URLSearchParams(location.search);
  for (const [name, value] of Object.entries(values)) {
    if (value) params.set(name, value);
    else params.delete(name);
    document.querySelectorAll(`input[data-chart-view="${name}"]`).forEach((input) => {
      input.value = value;
      input.disabled = !value;
    });
  }
  const query = params.toString();
  history.replaceState(history.state, "", location.pathname + (query ? "?" + query : "") + location.hash);
}
