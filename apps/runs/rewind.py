"""Taking a run back to where its trainer goes on from: a resumed or handed-over run's trainer
loads its newest checkpoint (or the starting model, without one) and replays the steps after it.
The worker does so as it starts the run (supervision.serve, through DjangoMetricSink.rewind), and
a Resume as soon as it is accepted (services.resume_run): until the run started, its page and the
API's answer to the Resume said the old counters (a curator deleted the checkpoints of a run at
trainer step 5: "trainer 5 · explorer 6 · model v5" for a run about to start again from step 0)."""

import json

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, Value
from django.db.models.functions import Least
from django.http import Http404

from . import summaries
from .checkpoints import run_checkpoint_dir, run_dir
from .duties import duties_of
from .live import broadcast
from .models import MetricPoint, Run


def rewind(run: Run, trainer_step: int, model_version: int, explorer_step: int | None = None) -> None:
    """The run's trainer goes on from its checkpoint's `trainer_step` and `model_version` (0, 0
    without one): the steps it had trained past them were lost with their worker (a hand-over
    or a resume) and are replayed. The run's step and version go back to the checkpoint's, and
    the lost steps' trainer points go (no model of the run holds their updates; the replay
    records each step again); with `explorer_step` (a single loop: its explorer goes back too
    and evaluates the replayed steps again), the run's explorer step goes back to it and the
    eval points after it go too. Explorer points stay: those steps' rollouts are stored and
    replayed as they are (DjangoMetricSink.replayed moves the explorer step on again). Kept, a
    run stopped at replayed step 70 said "stopped at trainer step 92, checkpoint v70", and its
    open page drew the replayed points inside a line that ended at step 92 until the replay got
    past it; one whose checkpoints a curator had deleted said "explorer 25 · model v5" at
    trainer step 0. Never forward: a second rewind to the same place changes and says nothing."""
    lost = Q(role=MetricPoint.Role.TRAINER, step__gt=trainer_step)
    back = {"trainer_step": trainer_step, "model_version": model_version}
    if explorer_step is not None:
        lost |= Q(role=MetricPoint.Role.EVAL, step__gt=explorer_step)
        back["explorer_step"] = explorer_step
    with transaction.atomic():
        deleted = summaries.forget(run.metrics.filter(lost))  # and out of the run's summaries
        ahead = Q()
        for field, value in back.items():
            ahead |= Q(**{f"{field}__gt": value})
        moved = Run.objects.filter(ahead, pk=run.pk).update(
            **{field: Least(field, Value(value)) for field, value in back.items()})
        if deleted or moved:  # the open pages start again from the snapshot (live.js)
            broadcast(run.pk, {"type": "rewind", **back})


def resume_counters(run: Run, checkpoint) -> dict | None:
    """rewind's arguments for a run whose trainer goes on from `checkpoint` (None: from step 0),
    as its worker will rewind it when it starts (supervision.serve); None for a run without a
    trainer (mode explore or bench), which its worker does not take back. The explorer step goes
    back only with a single loop's explorer (mode both, memory or nccl sync: the trainer's
    process), to the one the checkpoint recorded (Loop.save: trainer_state.json's extra); split
    explorers (checkpoint sync) go on after the stored steps. A checkpoint whose file cannot be
    read leaves the explorer step to the worker, which then fails to load it and says why."""
    config = run.config or {}
    mode = config.get("mode", "both")
    if mode not in ("both", "train"):
        return None
    counters = {"trainer_step": checkpoint.step if checkpoint else 0,
                "model_version": checkpoint.version if checkpoint else 0, "explorer_step": None}
    if mode == "both" and "loop" in duties_of(config):
        counters["explorer_step"] = explorer_step_of(run, checkpoint) if checkpoint else 0
    return counters


def explorer_step_of(run: Run, checkpoint) -> int | None:
    """The explorer step the checkpoint recorded (Trainer.save_checkpoint's trainer_state.json), or None."""
    try:
        state = json.loads((run_checkpoint_dir(checkpoint, run_dir(run)) / "trainer_state.json").read_text())
        step = state["extra"]["explorer_step"]
    except (OSError, ValueError, KeyError, TypeError, PermissionDenied, Http404):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
