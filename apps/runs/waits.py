"""What a run waits for, given the workers (capacity.py): where each of its duties stands for a
person (the run page, the runs list, /api/runs/<id>/duties/), the status the lists show, the free
slots a launch form offers, and what a launch warns it will wait for."""
import time
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.core.cache import cache as shared_cache

from workers.rft.config import ConfigError

from . import config_fit, duties, turns
from .capacity import STARTING_KEY, WorkerState, overview, worker_url
from .config_checks import source_run_warnings
from .config_keys import stored_config
from .models import Run, Worker


def _starting(queue: str) -> list[str]:
    """The workers a command noted it is starting for the queue (capacity.workers_starting)."""
    noted = shared_cache.get(STARTING_KEY)
    return (noted or {}).get("queues", {}).get(queue, [])


@dataclass
class DutyState:
    """Where one duty of a run stands, for a person (the run page, the runs list, the API)."""

    duty: str
    queue: str  # the Celery queue whose workers serve it
    state: str  # waiting | starting | running | paused | handing back | handed over | lost | stopping | ended
    node: str | None  # the Celery worker holding it
    since: str | None  # ISO time the state began, where known
    detail: str
    # A running duty: what its engine did at its last beat (workers.rft.activity's parts), and its
    # detail after that ("on train@vm, from checkpoint v5 (trainer step 5)"). The run page shows
    # what the live channel said since instead, when that is newer (static/js/run_duties.js).
    doing: list = field(default_factory=list)
    where: str = ""

    def as_json(self) -> dict:
        return {**asdict(self), "node_url": self.node and worker_url(self.node)}


