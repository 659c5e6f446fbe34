// The annotation page as a single page: items are swapped in place (the server renders each as an
// HTML fragment, apps/feedback/api.py), the next item is fetched while this one is judged, and keys
// pressed while a judgement is saved or the next item loads are queued and applied to that next
// item once it is shown: never lost, never applied to the item before. `u` undoes, `h` shows the
// history. The run's annotation channel says who takes what. Messages and the page are hints: the
// server checks every judgement, so nothing here is trusted.
"use strict";

const ANNOTATE_FORBIDDEN = 4403; // the consumer's close code for "not allowed": retrying will not help
const ANNOTATE_RETRY_MS = [1000, 30000];
const RUN_FINISHED = ["stopped", "completed", "failed"];
const MODIFIERS = ["Control", "Shift", "Alt", "Meta", "CapsLock"];

function annotateSocket(path, onMessage) {
  const dot = document.getElementById("live");
  dot.hidden = false;  // hidden without JavaScript: no socket then, and "connecting" would stay for good
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

// An empty queue waits for the explorer's next step, then asks for an item again; when the run
// finishes, the page comes back saying so.
function watchEmptyQueue(root) {
  annotateSocket(root.dataset.socket, (message) => {
    const finished = message.type === "run_status" && RUN_FINISHED.includes(message.status);
    if (message.type === "new_experiences" || message.type === "released" || finished) location.assign(root.dataset.next);
  });
}

class AnnotationPage {
  constructor(page) {
    this.page = page;
    this.container = document.getElementById("annotate-item");
    this.me = page.dataset.me;
    this.busy = false; // a judgement, undo or item load is under way: keys wait in the queue
    this.queue = []; // keys pressed meanwhile, for the next item shown
    this.runNote = null; // "the run has failed ..." once heard: every item shown keeps saying it
    this.prefetch = null; // a Promise of the next item ({id, html, judgeable} or null)
    this.recheckDue = false; // the run's status changed while busy: ask whether the item is still open after
    // The address names the page's queue (data-next-url's query: run, strategy, filter), so a reload
    // takes this tab's queue, not the session's that another tab may have started since.
    this.queueSearch = new URL(page.dataset.nextUrl, location.href).search;
    history.replaceState(null, "", location.pathname + this.queueSearch);
    this.bindItem();
    document.addEventListener("keydown", (event) => this.onKey(event));
    this.container.addEventListener("submit", (event) => this.onSubmit(event));
    this.container.addEventListener("click", (event) => this.onClick(event));
    document.getElementById("undo").addEventListener("click", () => this.undo());
    document.getElementById("history-toggle").addEventListener("click", () => this.toggleHistory());
    document.getElementById("history-list").addEventListener("click", (event) => this.onHistoryClick(event));
    for (const id of ["undo", "history-toggle"]) document.getElementById(id).hidden = false;
    // The count and history of this page's run: the session's is the run another tab opened last.
    const run = new URLSearchParams(this.queueSearch).get("run");
    this.pageRun = run === null ? {} : { run };
    this.request("GET", `${page.dataset.progressUrl}?${new URLSearchParams(this.pageRun)}`)
      .then(({ ok, data }) => { if (ok) this.showProgress(data); });
    this.prefetchNext();
    if (page.dataset.socket) annotateSocket(page.dataset.socket, (message) => this.onMessage(message));
  }

  // -- the item on screen --------------------------------------------------------------------------

  bindItem() {
    const root = document.getElementById("annotate");
    this.itemId = Number(root.dataset.experience);
    this.panels = [...root.querySelectorAll(".panel")];
    this.judgeable = !("refused" in root.dataset); // the server's word (services.refusal) when it drew the item
    this.editForm = document.getElementById("edit-form");
    this.editor = document.getElementById("edit-text");
    this.response = document.getElementById("response");
    this.responseShown = !("turns" in this.response.dataset); // a multi-turn item shows its turns instead
    this.confirmBox = document.getElementById("confirm");
    this.panel = 0; // index of the active panel
    this.choice = -1; // index of the selected button in it
    this.editing = Boolean(this.editForm && !this.editForm.hidden); // the server refused an edit: carry on
    this.holders = new Set((document.getElementById("holders")?.textContent || "").split(", ").filter(Boolean));
    this.shownAt = performance.now();
    if (this.runNote) this.setText("queue-note", this.runNote);
    if (this.editing) this.editor.focus();
    // A changed edit is a new question: the reference check asks again when it is saved.
    this.editor?.addEventListener("input", () => { this.confirmBox.hidden = true; });
    // The browser cuts a paste at the box's maxlength without a word (27,000 characters pasted
    // kept 20,000): say so.
    this.editor?.addEventListener("paste", (event) => {
      const editor = this.editor;
      const after = editor.value.length - (editor.selectionEnd - editor.selectionStart)
        + event.clipboardData.getData("text").length;
      if (after > editor.maxLength) {
        this.notify(`An edit keeps at most ${editor.maxLength.toLocaleString("en-US")} characters: the paste was cut `
          + `to fit (it made ${after.toLocaleString("en-US")}).`, "warning");
      }
    });
    this.show();
  }

  render(item) {
    this.container.innerHTML = item.html;
    history.replaceState(null, "", this.page.dataset.pageUrl.replace("/0/", `/${item.id}/`) + this.queueSearch);
    document.title = `Experience ${item.id}`;
    window.scrollTo(0, 0);
    this.bindItem();
  }

  // The page's own queue (run, strategy, filter: its data-next-url), leaving out `exclude`: another
  // tab starting another queue changes the session's, not this page's.
  nextUrl(exclude) {
    const url = new URL(this.page.dataset.nextUrl, location.href);
    url.searchParams.set("exclude", exclude);
    return url.pathname + url.search;
  }

  setText(id, text) {
    const element = document.getElementById(id);
    if (element) element.textContent = text;
  }

  buttons() { return this.panels.length ? [...this.panels[this.panel].querySelectorAll(".choice")] : []; }

  show() {
    this.panels.forEach((p, i) => p.classList.toggle("active", i === this.panel && !this.editing));
    this.container.querySelectorAll(".choice").forEach((b) => b.classList.remove("selected"));
    if (this.choice >= 0) this.buttons()[this.choice].classList.add("selected");
    // B and the "A:" label belong to the comparison: while rating or flagging, one response is shown.
    const comparing = !this.editing && this.panels[this.panel]?.dataset.panel === "compare";
    this.container.querySelectorAll(".compare-only").forEach((el) => { el.hidden = !comparing; });
  }

  activate(name) {
    this.panel = Math.max(this.panels.findIndex((p) => p.dataset.panel === name), 0);
    this.choice = -1;
    this.show();
  }

  // Editing happens in place: the response turns into the editor, so it is never shown twice.
  startEditing() {
    if (!this.editForm) return;
    this.editing = true;
    this.editForm.hidden = false;
    this.response.hidden = true;
    this.editor.focus();
    this.editor.setSelectionRange(this.editor.value.length, this.editor.value.length);
    this.show();
  }

  stopEditing() {
    this.editing = false;
    this.editForm.hidden = true;
    this.confirmBox.hidden = true;
    this.response.hidden = !this.responseShown;
    this.editor.blur();
    this.show();
  }

  // -- keys ----------------------------------------------------------------------------------------

  onKey(event) {
    if (MODIFIERS.includes(event.key) || event.isComposing) return;
    if (event.target.id === "comment") { // typed into the comment; Esc goes back to the keys
      if (event.key === "Escape") event.target.blur();
      return;
    }
    const key = { key: event.key, ctrl: event.ctrlKey || event.metaKey, alt: event.altKey, inEditor: event.target === this.editor };
    if (this.busy) { // for the next item: kept, in order, until it is shown
      if (key.alt) return;
      this.queue.push(key);
      event.preventDefault();
      return;
    }
    if (this.handle(key, false)) event.preventDefault();
  }

  // One key, live or replayed from the queue; true when the page used it.
  handle(key, replayed) {
    // A click on Next made while busy: for the item it was made on only (not one shown since).
    if ("next" in key) { if (key.next === this.itemId && document.getElementById("next")) this.showNext(); return true; }
    if (this.editing && (key.inEditor || replayed)) return this.editorKey(key, replayed);
    if (key.ctrl || key.alt) return false;
    if (this.confirming()) {
      if (key.key === "Enter") { this.editForm.requestSubmit(); return true; }
      if (MODIFIERS.includes(key.key)) return false;
      // Any other key answers no and does what it does: "f 3 Enter", meant to flag the item
      // instead, saved the edit (f and 3 were ignored, Enter said yes).
      this.confirmBox.hidden = true;
      if (key.key === "Escape") { this.editor.focus(); return true; }
    }
    if (key.key === "u") { this.undo(); return true; }
    if (key.key === "h") { this.toggleHistory(); return true; }
    if (!this.panels.length) { // nothing to judge here: Enter goes on to the next item
      if (key.key === "Enter" && document.getElementById("next")) { this.showNext(); return true; }
      return false;
    }
    const count = this.buttons().length;
    const keyed = this.buttons().findIndex((b) => b.dataset.key === key.key);
    if (/^[0-9]$/.test(key.key) && keyed >= 0) this.choice = keyed;
    else if (key.key === "ArrowRight") this.choice = Math.min(this.choice + 1, count - 1);
    else if (key.key === "ArrowLeft") this.choice = Math.max(this.choice - 1, 0);
    else if (key.key === "ArrowDown") { this.panel = (this.panel + 1) % this.panels.length; this.choice = -1; }
    else if (key.key === "ArrowUp") { this.panel = (this.panel + this.panels.length - 1) % this.panels.length; this.choice = -1; }
    else if (key.key === "Enter") { if (this.choice >= 0) this.buttons()[this.choice].click(); return true; }
    else if (key.key === "r") this.activate("rate");
    else if (key.key === "c") this.activate("compare");
    else if (key.key === "f") this.activate("flag");
    else if (key.key === "e") { this.startEditing(); return true; }
    else if (key.key === "s") { document.getElementById("skip").click(); return true; }
    else if (key.key === "p") { document.getElementById("postpone").click(); return true; }
    else if (key.key === "n") { document.getElementById("comment")?.focus(); return true; }
    else return false;
    this.show();
    return true;
  }

  // A key for the editor. Live, the browser types it; replayed (typed while the item loaded), the
  // page types it, as the browser would have.
  editorKey(key, replayed) {
    const editor = this.editor;
    if (key.key === "Enter" && key.ctrl) { this.editForm.requestSubmit(); return true; }
    if (key.key === "Escape") { this.stopEditing(); return true; }
    if (!replayed) return false;
    const [start, end] = [editor.selectionStart, editor.selectionEnd];
    if (key.ctrl && key.key === "a") editor.select();
    else if (key.key === "Backspace") editor.setRangeText("", start === end ? Math.max(start - 1, 0) : start, end, "end");
    else if (key.key === "Enter") editor.setRangeText("\n", start, end, "end");
    else if (key.key.length === 1 && !key.ctrl) editor.setRangeText(key.key, start, end, "end");
    return true;
  }

  confirming() { return Boolean(this.confirmBox && !this.confirmBox.hidden); }

  // The queue's keys, in order, until one starts a judgement (the rest wait for the item after).
  release() {
    this.busy = false;
    if (this.recheckDue) { this.recheck(); return; } // the keys wait for its answer: they may be refused
    while (!this.busy && this.queue.length) this.handle(this.queue.shift(), true);
  }

  dropQueue(why) {
    if (this.queue.length) this.notify(`${this.queue.length} key(s) typed meanwhile were not applied: ${why}`, "error");
    this.queue = [];
  }

  // -- talking to the server -----------------------------------------------------------------------

  async request(method, url, body) {
    try {
      const response = await fetch(url, {
        method, credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": this.page.dataset.csrf, Accept: "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (!(response.headers.get("Content-Type") || "").includes("json")) {
        if (response.redirected) location.reload(); // signed out: the login page, then back here
        return { ok: false, status: response.status, data: { error: `the server answered ${response.status}` } };
      }
      return { ok: response.ok, status: response.status, data: await response.json() };
    } catch (error) {
      return { ok: false, status: 0, data: { error: `the server could not be reached (${error.message}): try again` } };
    }
  }

  itemUrl(id) { return this.page.dataset.itemUrl.replace("/0/", `/${id}/`); }

  prefetchNext() {
    const url = this.nextUrl(this.itemId);
    this.prefetch = this.request("GET", url).then(({ ok, data }) => (ok ? data.item : null));
  }

  onSubmit(event) {
    event.preventDefault(); // every form of the item goes as JSON, keyboard or mouse alike
    if (this.busy) return;
    const form = event.target;
    const action = new URL(form.action).pathname.split("/").filter(Boolean).pop();
    const fields = Object.fromEntries(new FormData(form, event.submitter));
    delete fields.csrfmiddlewaretoken;
    delete fields.shown_at;
    delete fields.confirm;
    if (action === "edit" && this.confirming()) fields.confirm = true;
    this.judge(action, fields);
  }

  async judge(action, fields) {
    this.busy = true;
    const seconds = ((performance.now() - this.shownAt) / 1000).toFixed(3);
    const comment = document.getElementById("comment")?.value || "";
    const { ok, status, data } = await this.request("POST", `${this.itemUrl(this.itemId)}${action}/`,
      { ...fields, seconds, ...(comment ? { comment } : {}) });
    if (ok) {
      this.showProgress(data);
      // A notice is about the last action: it goes with the next judgement saved (an undo's
      // stayed up for 17 items, issue #42), unless this one has its own (it replaced an earlier one).
      if (data.message) this.notify(data.message, "warning"); else this.clearNotice();
      // A comparison judges B too: B fetched ahead as the next item is judged already.
      await this.showNext(action === "compare" ? Number(fields.other) : null);
      return;
    }
    if (status === 404) { // the item went (a curator deleted it): the panels stayed live on it
      this.dropQueue("the item is gone");
      this.notify(`${data.error}: on to the next item.`, "warning");
      await this.showNext(this.itemId);
      return;
    }
    if (status === 409 && data.confirm) { // asked once: Enter again saves
      this.dropQueue("the edit needs confirming");
      this.setText("confirm-question", data.confirm);
      this.confirmBox.hidden = false;
      document.getElementById("confirm-save").focus();
    } else {
      this.dropQueue("the judgement was refused");
      if (data.item) this.render(data.item);
      else if (!this.editing) this.startOver(); // an edit keeps its text, to save again
      this.notify(data.error, "error");
    }
    this.release();
  }

  // The panels as a new item shows them: rating, nothing chosen. After an error with no item (a
  // 500, the network), the panel used must not stay open: the digits and Enter typed next saved
  // flags where the annotator meant ratings (issue #42).
  startOver() {
    this.panel = 0;
    this.choice = -1;
    this.show();
  }

  async showNext(judged = null) {
    this.busy = true;
    let next = await this.prefetch;
    if (!next || next.id === judged) {
      next = (await this.request("GET", this.nextUrl(`${this.itemId},${judged || ""}`))).data.item;
    }
    // The queue's page says why it is empty: this page's queue (data-queue-url starts it again), not
    // the session's, which another tab may have moved to another run or filter.
    if (!next) { location.assign(this.page.dataset.queueUrl); return; }
    this.render(next);
    this.prefetchNext();
    this.release();
  }

  async open(id) {
    this.busy = true;
    const { ok, data } = await this.request("GET", this.itemUrl(id));
    if (ok) { this.render(data.item); this.prefetchNext(); } else this.notify(data.error, "error");
    this.release();
  }

  // The run stopped, failed, completed or came back: whether this item may be judged can have
  // changed with it (one trained on is refused once its run has finished), so the server is asked,
  // as it answers a judgement, and the item drawn again where its answer changed: the rating
  // buttons stayed on an item the server refused. An edit under way is kept to copy.
  async recheck() {
    this.recheckDue = false;
    this.busy = true;
    const { ok, data } = await this.request("GET", this.itemUrl(this.itemId));
    if (ok && data.item.id === this.itemId && data.item.judgeable !== this.judgeable) {
      const typed = this.editing ? this.editor.value : null;
      this.render(data.item);
      const unsaved = document.getElementById("unsaved-edit");
      if (typed !== null && unsaved) {
        unsaved.querySelector("textarea").value = typed;
        unsaved.hidden = false;
      }
    }
    this.release();
  }

  async undo(feedbackId) {
    this.busy = true;
    const body = feedbackId === undefined ? this.pageRun : { feedback: feedbackId };
    const { ok, data } = await this.request("POST", this.page.dataset.undoUrl, body);
    if (ok) {
      this.notify(data.message, data.trained_on_step === null ? "done" : "warning");
      this.showProgress(data);
      this.render(data.item);
      this.prefetchNext();
    } else {
      this.notify(data.error, "error");
    }
    this.release();
  }

  // -- the bar: session count, notices, history ------------------------------------------------------

  notify(text, kind) {
    const notice = document.getElementById("notice");
    notice.textContent = text;
    notice.className = `notice ${kind}`;
    notice.hidden = false;
  }

  clearNotice() {
    document.getElementById("notice").hidden = true;
  }

  showProgress(data) {
    if (!("session_count" in data)) return;
    const count = document.getElementById("session-count");
    count.textContent = `${data.session_count} judged this session`;
    count.hidden = false;
    const list = document.getElementById("history-list");
    list.replaceChildren(...data.history.map((entry) => {
      const li = document.createElement("li");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "history-open";
      open.dataset.item = entry.item;
      const when = new Date(entry.at).toLocaleTimeString();
      const trained = entry.trained_on_step === null ? "" : ` · trained on at step ${entry.trained_on_step}`;
      open.textContent = `#${entry.item} ${entry.summary} · ${when}${trained}`;
      const undo = document.createElement("button");
      undo.type = "button";
      undo.className = "btn secondary small history-undo";
      undo.dataset.feedback = entry.id;
      undo.textContent = "Undo";
      li.append(open, undo);
      return li;
    }));
    if (!data.history.length) list.replaceChildren(Object.assign(document.createElement("li"), { className: "muted", textContent: "nothing judged yet" }));
  }

  toggleHistory() {
    const panel = document.getElementById("history");
    panel.hidden = !panel.hidden;
    // Open, the drawer takes its own column: over the page it hid the Rate/Compare/Flag panels.
    document.body.classList.toggle("history-shown", !panel.hidden);
    document.getElementById("history-toggle").setAttribute("aria-expanded", String(!panel.hidden));
  }

  onHistoryClick(event) {
    const button = event.target.closest("button");
    if (!button || this.busy) return;
    if (button.dataset.feedback) this.undo(Number(button.dataset.feedback));
    else if (button.dataset.item) this.open(Number(button.dataset.item));
  }

  onClick(event) {
    if (event.target.closest("#edit")) this.startEditing();
    else if (event.target.closest("#edit-cancel")) this.stopEditing();
    else if (event.target.closest("#next")) {
      event.preventDefault();
      // Busy asking whether the item is still open (recheck), the click waits for the answer as
      // keys do: it was dropped, and the annotator stayed on a refused item (CI, under load).
      if (this.busy) this.queue.push({ next: this.itemId }); else this.showNext();
    }
  }

  // -- the run's channel ------------------------------------------------------------------------------

  onMessage(message) {
    if (message.type === "run_status") {
      if (RUN_FINISHED.includes(message.status)) {
        // Not a reload: the annotator may be halfway through an edit (recheck keeps it).
        this.runNote = `the run has ${message.status}: no new items will come`;
        this.setText("queue-note", this.runNote);
      } else if (this.runNote) { // resumed: the note was kept until a reload
        this.runNote = null;
        this.setText("queue-note", `the run is ${message.status} again: new items will come`);
      }
      this.prefetchNext(); // the one fetched ahead was drawn before: it may be refused now
      this.recheckDue = true;
      if (!this.busy) this.recheck();
      return;
    }
    if (message.type === "new_experiences") {
      // New experiences are a quiet count beside the queue's size, not a notice: the item at hand matters more.
      const steps = message.explorer_step - Number(this.page.dataset.step);
      if (steps > 0) this.setText("new-steps", ` · +${steps} explorer step${steps === 1 ? "" : "s"} since`);
      return;
    }
    if (message.experience !== this.itemId || message.user === this.me || !this.panels.length) return;
    if (message.type === "taken") this.holders.add(message.user);
    if (message.type === "released" || message.type === "judged") this.holders.delete(message.user);
    this.setText("holders", [...this.holders].join(", "));
    document.getElementById("taken-notice").hidden = this.holders.size === 0;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.getElementById("annotate-page");
  if (page) window.rftAnnotation = new AnnotationPage(page);
  const empty = document.getElementById("annotate-empty");
  if (empty && empty.dataset.socket) watchEmptyQueue(empty); // a finished run writes nothing more: no need to wait
});
