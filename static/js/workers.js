// The Workers page: the JSON of /api/workers/ (apps/runs/capacity.py) drawn as tables, first from
// the copy in the page, then every few seconds from the API (a worker's heartbeat comes every
// RFTWEB_HEARTBEAT_INTERVAL seconds, 10 by default).
"use strict";

(function () {
  const script = document.currentScript;
  const {el, ago, dutyActions, drawAndPoll} = WorkerTables;

  function nameCell(worker) {
    const cell = el("td");
    const name = el("strong");
    name.append(el("a", worker.name, {href: worker.url, "data-worker-link": ""})); // its own page
    cell.append(name);
    if (worker.drain && Object.keys(worker.drain).length) { // capacity.set_drain: finishes what it holds, takes nothing
      cell.append(" ", el("span", "draining", {class: "status paused", "data-draining": "",
        title: "drained by " + worker.drain.by + " " + ago(worker.drain.at)}));
    }
    if (worker.host) cell.append(el("div", worker.host + (worker.pid ? " · pid " + worker.pid : ""), {class: "muted small"}));
    // An earlier life of a worker restarted under the same name (capacity.register keeps it).
    if (worker.restarted_at) cell.append(el("div", "started again " + ago(worker.restarted_at), {class: "muted small"}));
    return cell;
  }

  // What a launch checks a run against (apps/runs/config_checks.fit_issues): cores, memory, GPUs.
  function machineText(worker) {
    const parts = [];
    if (worker.cpus) parts.push(worker.cpus + " core" + (worker.cpus === 1 ? "" : "s"));
    if (worker.memory_gb) parts.push(worker.memory_gb + " GB");
    parts.push(worker.gpus.length
      ? worker.gpus.map((g) => g.name + " (" + g.used_gb + " / " + g.memory_gb + " GB)").join(", ")
      : "no GPU");
    return parts.join(" · ");
  }

  // What its processes use now (Flower's load and memory), under what it may use.
  function machineCell(worker) {
    const cell = el("td", machineText(worker));
    const usage = worker.usage || {};
    if (usage.rss_gb !== undefined) {
      const cpu = usage.cpu_percent === null || usage.cpu_percent === undefined ? "" : " · " + usage.cpu_percent + "% CPU";
      cell.append(el("div", "using " + usage.rss_gb + " GB" + cpu, {class: "muted small", "data-usage": ""}));
    }
    return cell;
  }

  function holdsCell(worker) {
    const cell = el("td");
    if (!worker.holds.length) {
      cell.append(el("span", "idle", {class: "muted"}));
      return cell;
    }
    const list = el("ul", null, {class: "holds"});
    worker.holds.forEach((hold) => {
      const item = el("li");
      const link = el("a", "run " + hold.run_id + " " + hold.run_name, {href: hold.run_url});
      item.append(link, " · ", el("code", hold.duty), " · ");
      item.append(el("span", "since " + ago(hold.since) + ", beat " + ago(hold.last_beat), {class: "muted small"}));
      if (script.dataset.act) item.append(dutyActions(hold, script));
      list.append(item);
    });
    cell.append(list);
    return cell;
  }

  function row(worker, live) {
    const tr = el("tr", null, {"data-worker": worker.name});
    tr.append(nameCell(worker), el("td", worker.queues.join(", ")));
    const slots = worker.slots === null ? "no limit"
      : live ? worker.holds.length + " / " + worker.slots + " busy" : String(worker.slots);
    tr.append(el("td", slots, {class: "num"}));
    if (live) tr.append(holdsCell(worker));
    const when = worker.state === "stopped" ? worker.stopped_at : worker.last_seen;
    tr.append(machineCell(worker), el("td", worker.version || "—"), el("td", ago(when)));
    return tr;
  }

  function seconds(s) {
    if (s === null || s === undefined) return "running";
    return s < 90 ? s.toFixed(s < 10 ? 2 : 0) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
  }

  // The newest tasks the workers ran (apps/runs/task_log.py), as Celery Flower lists them.
  function drawTasks(tasks) {
    const rows = tasks.map((task) => {
      const tr = el("tr", null, {"data-task": task.task_id});
      tr.append(el("td", task.name), el("td", task.args, {class: "small"}), el("td", task.worker || "—"),
        el("td", ago(task.started_at)), el("td", seconds(task.runtime_s), {class: "num"}),
        el("td", task.outcome, {class: "outcome " + task.outcome}), el("td", task.result, {class: "muted small"}));
      return tr;
    });
    if (!rows.length) rows.push(el("tr"));
    if (!tasks.length) rows[0].append(el("td", "None yet.", {colspan: 7, class: "muted"}));
    document.querySelector("[data-workers-tasks]").replaceChildren(...rows);
  }

  // The periodic tasks (task_log.housekeeping): each one's newest run and its count, apart from the
  // list above, which they filled (the search index's round every 10 s).
  function drawHousekeeping(tasks) {
    const rows = (tasks || []).map((task) => {
      const newest = task.newest;
      const tr = el("tr", null, {"data-periodic": task.name});
      tr.append(el("td", task.name), el("td", newest ? ago(newest.started_at) : "never"),
        el("td", newest ? newest.worker || "—" : "—"), el("td", newest ? seconds(newest.runtime_s) : "", {class: "num"}),
        el("td", newest ? newest.outcome : "", {class: "outcome " + (newest ? newest.outcome : "")}),
        el("td", String(task.runs), {class: "num"}), el("td", String(task.failed), {class: "num" + (task.failed ? " bad" : "")}));
      return tr;
    });
    if (!rows.length) {
      rows.push(el("tr"));
      rows[0].append(el("td", "None: the embedded server runs no Celery beat (set REDIS_URL for the full stack).",
        {colspan: 7, class: "muted"}));
    }
    document.querySelector("[data-workers-housekeeping]").replaceChildren(...rows);
  }

  // Per queue, who gets the next free slot (apps/runs/turns.py: the duty that asked first).
  function drawWaiting(waiting) {
    const card = document.querySelector("[data-workers-waiting]");
    const queues = Object.keys(waiting).filter((queue) => waiting[queue].length);
    if (!queues.length) {
      card.replaceChildren(el("p", "Nothing waits: every duty sent to a queue has a slot.", {class: "muted"}));
      return;
    }
    card.replaceChildren(...queues.map((queue) => {
      const block = el("div", null, {"data-waiting-queue": queue});
      block.append(el("h3", null));
      block.firstChild.append(el("code", queue), " · " + waiting[queue].length + " waiting");
      const list = el("ol", null, {class: "holds"});
      waiting[queue].forEach((one) => {
        const item = el("li");
        item.append(el("a", "run " + one.run_id + " " + one.run_name, {href: one.run_url}), " · ", el("code", one.duty));
        item.append(" · ", el("span", one.why + ", asked " + ago(one.asked), {class: "muted small"}));
        list.append(item);
      });
      block.append(list);
      return block;
    }));
  }

  // Free slots per queue: a run waiting for a `train` slot is not helped by a free `default` one,
  // which "1 of 5 slots free" counted in (issue #42, finding 8). A worker on two queues counts in both.
  function slotsByQueue(workers) {
    const byQueue = {};
    workers.forEach((w) => w.queues.forEach((queue) => {
      const q = byQueue[queue] || (byQueue[queue] = {free: 0, slots: 0});
      q.free += w.free || 0;
      q.slots += w.slots || 0;
    }));
    return Object.keys(byQueue).sort().map((queue) =>
      queue + " " + byQueue[queue].free + " of " + byQueue[queue].slots + " free").join(" · ") || "no slots";
  }

  function draw(data) {
    if (document.querySelector(".confirm-pop")) return; // a curator is answering a question: keep it
    ["workers", "lost", "stopped"].forEach((section) => {
      const body = document.querySelector('[data-workers="' + section + '"]');
      const rows = data[section].map((worker) => row(worker, section === "workers"));
      if (!rows.length) {
        const empty = el("tr");
        const text = section === "workers" ? "No live worker: runs wait until one starts (docs/scale.md)." : "None.";
        empty.append(el("td", text, {colspan: section === "workers" ? 7 : 6, class: "muted"}));
        rows.push(empty);
      }
      body.replaceChildren(...rows);
    });
    drawWaiting(data.waiting);
    drawTasks(data.tasks);
    drawHousekeeping(data.housekeeping);
    document.querySelector("[data-workers-summary]").textContent = data.embedded
      ? "embedded"
      : data.workers.length + " live · " + slotsByQueue(data.workers) + " · " + data.lost.length + " lost" +
        (data.queued ? " · in the broker: " + Object.keys(data.queued).sort().map((q) => q + " " + data.queued[q]).join(", ")
          : "");
    document.querySelector("[data-workers-embedded]").hidden = !data.embedded;
    document.querySelector("[data-workers-history]").hidden = data.embedded; // one process: nothing lost
    document.querySelector("[data-workers-updated]").textContent = "updated " + new Date().toLocaleTimeString();
  }

  drawAndPoll(script.dataset.url, "workers-data", draw);
})();
