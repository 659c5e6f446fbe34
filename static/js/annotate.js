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

// An empty queue waits for the explorer's next step, then asks for an item again.
function watchEmptyQueue(root) {
  annotateSocket(root.dataset.socket, (message) => {
    if (message.type === "new_experiences" || message.type === "released") location.assign(root.dataset.next);
  });
}

function annotateItem(root) {
  const experience = Number(root.dataset.experience);
  const me = root.dataset.me;
  const panels = [...root.querySelectorAll(".panel")];
  const editor = document.getElementById("edit-text");
  let panel = 0; // index of the active panel
  let choice = -1; // index of the selected button in it

  const buttons = () => [...panels[panel].querySelectorAll(".choice")];
  const show = () => {
    panels.forEach((p, i) => p.classList.toggle("active", i === panel));
    root.querySelectorAll(".choice").forEach((b) => b.classList.remove("selected"));
    if (choice >= 0) buttons()[choice].classList.add("selected");
  };
  const activate = (name) => { panel = panels.findIndex((p) => p.dataset.panel === name); if (panel < 0) panel = 0; choice = -1; show(); };
  const submitChoice = () => { if (choice >= 0) buttons()[choice].click(); };

  document.addEventListener("keydown", (event) => {
    if (event.target === editor) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); editor.form.requestSubmit(); }
      if (event.key === "Escape") editor.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
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
    else if (event.key === "e") { editor.focus(); editor.setSelectionRange(editor.value.length, editor.value.length); }
    else if (event.key === "s") document.getElementById("skip").click();
    else if (event.key === "p") document.getElementById("postpone").click();
    else return;
    event.preventDefault();
  });
  show();

  if (!root.dataset.socket) return; // imported data: no run, no channel
  const holders = new Set(document.getElementById("holders").textContent.split(", ").filter(Boolean));
  const showHolders = () => {
    document.getElementById("holders").textContent = [...holders].join(", ");
    document.getElementById("taken-notice").hidden = holders.size === 0;
  };
  annotateSocket(root.dataset.socket, (message) => {
    if (message.type === "new_experiences") document.getElementById("new-notice").hidden = false;
    if (message.experience !== experience || message.user === me) return;
    if (message.type === "taken") holders.add(message.user);
    if (message.type === "released" || message.type === "judged") holders.delete(message.user);
    showHolders();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const item = document.getElementById("annotate");
  if (item) annotateItem(item);
  const empty = document.getElementById("annotate-empty");
  if (empty) watchEmptyQueue(empty);
});
