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
      rolling.textContent = finished ? "" : `· ${data.explorers_running} of ${data.explorers} rolling out`;
    }
    return finished;
  }

  let pollMs = 1000 * (page.duties.poll_s || 10);
  function poll() {
    fetch(page.duties_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((data) => { if (!draw(data)) setTimeout(poll, pollMs); })
      .catch(() => setTimeout(poll, 2 * pollMs)); // the server restarting: try again, less often
  }
  if (!draw(page.duties)) setTimeout(poll, pollMs);
})();
