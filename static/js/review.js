// The review page's keys, as the annotation page's: a accepts, x rejects, n writes a note
// (Ctrl+Enter in it accepts, Esc leaves it).
"use strict";
(function () {
  const form = document.getElementById("review-form");
  if (!form) return;
  const note = document.getElementById("review-note");
  const submit = (id) => form.requestSubmit(document.getElementById(id));
  document.addEventListener("keydown", (event) => {
    if (event.target === note) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); submit("accept"); }
      else if (event.key === "Escape") note.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "a") { event.preventDefault(); submit("accept"); }
    else if (event.key === "x") { event.preventDefault(); submit("reject"); }
    else if (event.key === "n") { event.preventDefault(); note.focus(); }
  });
})();
