// The launch form: show only the knobs of the chosen algorithm (hidden fields keep their values).
"use strict";
(function () {
  const algorithm = document.querySelector('[name="algorithm.name"]');
  if (!algorithm) return; // the YAML editor
  const fields = document.querySelectorAll("[data-algorithms]");
  function update() {
    fields.forEach((field) => { field.hidden = !field.dataset.algorithms.split(" ").includes(algorithm.value); });
  }
  algorithm.addEventListener("change", update);
  update();
})();
