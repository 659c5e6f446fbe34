// Polls an import job's status.json and updates the progress bar until the job has finished.
(function () {
  const card = document.getElementById("import");
  if (!card) return;
  const bar = document.getElementById("import-bar");
  const badge = document.getElementById("import-status");
  const counts = document.getElementById("import-counts");
  const result = document.getElementById("import-result");
  const errorBox = document.getElementById("import-error");
  const POLL_MS = 500;

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

  function show(job) {
    bar.style.width = job.percent + "%";
    bar.parentElement.setAttribute("aria-valuenow", job.percent);
    badge.textContent = job.status;
    badge.className = "status " + job.status;
    counts.textContent = job.rows_done.toLocaleString() + " rows · " + fileSize(job.bytes_done) + " of " + fileSize(job.bytes_total);
    if (job.taskset_url) {
      result.textContent = "Done: ";
      const link = document.createElement("a");
      link.href = job.taskset_url;
      link.textContent = "open the taskset";
      result.appendChild(link);
    }
    if (job.error) {
      errorBox.textContent = job.error;
      errorBox.hidden = false;
    }
  }

  async function poll() {
    try {
      const response = await fetch(card.dataset.statusUrl, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const job = await response.json();
        show(job);
        if (job.finished) return;
      }
    } catch (err) {
      // A dropped request (server restart, network blip): try again on the next tick.
    }
    setTimeout(poll, POLL_MS);
  }

  poll();
})();
