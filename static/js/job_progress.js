// A job's progress (apps.core): live over its websocket, polling its progress.json while the socket
// is not open. Every message and every answer is the whole state of the job (apps.core.jobs.snapshot),
// so a lost message costs nothing but the wait for the next one.
//
// The page marks one element [data-job-progress] with data-snapshot-url and data-socket-path (and
// data-reload-when-finished to show the finished job as the server renders it), and the elements
// the widget fills: [data-job-bar] (a <progress> or a div whose width grows), [data-job-percent],
// [data-job-status] (Job.status_text: "running, cancelling ..."), [data-job-rows] (Job.rows_text:
// "done of total"), [data-job-counts] (rows and bytes), [data-job-result] (its value: the link's
// text), [data-job-error] and [data-job-cancel] (the Cancel form: hidden once a cancel would not be
// honoured, its button disabled once one is requested). With
// data-download-when-finished (an export started to be downloaded), the file downloads once written;
// a page opened after that marks [data-job-download] and downloads it at once.
"use strict";

(function () {
  // Once: the URL loses its ?download=1, so a reload or going back does not download again.
  function download(url) {
    const link = document.createElement("a");
    link.href = url;
    link.download = "";
    document.body.append(link);
    link.click();
    link.remove();
    history.replaceState(null, "", location.pathname);
  }

  const ready = document.querySelector("[data-job-download]");
  if (ready) download(ready.dataset.jobDownload);
  const root = document.querySelector("[data-job-progress]");
  if (!root) return;
  const POLL_MS = 500; // without a socket
  const LIVE_POLL_MS = 5000; // with one: Channels drops messages silently when a client falls behind
  const PING_MS = 25000; // keeps proxies from closing an idle socket
  const RETRY_MS = 2000;
  const FORBIDDEN = 4403; // the consumer's "not allowed to watch": retrying will not help
  let finished = false;
  let live = false;
  let timer = null;

  function all(name) {
    return document.querySelectorAll("[data-job-" + name + "]");
  }

  // Like Django's filesizeformat, which renders the page's first numbers.
  function fileSize(bytes) {
    const units = ["KB", "MB", "GB", "TB"];
    if (bytes < 1024) return bytes + " bytes";
    let size = bytes / 1024;
    let unit = 0;
    while (size >= 1024 && unit < units.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return size.toFixed(1) + " " + units[unit];
  }

  function counts(job) {
    const bytes = job.bytes_total ? " · " + fileSize(job.bytes_done) + " of " + fileSize(job.bytes_total) : "";
    return job.rows_text + ((job.rows_total || job.rows_done) === 1 ? " row" : " rows") + bytes;
  }

  function show(job) {
    all("bar").forEach((bar) => {
      if (bar.tagName === "PROGRESS") bar.value = job.percent;
      else bar.style.width = job.percent + "%";
      bar.closest("[role=progressbar]")?.setAttribute("aria-valuenow", job.percent);
    });
    all("percent").forEach((el) => (el.textContent = job.percent));
    all("status").forEach((el) => {
      el.textContent = job.status_text;
      el.className = "status " + job.status;
    });
    all("cancel").forEach((form) => {
      form.hidden = job.finished || !job.cancellable;
      form.querySelectorAll("button").forEach((button) => {
        if (!job.cancel_requested) return;
        button.disabled = true;
        button.textContent = "Cancelling…";
      });
    });
    all("rows").forEach((el) => (el.textContent = job.rows_text));
    all("counts").forEach((el) => (el.textContent = counts(job)));
    all("error").forEach((el) => {
      el.textContent = job.error;
      el.hidden = !job.error;
    });
    if (job.result_url) {
      all("result").forEach((el) => {
        const link = document.createElement("a");
        link.href = job.result_url;
        link.textContent = el.dataset.jobResult || "open the result";
        el.replaceChildren("Done: ", link);
      });
    }
    if (job.finished && !finished) {
      finished = true;
      clearTimeout(timer);
      const downloading = root.dataset.downloadWhenFinished && job.status === "succeeded";
      if (downloading) download(root.dataset.downloadWhenFinished);
      // A reload at once could cancel the download before its response arrives.
      if ("reloadWhenFinished" in root.dataset) setTimeout(() => location.reload(), downloading ? 1000 : 0);
    }
  }

  async function poll() {
    timer = null;
    try {
      const response = await fetch(root.dataset.snapshotUrl, { headers: { Accept: "application/json" }, cache: "no-store" });
      if (response.ok) show(await response.json());
    } catch (err) {
      // A dropped request (server restart, network blip): try again on the next tick.
    }
    if (!finished) timer = setTimeout(poll, live ? LIVE_POLL_MS : POLL_MS);
  }

  function pollNow() {
    clearTimeout(timer);
    poll();
  }

  function connect() {
    const socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + root.dataset.socketPath);
    let pinger = null;
    socket.onopen = () => {
      live = true;
      pinger = setInterval(() => socket.send(JSON.stringify({ type: "ping" })), PING_MS);
      pollNow(); // what changed before the socket joined the job's group
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "job") show(message.job);
      if (finished) socket.close();
    };
    socket.onclose = (event) => {
      clearInterval(pinger);
      const wasLive = live;
      live = false;
      if (finished) return;
      if (wasLive) pollNow(); // back to polling every POLL_MS
      if (event.code !== FORBIDDEN) setTimeout(connect, RETRY_MS);
    };
  }

  poll();
  if (root.dataset.socketPath && "WebSocket" in window) connect();
})();
