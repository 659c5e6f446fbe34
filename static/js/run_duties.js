// The run page's duties: which worker serves each part of the run, or what it waits for
// (apps/runs/waits.duty_states), drawn from the copy in the page, then polled from
// /api/runs/<id>/duties/ every heartbeat interval while the run is active.
"use strict";

(function () {
  const page = JSON.parse(document.getElementById("run-page-data").textContent);
  const box = document.getElementById("run-duties");
  const rolling = document.querySelector("[data-explorers-running]");
  if (!box) return;

  function clock(iso) {
    return iso ? new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" }) : "";
  }

  // `backquoted` words (a queue, a command) as <code>, as the page's messages show them (templatetags/text.py).
  function withTicks(element, text) {
    element.replaceChildren(...text.split("`").map((part, i) =>
      i % 2 ? Object.assign(document.createElement("code"), { textContent: part }) : document.createTextNode(part)));
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
    const detail = document.createElement("span");
    detail.className = "duty-detail";
    withTicks(detail, duty.detail + (duty.since && duty.state !== "waiting" ? " · since " + clock(duty.since) : ""));
    line.append(name, state, detail);
    return line;
  }

  // The header's status as the runs list says it (waits.shown_status): "queued" while no worker
  // has taken a duty yet, where the run's own status says "starting".
  const badge = document.getElementById("run-status");

  function draw(data) {
    const finished = page.finished_statuses.includes(data.status);
    if (badge && badge.textContent !== data.shown_status && data.status === badge.dataset.status) {
      badge.textContent = data.shown_status;
      badge.className = "status " + data.shown_status;
    }
    box.hidden = finished || !data.duties.length;
    box.replaceChildren(...data.duties.map(row));
    if (rolling) {
      rolling.textContent = finished ? "" : `· ${data.explorers_running} of ${data.explorers} running`;
    }
    return finished;
  }

  // Every heartbeat interval while each duty runs (or is paused); every 2 s while one changes hands
  // (waiting, starting, handed over...): after a Resume the line said "waiting for a train worker"
  // for 10 s while the trainer's steps went on.
  const pollMs = 1000 * (page.duties.poll_s || 10);
  const settled = (data) => data.duties.every((duty) => duty.state === "running" || duty.state === "paused");
  function next(data) { return settled(data) ? pollMs : Math.min(pollMs, 2000); }
  function poll() {
    fetch(page.duties_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((data) => { if (!draw(data)) setTimeout(poll, next(data)); })
      .catch(() => setTimeout(poll, 2 * pollMs)); // the server restarting: try again, less often
  }
  if (!draw(page.duties)) setTimeout(poll, next(page.duties));
})();
