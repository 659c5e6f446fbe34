// Live updates of a run (docs/architecture.md, "Live updates"): a snapshot over HTTP, then numbered messages
// over the websocket. Channels drops messages silently when a client falls behind, so the numbers
// are the truth: a message is applied only right after its predecessor; a gap means something was
// lost, and the client starts over from a fresh snapshot (as after a trainer's rewind).
"use strict";

const LIVE_FORBIDDEN = 4403; // the consumer's close code for "not allowed to watch": retrying will not help
const LIVE_RETRY_MS = [1000, 30000]; // reconnect backoff: first and longest wait
// Keeps proxies from closing an idle socket, and finds a lost last message: the pong carries the
// run's newest number (a final "stopped" that Channels dropped has no later message to show the gap).
const LIVE_PING_MS = 10000;

class LiveRun {
  // onSnapshot({seq, run, metrics}) replaces what the page shows; onUpdates([update]) adds to it;
  // onConnection("live" | "offline" | "forbidden") reports the socket.
  constructor({ snapshotUrl, socketUrl, onSnapshot, onUpdates, onConnection = () => {} }) {
    Object.assign(this, { snapshotUrl, socketUrl, onSnapshot, onUpdates, onConnection });
    this.seq = null; // number of the last message reflected on the page; null before the first snapshot
    this.loading = false; // a snapshot is on its way: messages wait in `queued`
    this.queued = [];
    this.retryMs = LIVE_RETRY_MS[0];
    this.everOpened = false;
  }

  start() {
    this.refetch();
    this.connect();
  }

  // The whole numbering rule. Returns what it did, for tests and logs.
  receive(message) {
    if (message.type === "pong" && message.seq > this.seq && !this.loading) {
      this.refetch(); // behind with nothing more on its way
      return "behind";
    }
    if (message.type !== "updates") return "ignored"; // other pongs, and errors
    if (this.loading) {
      this.queued.push(message);
      return "queued";
    }
    if (message.seq <= this.seq) return "ignored"; // already in the snapshot
    if (message.seq > this.seq + 1) {
      this.queued.push(message); // may still be newer than the snapshot we are about to get
      this.refetch();
      return "gap";
    }
    this.seq = message.seq;
    this.onUpdates(message.updates);
    // A trainer gone back to its checkpoint took the lost steps' points away (DjangoMetricSink.rewind):
    // appending cannot say so, a snapshot does.
    if (message.updates.some((update) => update.type === "rewind")) {
      this.refetch();
      return "rewound";
    }
    return "applied";
  }

  // Fetch the snapshot (retrying until it comes), show it, then replay what arrived meanwhile.
  async refetch() {
    if (this.loading) return;
    this.loading = true;
    for (let wait = LIVE_RETRY_MS[0]; ; wait = Math.min(wait * 2, LIVE_RETRY_MS[1])) {
      try {
        const response = await fetch(this.snapshotUrl, { headers: { Accept: "application/json" }, cache: "no-store" });
        if (!response.ok) throw new Error("snapshot: HTTP " + response.status);
        const snapshot = await response.json();
        this.seq = snapshot.seq;
        this.onSnapshot(snapshot);
        break;
      } catch (err) {
        console.warn(err);
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
    this.loading = false;
    const queued = this.queued.sort((a, b) => a.seq - b.seq);
    this.queued = [];
    queued.forEach((message) => this.receive(message));
  }

  connect() {
    const socket = new WebSocket(this.socketUrl);
    let pinger = null;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      if (this.everOpened) this.refetch(); // a reconnect: messages may have been missed meanwhile
      this.everOpened = true;
      this.retryMs = LIVE_RETRY_MS[0];
      pinger = setInterval(() => socket.send(JSON.stringify({ type: "ping" })), LIVE_PING_MS);
      this.onConnection("live");
    };
    socket.onmessage = (event) => this.receive(JSON.parse(event.data));
    socket.onclose = (event) => {
      clearInterval(pinger);
      if (event.code === LIVE_FORBIDDEN) {
        this.onConnection("forbidden");
        return;
      }
      this.onConnection("offline");
      const retry = () => {
        setTimeout(() => this.connect(), this.retryMs);
        this.retryMs = Math.min(this.retryMs * 2, LIVE_RETRY_MS[1]);
      };
      if (opened) {
        retry();
        return;
      }
      // A refused handshake shows the browser 1006, as a network gone does (never the consumer's
      // 4403): the page's own snapshot tells them apart. A researcher whose role was taken away
      // read "reconnecting…" for good.
      fetch(this.snapshotUrl, { headers: { Accept: "application/json" }, cache: "no-store", redirect: "manual" }).then(
        (response) => (response.status === 403 || response.type === "opaqueredirect" ? this.onConnection("forbidden") : retry()),
        retry,
      );
    };
  }
}

// The websocket URL for a path on this page's host (ws: or wss: as the page).
function liveSocketUrl(path) {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
}
