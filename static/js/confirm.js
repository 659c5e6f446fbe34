// Asks before a form does something hard to undo: a form with data-confirm="Question?" (and
// data-confirm-button, the confirming button's label) shows the question in place, under its
// buttons, instead of submitting; the confirming button submits it. "{count}" in the question is
// the number of checked boxes named "runs" in the form (the runs list's "Stop selected").
// Without JavaScript the form posts at once, as before.
"use strict";
(function () {
  function close(form) {
    form.querySelector(".confirm-pop")?.remove();
  }

  function ask(form, submitter) {
    close(form);
    const count = form.querySelectorAll('input[name="runs"]:checked').length;
    const box = document.createElement("div");
    box.className = "confirm-pop";
    box.setAttribute("role", "alertdialog");
    const question = document.createElement("p");
    question.textContent = form.dataset.confirm.replace("{count}", count).replace("{s}", count === 1 ? "" : "s");
    const yes = document.createElement("button");
    yes.type = "button";
    yes.className = "btn danger small";
    yes.textContent = form.dataset.confirmButton || "Confirm";
    yes.addEventListener("click", () => { close(form); form.submit(); }); // submit() skips this handler
    const no = document.createElement("button");
    no.type = "button";
    no.className = "btn secondary small";
    no.textContent = "Cancel";
    no.addEventListener("click", () => close(form));
    box.addEventListener("keydown", (event) => { if (event.key === "Escape") close(form); });
    const buttons = document.createElement("div");
    buttons.className = "confirm-buttons";
    buttons.append(yes, no);
    box.append(question, buttons);
    // Under the button's toolbar where there is one: the runs list's form holds the whole table,
    // and under the form the question opened a screen away from "Stop selected".
    (submitter?.closest(".toolbar") || form).append(box);
    yes.focus();
  }

  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-confirm]");
    if (!form) return;
    // Nothing checked: nothing to ask; the server says what is missing.
    if (form.dataset.confirm.includes("{count}") && !form.querySelector('input[name="runs"]:checked')) return;
    event.preventDefault();
    ask(form, event.submitter);
  });
  // A click elsewhere on the page is a "no".
  document.addEventListener("click", (event) => {
    document.querySelectorAll("form[data-confirm] .confirm-pop").forEach((box) => {
      if (!box.parentElement.contains(event.target)) box.remove();
    });
  });
})();
