// The launch form: show only the knobs of the chosen algorithm and mode (hidden fields keep their
// values; a launch puts them back at their defaults: forms.LaunchForm._reset_hidden_unread), and
// always a field with an error, wherever it is: an error nobody can see cannot be fixed.
"use strict";
(function () {
  const algorithm = document.querySelector('[name="algorithm.name"]');
  const mode = document.querySelector('[name="mode"]');
  if (!algorithm) return; // the YAML editor
  const fields = document.querySelectorAll("[data-algorithms], [data-modes]");
  const concerns = (list, value) => list === undefined || list.split(" ").includes(value);
  function update() {
    fields.forEach((field) => {
      const concerned = concerns(field.dataset.algorithms, algorithm.value)
        && (!mode || concerns(field.dataset.modes, mode.value));
      field.hidden = !concerned && !field.classList.contains("invalid");
    });
  }
  algorithm.addEventListener("change", update);
  if (mode) mode.addEventListener("change", update);
  update();
})();
