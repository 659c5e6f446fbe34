"""Numbered, coalesced live updates of a run (docs/architecture.md, "Live updates").

Channels drops messages silently when a client falls behind, so every message carries the run's
next `seq`; a client that sees a gap fetches the snapshot (`views.run_live`) again. The snapshot
reads `Run.live_seq` before the data it returns, so any message numbered at or below it describes
something already in the snapshot.

Each process coalesces its updates: an update that comes after a quiet spell (nothing sent for
COALESCE_SECONDS) goes out at once, on a timer of 0; one that comes sooner starts the window's
timer, and everything published until it fires goes out as one message. That keeps a run to a few
messages a second however fast its steps are, and a step a second (the live bench: p95 560 ms from
commit to 50 clients, 0.25 s of it the window) reaches pages without waiting for the window.
"""
import logging
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

from apps.saved_models.models import SavedModel

from .consumers import run_group
from .models import Checkpoint, Run

COALESCE_SECONDS = 0.25
log = logging.getLogger(__name__)


def next_seq(run_id: int) -> int:
    """The run's next number, taken once: writers of the run take turns on its row. FOR NO KEY
    UPDATE (the key is never changed) lets the foreign-key checks of the run's metric points and
    experiences written meanwhile go on; FOR UPDATE held each such insert until this committed
    (tests/apps/runs/test_live_locks.py). SQLite, which locks the whole database, ignores it."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True).only("live_seq").get(pk=run_id)
        run.live_seq += 1
        run.save(update_fields=["live_seq"])
        return run.live_seq


def checkpoints_update(run_id: int) -> dict:
    """The run's checkpoints as the run page's table lists them, newest first: part of the snapshot,
    and sent whole whenever one is saved or deleted (a few rows: trainer.keep_checkpoints). The
    table was the page's as first rendered: after a stop it listed v20 while v37 was saved."""
    rows = Checkpoint.objects.filter(run_id=run_id).order_by("-version").values_list("version", "step", "created_at")
    models = saved_models(run_id)
    return {"type": "checkpoints", "checkpoints": [
        {"version": version, "step": step, "saved": round(saved.timestamp(), 3),
         "url": reverse("checkpoint-download", args=[run_id, version]),
         "save_url": reverse("model-save", args=[run_id, version]), "models": models.get(version, [])}
        for version, step, saved in rows
    ]}


def saved_models(run_id: int) -> dict[int, list[str]]:
    """{checkpoint version: the names of the models saved from it} (apps.saved_models)."""
    models = {}
    for version, name in SavedModel.objects.filter(run_id=run_id).order_by("name").values_list(
            "checkpoint_version", "name"):
        models.setdefault(version, []).append(name)
    return models


class LivePublisher:
    def __init__(self, coalesce_seconds: float = COALESCE_SECONDS):
        self.coalesce_seconds = coalesce_seconds
        self._pending: dict[int, list[dict]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # numbers go out in the order they were taken
        self._timer: threading.Timer | None = None
        self._last_sent = float("-inf")  # time.monotonic() of the last flush

    def publish(self, run_id: int, update: dict) -> None:
        with self._lock:
            self._pending.setdefault(run_id, []).append(update)
            if self._timer is None:
                quiet = time.monotonic() - self._last_sent >= self.coalesce_seconds
                self._arm_timer(0 if quiet else self.coalesce_seconds)

    def _arm_timer(self, seconds: float) -> None:
        """Flush in `seconds` (the caller holds self._lock and saw no timer armed)."""
        self._timer = threading.Timer(seconds, self._flush_on_timer)
        self._timer.daemon = True
        self._timer.start()

    def _flush_on_timer(self) -> None:
        try:
            self.flush()
        finally:
            connection.close()  # the timer thread's own; nothing else would close it

    def flush(self) -> None:
        """Send what is pending now (the timer calls this; so does a worker before it exits).

        A batch is taken and numbered under the send lock: two flushes (a timer and a worker's
        last one) must not take batches in one order and number them in the other."""
        layer = get_channel_layer()
        with self._send_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
                self._last_sent = time.monotonic()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            for run_id, updates in pending.items():
                try:
                    seq = next_seq(run_id)
                except Run.DoesNotExist:  # deleted since: nobody to tell, and the other runs' updates still go
                    continue
                except DatabaseError as err:  # Postgres unreachable for now: they go with the next flush
                    log.warning("live updates of run %s wait for the database: %r", run_id, err)
                    self._requeue(run_id, updates)
                    continue
                message = {"type": "updates", "seq": seq, "updates": updates}
                try:
                    async_to_sync(layer.group_send)(run_group(run_id), {"type": "run.update", "payload": message})
                except Exception as err:  # noqa: BLE001 - Redis down: the pages see the gap in seq and refetch
                    log.warning("live update %s of run %s not sent: %r", message["seq"], run_id, err)

    def _requeue(self, run_id: int, updates: list[dict]) -> None:
        """Put a batch that could not be numbered back in front of what came since, and try again
        after a window (not sooner: the database just refused)."""
        with self._lock:
            self._pending[run_id] = updates + self._pending.get(run_id, [])
            if self._timer is None:
                self._arm_timer(self.coalesce_seconds)


publisher = LivePublisher()


def broadcast(run_id: int, update: dict) -> None:
    """Publish to the run's live channel once the current transaction commits (never a rolled-back change)."""
    transaction.on_commit(lambda: publisher.publish(run_id, update))
