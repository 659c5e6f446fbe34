// The run page's human-feedback card: counts and the human-reward metric from the feedback
// summary (apps/feedback stats.summary), fetched now and every few seconds while the page is open.
"use strict";
(function () {
  const card = document.getElementById("human-feedback");
  if (!card) return;
  const REFRESH_MS = 5000;
  const fields = Object.fromEntries([...card.querySelectorAll("[data-feedback]")].map((el) => [el.dataset.feedback, el]));
  const chart = document.getElementById("human-reward-chart");
  let drawnSteps = -1;

  function show(summary) {
    const j = summary.judgements;
    fields.human_reward.textContent = summary.human_reward === null ? "—" : summary.human_reward.toFixed(3);
    const more = [];
    if (summary.rated_waiting) more.push(`${summary.rated_waiting} more waiting for ${summary.judgements_per_item} judgements each`);
    if (summary.rated_flagged) more.push(`${summary.rated_flagged} more flagged: not trained on`);
    fields.rated_experiences.textContent = summary.rated_experiences + (more.length ? ` (${more.join("; ")})` : "");
    fields.judgements.textContent = `${j.rating} · ${j.edit} · ${j.preference} · ${j.flag}`;
    fields.data.textContent = `${summary.human_edits} · ${summary.dpo_pairs}${summary.dpo_pairs_flagged ? ` (+${summary.dpo_pairs_flagged} flagged)` : ""} · ${flagged(summary)}`;
    const waiting = summary.waiting_for_review;
    // Shown on a run that requires review: what a reviewer has yet to let into the counts above.
    if (fields.waiting_for_review) fields.waiting_for_review.textContent = `${waiting.rating} · ${waiting.edit} · ${waiting.preference}`;
    draw(summary.human_reward_by_step);
  }

  // Flagged rollouts, each once, and by what when more than flag judgements flagged them (a
  // pipeline, a curator in the admin): the one number alone read as the annotators' flags.
  const FLAGGED_BY = { judgement: "by judgement", pipeline: "by a pipeline", admin: "in the admin" };
  function flagged(summary) {
    const by = Object.entries(summary.flagged_by).filter(([, n]) => n);
    if (!by.length || (by.length === 1 && by[0][0] === "judgement")) return `${summary.flagged_experiences}`;
    return `${summary.flagged_experiences} (${by.map(([name, n]) => `${n} ${FLAGGED_BY[name]}`).join(", ")})`;
  }

  function draw(steps) {
    if (!steps.length || steps.length === drawnSteps) return;
    if (!window.Plotly) { // plotly.js is the page's last script: draw once it has loaded
      window.addEventListener("load", () => draw(steps), { once: true });
      return;
    }
    drawnSteps = steps.length;
    chart.hidden = false;
    const trace = { x: steps.map((s) => s.explorer_step), y: steps.map((s) => s.human_reward), mode: "lines+markers", name: "human reward" };
    const layout = {
      height: 220, margin: { l: 55, r: 10, t: 10, b: 40 },
      xaxis: { title: { text: "explorer step" } }, yaxis: { range: [0, 1], title: { text: "mean rating (0–1)" } },
    };
    Plotly.react(chart, [trace], layout, { displayModeBar: false, responsive: true });
  }

  async function refresh() {
    try {
      const response = await fetch(card.dataset.summary, { headers: { Accept: "application/json" } });
      // A session that ended answers the login page (redirected, HTML): nothing to show then.
      if (response.ok && !response.redirected) show(await response.json());
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }
  refresh();
})();
