// The runs list: a select-all box, and "Compare selected" (a GET, so outside the stop form's POST).
"use strict";
(function () {
  const form = document.getElementById("runs-form");
  const boxes = () => [...form.querySelectorAll('input[name="runs"]')];
  form.querySelector("[data-select-all]").addEventListener("change", (event) => {
    boxes().forEach((box) => { box.checked = event.target.checked; });
  });
  const compare = form.querySelector("[data-compare-url]");
  compare.addEventListener("click", () => {
    const query = new URLSearchParams(boxes().filter((box) => box.checked).map((box) => ["runs", box.value]));
    location.href = compare.dataset.compareUrl + "?" + query;
  });
})();