def duty_states(run: Run, live: list[WorkerState] | None = None) -> list[DutyState]:
    """Each duty of the run: waiting for a worker of its queue (saying which slots are busy and
    with what), starting (the worker loads the model), running, paused (held while its run is
    paused), handing back, handed over (its worker was lost and the watchdog sent it on), lost (its
    worker fell silent; the watchdog sends it on after RFTWEB_HEARTBEAT_TIMEOUT), stopping (its
    worker leaves at its next step) or ended (let go for good, or its run has stopped or ended).
    `live`: overview()["workers"], when the caller has it."""
    live = overview()["workers"] if live is None else live
    timeout = settings.RFTWEB_HEARTBEAT_TIMEOUT
    stopped_nodes = set() if settings.RFTWEB_EMBEDDED else set(
        Worker.objects.filter(stopped_at__isnull=False).values_list("name", flat=True))
    waiting = {} if settings.RFTWEB_EMBEDDED else turns.queues()
    states = []
    for duty in duties.duties_of_run(run):
        queue = duties.queue_of(duty)
        wait = lambda duty=duty, queue=queue: _waiting_for(run, duty, queue, live, waiting)  # noqa: E731
        beat = run.heartbeats.get(duty)
        node = beat.get("node") if beat else None
        if run.status in Run.FINISHED or (run.status == Run.Status.STOPPING and not _holds(beat)):
            # Nothing waits for a worker any more: for ~2 minutes after a Stop, a stopped run's
            # explorer said "handed over ... one has a free slot and takes it next" (#42, finding 4).
            how = "is stopping" if run.status == Run.Status.STOPPING else run.status
            states.append(DutyState(duty, queue, "ended", None, beat and beat.get("ended"), f"the run {how}"))
        elif run.status == Run.Status.STOPPING:
            states.append(DutyState(duty, queue, "stopping", node, beat.get("started") or beat.get("since"),
                                    f"{node or beat['worker']} ends its step, saves what a resume needs and "
                                    "lets it go"))
        elif beat is None:
            states.append(DutyState(duty, queue, "waiting", None, None, wait()))
        elif beat.get("ended") and run.status in Run.ACTIVE:  # let go, the run goes on: the watchdog sends it on
            why = beat.get("handed_back") or beat.get("broke") or "its task ended"
            states.append(DutyState(duty, queue, "handed over", None, beat["ended"],
                                    f"{node or beat['worker']} let it go ({why}); " + wait()))
        elif beat.get("ended"):
            states.append(DutyState(duty, queue, "ended", node, beat["ended"], f"{node or beat['worker']} let it go"))
        elif beat["worker"] == duties.HANDED_OVER:
            sent = beat.get("handovers", 1)
            why = beat.get("handed_back") or (  # a send nobody took counts too: say what it leads to
                f"its worker was lost (sent on {sent} time{'s' if sent != 1 else ''} with no step done; the run "
                f"fails after {settings.RFTWEB_MAX_HANDOVERS})")
            states.append(DutyState(duty, queue, "handed over", None, beat["at"],
                                    f"{why}; sent on, " + wait()))
        elif beat.get("hand_back") and duties.holder(run, duty, timeout) is not None:
            states.append(DutyState(duty, queue, "handing back", node, beat["hand_back"]["at"],
                                    f"{beat['hand_back']['by']} handed it back: it saves at its next step and goes "
                                    "back to its queue, keeping its place"))
        elif node in stopped_nodes and duties.holder(run, duty, timeout) is not None:
            # Shutting down in order, still beating: it saves at its step and lets the run go; it
            # said "lost" for the ~20 s that takes (#42, finding 8).
            states.append(DutyState(duty, queue, "handing back", node, beat["at"],
                                    f"its worker {node} is shutting down in order: the duty saves at its next "
                                    "step and is sent on to another worker"))
        elif duties.holder(run, duty, timeout) is None or node in stopped_nodes:
            age = duties.heartbeat_age(run, duty)
            why = "stopped" if node in stopped_nodes else f"fell silent {age:.0f} s ago"
            states.append(DutyState(duty, queue, "lost", node, beat["at"],
                                    f"its worker {node or beat['worker']} {why}: the watchdog sends it on "
                                    f"to another {queue} worker"))
        elif not beat.get("started"):
            loaded = beat.get("doing")  # its engine is built; a paused run's steps wait for Resume
            then = "its steps start once the run is resumed" if run.status == Run.Status.PAUSED else "its steps start"
            states.append(DutyState(duty, queue, "starting", node, beat.get("since"),
                                    f"{node or beat['worker']} " + (f"loaded the model; {then}" if loaded
                                                                    else "is loading the model")))
        elif run.status == Run.Status.PAUSED:  # it said "running · rolling out step 113" (walkthrough)
            states.append(DutyState(duty, queue, "paused", node, None,
                                    f"its steps wait for Resume · on {node or beat['worker']}"))
        else:
            went_on = beat.get("from_checkpoint")  # a restart said so only on the worker's console (#42, 6)
            since = (f", from checkpoint v{went_on['version']} (trainer step {went_on['step']})" if went_on
                     else "")
            if went_on and not went_on["step"]:  # restarted with no checkpoint left: no "v0 (step 0)"
                since = ", from the start (no checkpoint to go on from)"
            doing = _doing(beat, duties.heartbeat_age(run, duty))
            where = f"on {node or beat['worker']}{since}"
            states.append(DutyState(duty, queue, "running", node, beat["started"],
                                    f"{doing + ' · ' if doing else ''}{where}", beat.get("doing") or [], where))
    return states


def _doing(beat: dict, age: float) -> str:
    """What the duty's engine did at its last beat (workers.rft.activity), with how long for
    once that is long enough to matter: "rolling out step 12 · saving a checkpoint at step 11 (40 s)",
    and how old that is once the beat is late: a walkthrough saw "rolling out step 188" beside
    trainer step 233 on a loaded machine, and took the line for the present."""
    now, parts = time.time(), []
    for part in beat.get("doing") or ():
        took = now - part["since"]
        parts.append(part["what"] + (f" ({took:.0f} s)" if took >= DOING_LONG_S else ""))
    if parts and age > 1.5 * settings.RFTWEB_HEARTBEAT_INTERVAL:
        parts[-1] += f" (as of {age:.0f} s ago)"
    return " · ".join(parts)


