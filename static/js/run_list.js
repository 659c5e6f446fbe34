// The runs list: a select-all box, "Compare selected" (a GET, so outside the stop form's POST),
// the column picker's search box, the column and view pickers closing on Escape or a click
// outside, and the address kept shareable: a list opened without ?cols= shows the user's saved
// columns, and the address gets them, so that a link copied from it opens the same table for
// whoever follows it.
"use strict";
(function () {
  const form = document.getElementById("runs-form");
  const boxes = () => [...form.querySelectorAll('input[name="runs"]')];
  const selectAll = form.querySelector("[data-select-all]");
  const compare = form.querySelector("[data-compare-url]");
  if (selectAll) {  // a grouped list (?group=) has no bulk actions
    selectAll.addEventListener("change", (event) => {
      boxes().forEach((box) => { box.checked = event.target.checked; });
    });
    compare.addEventListener("click", () => {
      const query = new URLSearchParams(boxes().filter((box) => box.checked).map((box) => ["runs", box.value]));
      location.href = compare.dataset.compareUrl + "?" + query;
    });
  }

  const address = new URLSearchParams(location.search);
  if (!address.has("cols")) {
    address.set("cols", form.dataset.cols);
    // Column ids as the server writes them (run_table: "explorer/reward_mean,best:trainer/loss").
    const readable = address.toString().replace(/%2C/g, ",").replace(/%2F/g, "/").replace(/%3A/g, ":");
    history.replaceState(history.state, "", location.pathname + "?" + readable);
  }

  const picker = document.getElementById("column-picker");
  const search = picker.querySelector("[data-column-search]");
  search.addEventListener("input", () => {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    picker.querySelectorAll("[data-column-group]").forEach((group) => {
      let shown = 0;
      group.querySelectorAll("label").forEach((label) => {
        const text = (label.textContent + " " + (label.title || "")).toLowerCase();
        label.hidden = !words.every((word) => text.includes(word));
        shown += label.hidden ? 0 : 1;
      });
      group.hidden = shown === 0;
    });
  });
  search.addEventListener("keydown", (event) => {
    if (event.key === "Enter") event.preventDefault();  // Enter finds; the button shows the columns
  });
  picker.addEventListener("toggle", () => { if (picker.open) search.focus(); });
  const pops = [picker, document.getElementById("saved-views")];
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") pops.forEach((pop) => { pop.open = false; });
  });
  document.addEventListener("click", (event) => {
    pops.forEach((pop) => { if (pop.open && !pop.contains(event.target)) pop.open = false; });
  });
  // A menu opens toward the side with room: grouped, the toolbar wraps and puts Views at the page's
  // left edge, where a menu opening to the left began off-screen (-309 px at 1366x768).
  pops.forEach((menu) => menu.addEventListener("toggle", () => {
    const pop = menu.querySelector(".column-picker-pop");
    if (!menu.open || !pop) return;
    const leftward = menu.getBoundingClientRect().right - pop.offsetWidth >= 8;
    pop.style.left = leftward ? "auto" : "0";
    pop.style.right = leftward ? "0" : "auto";
  }));
})();
