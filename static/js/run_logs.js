// The run page's Logs panel: what the run's workers logged while serving it (apps/runs/logs.py),
// errors and warnings first, then the newest lines, fetched from the page's logs URL: again every
// REFRESH_MS while the run is active, on a click of Refresh or a change of the level, and when the
// run's status changes (run_page.js).
"use strict";
(function () {
  const panel = document.getElementById("run-logs");
  if (!panel) return;
  const REFRESH_MS = 5000;
  const list = panel.querySelector("[data-log-lines]");
  const empty = panel.querySelector("[data-log-empty]");
  const summary = panel.querySelector("[data-log-summary]");
  const level = panel.querySelector("[data-log-level]");
  let timer = null;
  const opened = new Set(); // tracebacks the reader unfolded stay open across refreshes

  function clock(seconds) {
    const at = new Date(seconds * 1000);
    const day = at.toDateString() === new Date().toDateString() ? "" : at.toLocaleDateString() + " ";
    return day + at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function span(className, text) {
    const element = document.createElement("span");
    element.className = className;
    element.textContent = text;
    return element;
  }

  function row(line) {
    const element = document.createElement("div");
    element.className = "log-line " + line.level.toLowerCase();
    element.dataset.level = line.level;
    element.append(span("log-time", clock(line.time)), span("log-level", line.level),
      span("log-duty", line.duty), span("log-message", line.message));
    element.title = `${line.logger} · thread ${line.thread}`;
    if (line.traceback) {
      const key = line.time + line.message;
      const folded = document.createElement("details");
      folded.className = "log-traceback";
      folded.open = opened.has(key);
      folded.addEventListener("toggle", () => (folded.open ? opened.add(key) : opened.delete(key)));
      const label = document.createElement("summary");
      label.textContent = "traceback";
      const text = document.createElement("pre");
      text.textContent = line.traceback;
      folded.append(label, text);
      element.append(folded);
    }
    return element;
  }

  function heading(text) {
    const element = document.createElement("div");
    element.className = "log-heading";
    element.textContent = text;
    return element;
  }

  function draw(data) {
    const problems = data.lines.filter((line) => line.level === "ERROR" || line.level === "CRITICAL" || line.level === "WARNING");
    const rest = data.lines.slice(problems.length);
    const rows = [];
    if (problems.length && rest.length) rows.push(heading("Errors and warnings"));
    rows.push(...problems.map(row));
    if (problems.length && rest.length) rows.push(heading("Newest lines"));
    rows.push(...rest.map(row));
    list.replaceChildren(...rows);
    const counts = data.counts;
    summary.textContent = data.lines.length
      ? `${counts.ERROR || 0} error${counts.ERROR === 1 ? "" : "s"} · ${counts.WARNING || 0} warning${counts.WARNING === 1 ? "" : "s"}`
        + (data.matching > data.shown ? ` · the ${data.shown} first of ${data.matching} lines` : "")
        + (data.duties.length ? " · " + data.duties.join(", ") : "")
      : "";
    empty.hidden = data.lines.length > 0;
    const logged = Object.values(counts).reduce((sum, n) => sum + n, 0);
    empty.textContent = logged
      ? `No lines at this level: the run's workers logged ${logged} line${logged === 1 ? "" : "s"} below it.`
      : data.active
        ? "No log lines yet: they appear as the run's workers serve it."
        : "No log lines: this run's workers logged none while serving it.";
  }

  function load() {
    clearTimeout(timer);
    const url = panel.dataset.url + "?level=" + encodeURIComponent(level.value);
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((data) => {
        draw(data);
        clearTimeout(timer); // one timer however many loads were in flight (a click during a poll)
        if (data.active) timer = setTimeout(load, REFRESH_MS);
      })
      .catch(() => { clearTimeout(timer); timer = setTimeout(load, 2 * REFRESH_MS); }); // the server restarting
  }

  level.addEventListener("change", load);
  panel.querySelector("[data-log-refresh]").addEventListener("click", load);
  window.rftRunLogs = { load }; // for browser tests and the console
  load();
})();