DOING_LONG_S = 30  # a phase longer than this says how long (a step of the demo takes about a second)


def _holds(beat: dict | None) -> bool:
    """Whether a worker still holds the duty that beat (not let go, nor sent on)."""
    return bool(beat) and not beat.get("ended") and beat.get("worker") != duties.HANDED_OVER


def _waiting_for(run: Run, duty: str, queue: str, live: list[WorkerState], waiting: dict) -> str:
    serving = [worker for worker in live if queue in worker.queues]
    if not serving and (starting := _starting(queue)):
        return f"waiting for {_a(queue)} worker: {', '.join(starting)} is starting on this machine"
    if not serving:
        return (f"waiting for {_a(queue)} worker: none is live. Start one on a machine that reaches this "
                f"server's database and Redis: celery -A rftweb worker -Q {queue} (docs/scale.md)")
    drained = [worker.name for worker in serving if worker.drain]
    serving = [worker for worker in serving if not worker.drain]  # they take nothing (capacity.set_drain)
    if not serving:
        return (f"waiting for {_a(queue)} worker: every live one is drained ({', '.join(drained)}); a curator "
                "undrains one on its page, or start another (docs/scale.md)")
    if any(worker.free is None or worker.free > 0 for worker in serving):
        return f"waiting for {_a(queue)} worker: one has a free slot and takes it next"
    slots = sum(worker.slots or 0 for worker in serving)
    holders = [f"run {hold.run_id} {hold.run_name} ({hold.duty})" for worker in serving for hold in worker.holds]
    ahead = _ahead(run, duty, queue, waiting)
    line = f"; {ahead} dut{'y' if ahead == 1 else 'ies'} asked before it and go{'es' if ahead == 1 else ''} first" \
        if ahead else "; it is next"
    busy = {1: "its one slot is busy", 2: "both slots busy"}.get(slots, f"all {slots} slots busy")
    return f"waiting for {_a(queue)} worker — {busy}: {', '.join(holders)}{line}"


def _a(queue: str) -> str:
    return f"{'an' if queue[0] in 'aeiou' else 'a'} `{queue}`"


def _ahead(run: Run, duty: str, queue: str, waiting: dict) -> int:
    """Duties of its queue that get a free slot before this one (turns.py: who asked first)."""
    order = [(w.run_id, w.duty) for w in waiting.get(queue, [])]
    return order.index((run.pk, duty)) if (run.pk, duty) in order else len(order)


def shown_status(run: Run) -> str:
    """The status the runs list shows for a starting or running run (its database status says
    running once one duty runs): 'queued' while a duty has never been taken by a worker, 'waiting'
    while one was let go or lost and waits to be taken again (duty_states says why)."""
    if run.status not in (Run.Status.STARTING, Run.Status.RUNNING):
        return run.status
    beats = [run.heartbeats.get(duty) for duty in duties.duties_of_run(run)]
    if _trains_while_extra_explorers_wait(run):
        return run.status
    if any(beat is None for beat in beats):
        return "queued"
    if not all(_holds(beat) for beat in beats):  # one was let go or sent on: it waits to be taken again
        return "waiting"
    return run.status


def _trains_while_extra_explorers_wait(run: Run) -> bool:
    """With checkpoint sync explorers join as they come: a run whose other duties and at least one
    explorer are held trains, and its explorers never taken yet only add speed (a run at trainer step
    12 with 2 of 3 explorers read "queued"). With nccl the group needs them all."""
    if run.config.get("synchronizer", {}).get("method") != "checkpoint":
        return False
    beats = {duty: run.heartbeats.get(duty) for duty in duties.duties_of_run(run)}
    explorers = [duty for duty in beats if duties.is_explorer(duty)]
    return (any(_holds(beats[duty]) for duty in explorers)
            and all(_holds(beat) for duty, beat in beats.items() if not duties.is_explorer(duty))
            and all(_holds(beats[duty]) or beats[duty] is None for duty in explorers))


