// One worker's page: the JSON of /api/workers/<name>/ (apps/runs/worker_detail.py) drawn as tables,
// first from the copy in the page, then every 5 s from the API, as the Workers page polls its own.
"use strict";

(function () {
  const script = document.currentScript;
  const {el, ago, dutyActions, drawAndPoll} = WorkerTables;

  function duration(s) {
    return s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
  }

  function clock(iso) {
    return iso ? new Date(iso).toLocaleString([], {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
      second: "2-digit"}) : "—";
  }

  function runLink(one) {
    const text = "run " + one.run_id + " " + one.run_name;
    return one.run_url ? el("a", text, {href: one.run_url}) : el("span", text, {class: "muted"});
  }

  function fact(label, value) {
    const tr = el("tr");
    tr.append(el("th", label), el("td", value));
    return tr;
  }

  function drawFacts(data) {
    const w = data.worker;
    const machine = [w.cpus ? w.cpus + " cores" : null, w.memory_gb ? w.memory_gb + " GB" : null,
      w.gpus.length ? w.gpus.map((g) => g.name + " (" + g.used_gb + " / " + g.memory_gb + " GB)").join(", ") : "no GPU"]
      .filter(Boolean).join(" · ");
    const usage = w.usage && w.usage.rss_gb !== undefined
      ? w.usage.rss_gb + " GB" + (w.usage.cpu_percent === null ? "" : " · " + w.usage.cpu_percent + "% CPU") : "—";
    const slots = w.slots === null ? "no limit (embedded: threads of the server)"
      : w.holds.length + " / " + w.slots + " busy";
    const beat = data.heartbeat_age_s === null ? "— (embedded)"
      : duration(data.heartbeat_age_s) + " ago (lost after " + duration(data.heartbeat_timeout_s) + " of silence)";
    document.querySelector("[data-worker-facts]").replaceChildren(
      fact("Host", (w.host || "—") + (w.pid ? " · pid " + w.pid : "")),
      fact("Queues", w.queues.join(", ") || "—"),
      fact("Slots", slots),
      fact("Machine", machine),
      fact("Using", usage),
      fact("Code", w.version || "—"),
      fact("Started", clock(w.started_at)),
      fact(w.state === "stopped" ? "Stopped" : "Last heartbeat", w.state === "stopped" ? clock(w.stopped_at) : beat));
    const drained = w.state === "live" && Object.keys(w.drain).length > 0;
    const state = document.querySelector("[data-worker-state]");
    state.textContent = drained ? "draining" : w.state;
    state.className = "status " + (drained ? "paused" : w.state === "live" ? "running" : w.state === "lost" ? "failed" : "stopped");
    const said = document.querySelector("[data-worker-draining]");
    said.hidden = !drained;
    said.textContent = drained ? "Drained by " + w.drain.by + " " + ago(w.drain.at) + ": it finishes what it holds " +
      "and takes no new duty; its queues' tasks wait for the other workers." : "";
    // A curator's Drain or Undrain (views.worker_drain): offered for a live Celery worker (not embedded).
    const drainable = w.state === "live" && w.slots !== null;
    document.querySelectorAll("[data-drain]").forEach((form) => {
      form.hidden = !drainable || (form.dataset.drain === "drain") === drained;
    });
  }

  function empty(columns, text) {
    const tr = el("tr");
    tr.append(el("td", text, {colspan: columns, class: "muted"}));
    return tr;
  }

  function drawHolds(holds) {
    const rows = holds.map((hold) => {
      const tr = el("tr", null, {"data-hold": hold.run_id + "/" + hold.duty});
      const run = el("td");
      run.append(runLink(hold));
      if (script.dataset.act) run.append(dutyActions(hold, script, window.location.pathname));
      const state = el("td");
      state.append(el("strong", hold.state || "—"), el("div", hold.detail, {class: "muted small"}));
      const step = hold.duty.startsWith("explorer") ? "explorer " + hold.explorer_step
        : "trainer " + hold.trainer_step + (hold.total_steps ? " / " + hold.total_steps : "");
      tr.append(run, el("td", hold.duty), state, el("td", step, {class: "num"}), el("td", ago(hold.since)),
        el("td", ago(hold.last_beat)));
      return tr;
    });
    document.querySelector("[data-worker-holds]").replaceChildren(...(rows.length ? rows : [empty(6, "Idle.")]));
  }

  function drawHistory(history) {
    const rows = history.map((one) => {
      const tr = el("tr", null, {"data-held": one.run_id + "/" + one.duty});
      const run = el("td");
      run.append(runLink(one));
      tr.append(run, el("td", one.duty), el("td", clock(one.started_at)), el("td", one.ended_at ? clock(one.ended_at) : "—"),
        el("td", duration(one.runtime_s), {class: "num"}),
        el("td", one.how, {class: "outcome " + one.how.replace(/ /g, "-"), "data-how": one.how}));
      return tr;
    });
    document.querySelector("[data-worker-history]").replaceChildren(
      ...(rows.length ? rows : [empty(6, "None in the last day.")]));
  }

  function drawLogs(lines) {
    const box = document.querySelector("[data-worker-logs]");
    const shown = lines.map((line) => {
      const row = el("div", null, {class: "log-line " + String(line.level).toLowerCase()});
      row.append(el("span", new Date(line.time * 1000).toLocaleTimeString(), {class: "log-time"}),
        el("span", line.level, {class: "log-level"}), el("span", "run " + line.run_id + " " + line.duty, {class: "log-duty"}),
        el("span", line.message, {class: "log-message"}));
      return row;
    });
    box.replaceChildren(...shown);
    box.scrollTop = box.scrollHeight; // the newest last, in view
    let none = document.querySelector("[data-worker-no-logs]");
    if (!none) {
      none = el("p", "No line logged by its duties in the last day.", {class: "muted", "data-worker-no-logs": ""});
      box.after(none);
    }
    none.hidden = shown.length > 0;
  }

  function drawEarlier(lives) {
    document.querySelector("[data-worker-earlier]").hidden = !lives.length;
    document.querySelector("[data-worker-lives]").replaceChildren(...lives.map((life) => {
      const tr = el("tr");
      tr.append(el("td", (life.host || "—") + (life.pid ? " · pid " + life.pid : "")), el("td", clock(life.started_at)),
        el("td", clock(life.last_seen)), el("td", life.state === "stopped" ? "stopped " + clock(life.stopped_at) : "lost"));
      return tr;
    }));
  }

  function draw(data) {
    if (document.querySelector(".confirm-pop")) return; // a curator is answering a question: keep it
    drawFacts(data);
    drawHolds(data.holds);
    drawHistory(data.history);
    drawLogs(data.logs);
    drawEarlier(data.earlier);
    document.querySelector("[data-worker-updated]").textContent = "updated " + new Date().toLocaleTimeString();
  }

  drawAndPoll(script.dataset.url, "worker-data", draw);
})();
