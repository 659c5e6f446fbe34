// What the Workers page (workers.js) and a worker's page (worker.js) draw alike: elements, ages,
// a curator's actions on a held duty, and the poll that redraws a page from its API every 5 s.
"use strict";

const WorkerTables = (function () {
  const POLL_MS = 5000;

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    Object.entries(attrs || {}).forEach(([key, value]) => node.setAttribute(key, value));
    return node;
  }

  function ago(iso) {
    if (!iso) return "—";
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 90) return seconds + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    return Math.round(seconds / 3600) + " h ago";
  }

  // A curator's actions on a held duty (views.worker_duty): hand it back to its queue, or stop its
  // run; `script` is the page's script (data-act, data-csrf), `next` where the post comes back to.
  function dutyActions(hold, script, next) {
    const actions = el("span", null, {class: "duty-actions"});
    [["hand-back", "Hand back", "Hand " + hold.duty + " of " + hold.run_name + " back to its queue? It saves at its " +
      "next step; a free slot takes it, keeping its place."],
     ["stop", "Stop run", "Stop " + hold.run_name + "? The trainer saves a checkpoint at its current step and the " +
      "run ends; Resume carries it on from there."]].forEach(([action, label, question]) => {
      const form = el("form", null, {method: "post", action: script.dataset.act + hold.run_id + "/" +
        encodeURIComponent(hold.duty) + "/" + action + "/", "data-confirm": question, "data-confirm-button": label,
        "data-duty-action": action});
      form.append(el("input", null, {type: "hidden", name: "csrfmiddlewaretoken", value: script.dataset.csrf}));
      if (next) form.append(el("input", null, {type: "hidden", name: "next", value: next}));
      form.append(el("button", label, {type: "submit", class: "btn small " + (action === "stop" ? "danger" : "secondary")}));
      actions.append(form);
    });
    return actions;
  }

  // Draw the page from the JSON copy in it (element `dataId`), then from `url` every POLL_MS.
  function drawAndPoll(url, dataId, draw) {
    function poll() {
      fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
        .then((response) => (response.ok ? response.json() : null))
        .then((data) => data && draw(data))
        .catch(() => {})
        .finally(() => setTimeout(poll, POLL_MS));
    }
    draw(JSON.parse(document.getElementById(dataId).textContent));
    setTimeout(poll, POLL_MS);
  }

  return {el, ago, dutyActions, drawAndPoll};
})();