def duties_json(run: Run, live: list[WorkerState] | None = None) -> dict:
    """What the run page shows of the run's duties (and /api/runs/<id>/duties/ answers)."""
    states = duty_states(run, live)
    explorers = [state for state in states if duties.is_explorer(state.duty)]
    return {
        "status": run.status,
        "shown_status": shown_status(run),
        "explorers": len(explorers),
        "explorers_running": sum(state.state == "running" for state in explorers),
        "poll_s": settings.RFTWEB_HEARTBEAT_INTERVAL,
        "doing_long_s": DOING_LONG_S,
        "duties": [state.as_json() for state in states],
    }


def free_slots() -> dict | None:
    """{queue: {free, slots, workers}} over the live workers, for the launch form; None when
    embedded (no slot limit)."""
    if settings.RFTWEB_EMBEDDED:
        return None
    live = overview()["workers"]
    out = {}
    for queue in ("train", "explore"):
        serving = [worker for worker in live if queue in worker.queues]
        out[queue] = {"free": sum(worker.free or 0 for worker in serving),
                      "slots": sum(worker.slots or 0 for worker in serving), "workers": len(serving)}
    return out


def launch_warnings(config: dict, run_id: int | None = None) -> list[str]:
    """What a run of this (stored) config may not fit (config_fit.fit_warnings: memory, cores,
    GPUs), the feedback source runs with nothing for it yet (config_checks.source_run_warnings),
    and what it will wait for, given the live workers' free slots (none when embedded: its
    duties are threads of the server); the slots run `run_id` (just launched) took already count
    as free. A worker that takes both queues is counted for each."""
    try:
        parsed = stored_config(config)
    except ConfigError:  # a run stored under an older schema: nothing to estimate
        warnings = []
    else:
        warnings = config_fit.fit_warnings(parsed) + source_run_warnings(parsed)
    if settings.RFTWEB_EMBEDDED:
        return warnings
    live = overview()["workers"]
    for worker in live:
        worker.holds = [hold for hold in worker.holds if hold.run_id != run_id]
    method = config.get("synchronizer", {}).get("method", "memory")
    needed: dict[str, int] = {}
    for duty in duties.duties_of(config):
        needed[duties.queue_of(duty)] = needed.get(duties.queue_of(duty), 0) + 1
    for queue, count in needed.items():
        serving = [worker for worker in live if queue in worker.queues]
        free = sum(worker.free for worker in serving if worker.free is not None)
        if any(worker.free is None for worker in serving) or free >= count:
            continue
        add = (f"Add capacity: start `celery -A rftweb worker -Q {queue}` on a machine that reaches this "
               "server's database and Redis (docs/scale.md).")
        if not serving:
            warnings.append(f"No live worker takes the `{queue}` queue: this run's {_duty_list(config, queue)} "
                            f"wait{'s' if count == 1 else ''} until one starts. {add}")
        elif queue == "explore" and method == "nccl":
            warnings.append(f"synchronizer.method nccl sends the weights to all {count} explorers at once, and "
                            f"{free} `explore` slot(s) are free: the trainer waits for the rest and fails after "
                            f"synchronizer.timeout_s. Use checkpoint sync, fewer explorers, or add capacity. {add}")
        elif queue == "explore":
            starts = (f"the run starts with {free}, and the others start as slots free up" if free
                      else "the run starts when one frees up, and the others as more do")
            warnings.append(f"{count} explorers and {free} free `explore` slot(s): {starts}. {add}")
        else:
            busy = ", ".join(f"run {hold.run_id} {hold.run_name} ({hold.duty})"
                             for worker in serving for hold in worker.holds)
            warnings.append(f"This run needs {count} `{queue}` slot(s) and {free} are free (busy: {busy}): "
                            f"its {_duty_list(config, queue)} wait{'s' if count - free == 1 else ''} for one. {add}")
    return warnings


def _duty_list(config: dict, queue: str) -> str:
    return ", ".join(duty for duty in duties.duties_of(config) if duties.queue_of(duty) == queue)
