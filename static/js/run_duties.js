// The run page's duties: which worker serves each part of the run, or what it waits for
// (apps/runs/waits.duty_states), drawn from the copy in the page, then polled from
// /api/runs/<id>/duties/ every heartbeat interval while the run is active, and again when its
// status changes (run_page.js). What a running duty's engine does comes with each change over the
// run's live channel ("activity" updates, run_page.js): the poll reads it from the duty's last
// heartbeat, which left the line 6 s behind the step cards on median and 14 s at worst.
"use strict";

(function () {
  const page = JSON.parse(document.getElementById("run-page-data").textContent);
  const box = document.getElementById("run-duties");
  const rolling = document.querySelector("[data-explorers-running]");
  if (!box) return;
  let shown = page.duties; // the newest answer of the server
  let timer = null;
  const heard = {}; // duty -> {parts, newest, at}: what its engine does, as the live channel said at `at`

  function clock(iso) {
    return iso ? new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" }) : "";
  }

  // `backquoted` words (a queue, a command) as <code>, as the page's messages show them (templatetags/text.py).
  function withTicks(element, text) {
    element.replaceChildren(...text.split("`").map((part, i) =>
      i % 2 ? Object.assign(document.createElement("code"), { textContent: part }) : document.createTextNode(part)));
  }

  const newest = (parts) => Math.max(0, ...parts.map((part) => part.since));

  // A running duty's detail, with what its engine does as the live channel said when that is newer
  // than the beat the server read; a phase past doing_long_s says how long, as the server's does
  // (timed from when the page heard it: the browser's clock need not be the worker's).
  function detail(duty) {
    const live = heard[duty.duty];
    if (duty.state !== "running" || !live || live.newest <= newest(duty.doing || [])) return duty.detail;
    const passed = Date.now() / 1000 - live.at;
    const parts = live.parts.map(({ what, since }) => {
      const took = passed + live.newest - since;
      return what + (took >= shown.doing_long_s ? ` (${Math.round(took)} s)` : "");
    });
    return [...parts, duty.where].join(" · ");
  }

  function row(duty) {
    const line = document.createElement("div");
    line.className = "duty " + duty.state.replace(" ", "-");
    line.dataset.duty = duty.duty;
    const name = document.createElement("span");
    name.className = "duty-name";
    name.textContent = duty.duty;
    const state = document.createElement("span");
    state.className = "duty-state";
    state.textContent = duty.state;
    const text = document.createElement("span");
    text.className = "duty-detail";
    withTicks(text, detail(duty) + (duty.since && duty.state !== "waiting" ? " · since " + clock(duty.since) : ""));
    line.append(name, state, text);
    if (duty.node_url) { // the page of the worker holding it
      const worker = document.createElement("a");
      worker.className = "duty-worker";
      worker.href = duty.node_url;
      worker.textContent = duty.node;
      line.append(worker);
    }
    return line;
  }

  // The header's status as the runs list says it (waits.shown_status): "queued" while no worker
  // has taken a duty yet, where the run's own status says "starting".
  const badge = document.getElementById("run-status");
  const finished = (data) => page.finished_statuses.includes(data.status);

  function draw(data) {
    shown = data;
    if (badge && badge.textContent !== data.shown_status && data.status === badge.dataset.status) {
      badge.textContent = data.shown_status;
      badge.className = "status " + data.shown_status;
    }
    box.hidden = finished(data) || !data.duties.length;
    box.replaceChildren(...data.duties.map(row));
    if (rolling) {
      rolling.textContent = finished(data) ? "" : `· ${data.explorers_running} of ${data.explorers} running`;
    }
  }

  // Every heartbeat interval while each duty runs (or is paused); every 2 s while one changes hands
  // (waiting, starting, handed over...): after a Resume the line said "waiting for a train worker"
  // for 10 s while the trainer's steps went on. Not while the run is finished: a status change
  // (run_page.js) asks again.
  const pollMs = 1000 * (page.duties.poll_s || 10);
  const settled = (data) => data.duties.every((duty) => duty.state === "running" || duty.state === "paused");
  function next(data) { return settled(data) ? pollMs : Math.min(pollMs, 2000); }
  function poll() {
    clearTimeout(timer);
    fetch(page.duties_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((data) => {
        draw(data);
        clearTimeout(timer); // one timer however many polls were in flight
        if (!finished(data)) timer = setTimeout(poll, next(data));
      })
      .catch(() => { clearTimeout(timer); timer = setTimeout(poll, 2 * pollMs); }); // the server restarting
  }

  // An "activity" update of the live channel: {duty, doing: [{role, what, since}]}.
  function hear(update) {
    heard[update.duty] = { parts: update.doing, newest: newest(update.doing), at: Date.now() / 1000 };
    draw(shown);
  }

  window.rftRunDuties = { poll, hear }; // run_page.js, browser tests and the console
  draw(page.duties);
  if (!finished(page.duties)) timer = setTimeout(poll, next(page.duties));
})();
