// The annotation page: keyboard shortcuts, and the run's annotation channel (who takes what, new
// experiences). The messages are hints; the server checks every judgement, so nothing here is trusted.
"use strict";

const ANNOTATE_FORBIDDEN = 4403; // the consumer's close code for "not allowed": retrying will not help
const ANNOTATE_RETRY_MS = [1000, 30000];

function annotateSocket(path, onMessage) {
  const dot = document.getElementById("live");
  let retryMs = ANNOTATE_RETRY_MS[0];
  const connect = () => {
    const socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    socket.onopen = () => { retryMs = ANNOTATE_RETRY_MS[0]; dot.className = "live-dot live"; dot.textContent = "live"; };
    socket.onmessage = (event) => onMessage(JSON.parse(event.data));
    socket.onclose = (event) => {
      dot.className = "live-dot offline";
      dot.textContent = event.code === ANNOTATE_FORBIDDEN ? "not allowed" : "offline";
      if (event.code === ANNOTATE_FORBIDDEN) return;
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, ANNOTATE_RETRY_MS[1]);
    };
  };
  connect();
}

const RUN_FINISHED = ["stopped", "completed", "failed"];

// An empty queue waits for the explorer's next step, then asks for an item again; when the run
// finishes, the page comes back saying so.
function watchEmptyQueue(root) {
  annotateSocket(root.dataset.socket, (message) => {
    const finished = message.type === "run_status" && RUN_FINISHED.includes(message.status);
    if (message.type === "new_experiences" || message.type === "released" || finished) location.assign(root.dataset.next);
  });
}

function annotateItem(root) {
  const experience = Number(root.dataset.experience);
  const me = root.dataset.me;
  const panels = [...root.querySelectorAll(".panel")];
  const editForm = document.getElementById("edit-form");
  const editor = document.getElementById("edit-text");
  const response = document.getElementById("response");
  const responseShown = !("turns" in response.dataset); // a multi-turn item shows its turns instead
  let panel = 0; // index of the active panel
  let choice = -1; // index of the selected button in it

  const buttons = () => [...panels[panel].querySelectorAll(".choice")];
  const show = () => {
    panels.forEach((p, i) => p.classList.toggle("active", i === panel));
    root.querySelectorAll(".choice").forEach((b) => b.classList.remove("selected"));
    if (choice >= 0) buttons()[choice].classList.add("selected");
    // B and the "A:" label belong to the comparison: while rating or flagging, one response is shown.
    const comparing = panels[panel] && panels[panel].dataset.panel === "compare";
    root.querySelectorAll(".compare-only").forEach((el) => { el.hidden = !comparing; });
  };
  const activate = (name) => { panel = panels.findIndex((p) => p.dataset.panel === name); if (panel < 0) panel = 0; choice = -1; show(); };
  const submitChoice = () => { if (choice >= 0) buttons()[choice].click(); };
  // Editing happens in place: the response turns into the editor, so it is never shown twice.
  const startEditing = () => {
    panels.forEach((p) => p.classList.remove("active")); // keys go to the editor now, not to a panel
    editForm.hidden = false;
    response.hidden = true;
    editor.focus();
    editor.setSelectionRange(editor.value.length, editor.value.length);
  };
  const stopEditing = () => {
    editForm.hidden = true;
    response.hidden = !responseShown;
    editor.blur();
    show();
  };

  document.addEventListener("keydown", (event) => {
    if (editor && event.target === editor) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); editForm.requestSubmit(); }
      if (event.key === "Escape") stopEditing();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (!panels.length) { // nothing to judge here: Enter goes on to the next item
      if (event.key === "Enter" && document.getElementById("next")) document.getElementById("next").click();
      return;
    }
    const count = buttons().length;
    const keyed = buttons().findIndex((b) => b.dataset.key === event.key);
    if (/^[0-9]$/.test(event.key) && keyed >= 0) { choice = keyed; show(); }
    else if (event.key === "ArrowRight") { choice = Math.min(choice + 1, count - 1); show(); }
    else if (event.key === "ArrowLeft") { choice = Math.max(choice - 1, 0); show(); }
    else if (event.key === "ArrowDown") { panel = (panel + 1) % panels.length; choice = -1; show(); }
    else if (event.key === "ArrowUp") { panel = (panel + panels.length - 1) % panels.length; choice = -1; show(); }
    else if (event.key === "Enter") submitChoice();
    else if (event.key === "r") activate("rate");
    else if (event.key === "c") activate("compare");
    else if (event.key === "f") activate("flag");
    else if (event.key === "e") startEditing();
    else if (event.key === "s") document.getElementById("skip").click();
    else if (event.key === "p") document.getElementById("postpone").click();
    else return;
    event.preventDefault();
  });
  if (editForm) {
    document.getElementById("edit").addEventListener("click", startEditing);
    document.getElementById("edit-cancel").addEventListener("click", stopEditing);
    if (!editForm.hidden) editor.focus(); // the server refused an edit: carry on editing it
  }
  show();

  if (!root.dataset.socket) return; // imported data: no run, no channel
  const holders = new Set(document.getElementById("holders").textContent.split(", ").filter(Boolean));
  const showHolders = () => {
    document.getElementById("holders").textContent = [...holders].join(", ");
    document.getElementById("taken-notice").hidden = holders.size === 0;
  };
  // New experiences are a quiet count beside the queue's size, not a notice: the item at hand matters more.
  const openedAtStep = Number(root.dataset.step);
  annotateSocket(root.dataset.socket, (message) => {
    if (message.type === "run_status" && RUN_FINISHED.includes(message.status)) {
      // Not a reload: the annotator may be halfway through an edit. The server says at submit
      // whether this item can still be judged.
      const note = document.getElementById("queue-note");
      if (note) note.textContent = `the run has ${message.status}: no new items will come`;
      return;
    }
    if (message.type === "new_experiences") {
      const steps = message.explorer_step - openedAtStep;
      const note = document.getElementById("new-steps");
      if (note && steps > 0) note.textContent = ` · +${steps} explorer step${steps === 1 ? "" : "s"} since`;
      return;
    }
    if (message.experience !== experience || message.user === me || !panels.length) return;
    if (message.type === "taken") holders.add(message.user);
    if (message.type === "released" || message.type === "judged") holders.delete(message.user);
    showHolders();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const item = document.getElementById("annotate");
  if (item) annotateItem(item);
  const empty = document.getElementById("annotate-empty");
  if (empty && empty.dataset.socket) watchEmptyQueue(empty); // a finished run writes nothing more: no need to wait
});
