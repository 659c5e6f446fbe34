"""Who gets a free slot: the duty of its queue that first asked for one.

Celery hands a queue's tasks out in the order they were sent. A duty sent again after its worker
stopped in order (a restart, a deploy) or died was sent last, so runs launched after it took the
slots it had held: after a full-stack stop and start the demo run waited behind two later runs,
its header saying "running · live" (#42, finding 3).

So a queue's serve_duty tasks are tickets. Each duty waiting for a worker has one task in the broker
(Run.queued_tasks[duty]: its id, queue, and `asked`, when the duty first asked for a slot; a
hand-over keeps it, a resume of a stopped or failed run asks afresh). The task a worker takes
serves whichever waiting duty of its queue asked first (`turn`), and the task that duty was sent
with, still in the broker, now stands for the duty it went ahead of: the two swap task ids, so each
waiting duty keeps exactly one task, and a task withdrawn later (drop_queued) is the one its duty
counts. Ties (one launch's duties) go by run, then by the order of the run's duties. A duty a
task has turned to is `taken` (since when) until its claim (claim_duty) drops the entry; one
taken longer than the heartbeat timeout and never claimed (its machine died in between) is sent
again by the watchdog (`untaken`). A task that reached a drained worker goes back to its queue
before it turns to any duty (`turn_away`).
"""
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from rftweb.celery import enqueue

from . import capacity, duties, task_log
from .models import Run

log = logging.getLogger(__name__)
SERVE_TASK = "workers.tasks.serve_duty"  # a duty's ticket (supervision.send)


@dataclass(frozen=True)
class Waiting:
    """A duty sent to a queue that no worker has taken yet."""

    run_id: int
    run_name: str
    duty: str
    queue: str
    asked: str  # ISO time it first asked for a slot
    task: str  # the Celery task that stands for it now
    why: str  # new | handed back | sent on

    def as_json(self) -> dict:
        return {"run_id": self.run_id, "run_name": self.run_name, "duty": self.duty, "queue": self.queue,
                "asked": self.asked, "why": self.why, "run_url": f"/runs/{self.run_id}/"}


def asked_at(run: Run, duty: str) -> str:
    """When the duty first asked for a slot, for a task sent for it now: kept from its heartbeat
    while the run goes on (a hand-over, a hand-back), else now."""
    return run.heartbeats.get(duty, {}).get("asked") or timezone.now().isoformat()


def _waiting_of(run: Run) -> list[Waiting]:
    order = {duty: index for index, duty in enumerate(duties.duties_of_run(run))}
    out = []
    for duty, sent in run.queued_tasks.items():
        if duty not in order or sent.get("taken"):
            continue  # beyond a lowered explorer.engine_num (withdrawn, or exits when it comes), or being claimed
        beat = run.heartbeats.get(duty, {})
        why = "handed back" if beat.get("handed_back") else "sent on" if beat else "new"
        out.append(Waiting(run.pk, run.name, duty, sent["queue"], sent.get("asked") or sent["at"], sent["task"], why))
    return out


def _key(waiting: Waiting, runs: dict[int, Run]) -> tuple:
    order = duties.duties_of_run(runs[waiting.run_id])
    return datetime.fromisoformat(waiting.asked), waiting.run_id, order.index(waiting.duty)


def queues(runs=None) -> dict[str, list[Waiting]]:
    """{queue: its waiting duties, the next to get a slot first}, over the runs still served."""
    runs = {run.pk: run for run in (runs if runs is not None else Run.objects.filter(status__in=Run.SERVED))}
    by_queue: dict[str, list[Waiting]] = {}
    for run in runs.values():
        if run.status in Run.SERVED:
            for waiting in _waiting_of(run):
                by_queue.setdefault(waiting.queue, []).append(waiting)
    for waiting in by_queue.values():
        waiting.sort(key=lambda w: _key(w, runs))
    return dict(sorted(by_queue.items()))


def turn(run_id: int, duty: str, task: str) -> tuple[int, str]:
    """The (run id, duty) that Celery task `task`, sent for `duty` of run `run_id`, serves now: the
    waiting duty of its queue that asked first. A task no waiting duty counts (a stale or
    duplicated one) serves what it was sent for, as before: claim_duty decides."""
    candidates = Run.objects.filter(status__in=Run.SERVED).only("pk")
    with transaction.atomic():
        # Every run that may be swapped with, locked in one order (two workers turning at once
        # must not wait on each other's locks).
        locked = Run.objects.select_for_update(no_key=True).filter(pk__in=candidates).order_by("pk")
        runs = {run.pk: run for run in locked}
        mine = next((w for run in runs.values() if run.status in Run.SERVED
                     for w in _waiting_of(run) if w.task == task), None)
        if mine is None:
            return run_id, duty
        first = queues(runs.values())[mine.queue][0]
        # Taken: no other task turns to it while this one claims it (claim_duty then drops the
        # entry). Two workers turning at once had both served the first duty, and the second's
        # swap gave the other duty a task already taken: it never got a worker.
        taken = {"task": task, "taken": timezone.now().isoformat()}
        changes = {first: taken} | ({mine: {"task": first.task}} if first != mine else {})
        for one, change in changes.items():
            run = runs[one.run_id]
            run.queued_tasks = {**run.queued_tasks, one.duty: {**run.queued_tasks[one.duty], **change}}
        for run in {runs[one.run_id] for one in changes}:
            run.save(update_fields=["queued_tasks"])
    if first != mine:
        task_log.serves(task, [first.run_id, first.duty])
    return first.run_id, first.duty


def owner_of(task: str, run_id: int, duty: str) -> tuple[int, str]:
    """The (run id, duty) Celery task `task` (sent for `duty` of run `run_id`) was serving or
    stands for now: a turn may have given it another duty than the one it was sent for."""
    run = Run.objects.filter(pk=run_id).only("heartbeats", "queued_tasks").first()
    if run is not None and _names(run, duty, task):
        return run_id, duty
    for other in Run.objects.filter(status__in=Run.SERVED).only("heartbeats", "queued_tasks"):
        for name in {*other.heartbeats, *other.queued_tasks}:
            if _names(other, name, task):
                return other.pk, name
    return run_id, duty


def _names(run: Run, duty: str, task: str) -> bool:
    return task in (run.heartbeats.get(duty, {}).get("task"), run.queued_tasks.get(duty, {}).get("task"))


def untaken(run: Run, timeout: float) -> list[str]:
    """The duties of the run a task turned to more than `timeout` seconds ago that no worker
    claimed since (its machine died between the turn and the claim): their entries dropped, for
    the watchdog to send them again. On the locked row."""
    now = timezone.now()
    stale = [duty for duty, sent in run.queued_tasks.items() if sent.get("taken")
             and (now - datetime.fromisoformat(sent["taken"])).total_seconds() > timeout]
    if stale:
        run.queued_tasks = {duty: sent for duty, sent in run.queued_tasks.items() if duty not in stale}
        run.save(update_fields=["queued_tasks"])
    return stale


def turn_away(node: str | None, run_id: int, duty: str, task: str | None) -> bool:
    """A task that reached a drained worker (capacity.set_drain: taken as the drain came) goes back
    to its queue under the same id, which the waiting duty's entry still counts, for another
    worker: True. It had turned to no duty yet, so nothing else changes."""
    if task is None or not capacity.draining(node):
        return False
    log.info("worker %s is drained: task %s (run %s, %s) goes back to its queue", node, task, run_id, duty)
    enqueue(SERVE_TASK, run_id, duty, queue=duties.queue_of(duty), task_id=task)
    return True
