// The launch form: show only the knobs of the chosen algorithm (hidden fields keep their values),
// and always a field with an error, wherever it is: an error nobody can see cannot be fixed.
"use strict";
(function () {
  const algorithm = document.querySelector('[name="algorithm.name"]');
  if (!algorithm) return; // the YAML editor
  const fields = document.querySelectorAll("[data-algorithms]");
  function update() {
    fields.forEach((field) => {
      const concerned = field.dataset.algorithms.split(" ").includes(algorithm.value);
      field.hidden = !concerned && !field.classList.contains("invalid");
    });
  }
  algorithm.addEventListener("change", update);
  update();
})();
