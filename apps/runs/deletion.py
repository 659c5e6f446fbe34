"""Deleting runs and checkpoints (the admin's Delete): only those of ended runs (a running trainer
may resume from any checkpoint of its run at a hand-over), runs that no other run still reads, their
rows in SQL chunks, and their directories with them.

Django's own delete let a curator delete a running run: its worker failed on its next write
(IntegrityError, then Run.DoesNotExist), and the embedded server waited 60 s at shutdown for a
run that no longer trained. It also loaded every experience of the run first (8.5 s for the
confirmation page of 11,624, 17.5 s for the delete, on SQLite) and left the run's 79 MB of
checkpoints on disk. Deleting a checkpoint said nothing of what it meant: a researcher's Resume
then started the run over from step 0, its page still saying "explorer 25 · model v5"."""
import logging
import shutil
from pathlib import Path

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, Q, TextField
from django.db.models.functions import Cast
from django.http import Http404

from apps.buffer.models import Experience
from apps.buffer.services import delete_experiences
from apps.feedback.models import Feedback

from . import services
from .checkpoints import resume_point, run_checkpoint_dir, run_dir
from .live import checkpoints_update
from .models import Checkpoint, Run

logger = logging.getLogger(__name__)


def refusals(runs) -> list[str]:
    """Why each of `runs` may not be deleted: it has not ended, or a run that may still train
    (any but a completed one) trains on its human edits (feedback.source_runs) or loads a model from
    its directory (loaders)."""
    ids = {run.pk for run in runs}
    reasons = [f"run {run.pk} '{run.name}' is {run.status}: stop it first" for run in runs
               if run.status not in Run.FINISHED]
    readers = Run.objects.exclude(status=Run.Status.COMPLETED).exclude(pk__in=ids).filter(
        config__feedback__source_runs__isnull=False).only("pk", "name", "config")
    for reader in readers:
        for source in set(ids) & set((reader.config.get("feedback") or {}).get("source_runs") or []):
            reasons.append(f"run {reader.pk} '{reader.name}' trains on the human edits of run {source} "
                           "(feedback.source_runs)")
    reasons += loaders([(run_dir(run).resolve(), f"run {run.pk}'s directory") for run in runs], exclude=ids)
    return reasons


def loaders(targets: list[tuple[Path, str]], exclude=()) -> list[str]:
    """A refusal per run that may still load a model from inside one of the `targets`' directories
    (a run's or a checkpoint's; `what` names it) and is not in `exclude`: any but a completed run, as
    for a saved model (saved_models.services.STILL_LOADS), since a stopped or failed one loads its
    models again when resumed. Any key counts (model.path, ref_path, critic_path, a reward fn's
    model): a launch stores each resolved, so the directories are too. Narrowed in the database by
    the directories' names (ASCII: a run's folder or step_N, the same text in either database's
    JSON), in one query however many are deleted, then checked value by value. Kept, a run whose
    model.path was another run's checkpoint failed on Resume once that run was deleted: "no model
    directory at runs/2-.../checkpoints/step_6"."""
    if not targets:
        return []
    named = Q()
    for directory, _ in targets:
        named |= Q(text__contains=f"/{directory.name}")
    candidates = list(Run.objects.exclude(status=Run.Status.COMPLETED).exclude(pk__in=exclude)
                      .annotate(text=Cast("config", TextField())).filter(named)
                      .only("pk", "name", "status", "config").order_by("pk"))
    reasons = []
    for directory, what in targets:
        inside = f"{directory}/"
        for reader in candidates:
            keys = [key for key, value in _strings(reader.config)
                    if value == str(directory) or value.startswith(inside)]
            if keys:
                reasons.append(f"run {reader.pk} '{reader.name}' ({reader.status}) loads its {', '.join(keys)} "
                               f"from {what}, and would again when resumed")
    return reasons


def _strings(value, key=""):
    """(dotted key, string) for every string in a config, at any depth (a list's items by index)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for name, item in items:
            yield from _strings(item, f"{key}.{name}" if key else str(name))


def summary(runs) -> tuple[list[str], dict[str, str]]:
    """(a line per run, counts by kind) for the confirmation page: counts, not a line per row."""
    ids = [run.pk for run in runs]
    rows = dict(Experience.objects.filter(run__in=ids).values_list("run").annotate(n=Count("pk")).order_by())
    edits = Experience.objects.filter(run__in=ids, source=Experience.Source.HUMAN_EDIT).count()
    judgements = Feedback.objects.filter(Q(experience__run__in=ids) | Q(other__run__in=ids)).count()
    lines = [f"Run {run.pk} '{run.name}' ({run.status}): {rows.get(run.pk, 0):,} experiences, its metrics, "
             "checkpoints and directory" for run in runs]
    counts = {"runs": len(ids), "experiences": sum(rows.values()), "human edits among them": edits,
              "judgements on them": judgements}
    return lines, {kind: f"{n:,}" for kind, n in counts.items()}  # Django's page shows them as they are


def delete_runs(runs) -> int:
    """Delete ended runs, all or none (ValueError naming the refusals), then their directories."""
    runs = list(runs)
    if reasons := refusals(runs):
        raise ValueError("; ".join(reasons))
    directories = [run_dir(run) for run in runs]
    with transaction.atomic():
        # What a crashed trainer of theirs still held of other runs' rows (source runs' edits).
        Experience.objects.filter(claimed_by__in=[run.pk for run in runs]).update(claimed_at=None, claimed_by=None)
        delete_experiences(Experience.objects.filter(run__in=runs))  # in chunks, no row loaded
        Run.objects.filter(pk__in=[run.pk for run in runs]).delete()  # metrics and their summaries, checkpoints, steps
        transaction.on_commit(lambda: [_remove(directory) for directory in directories])
    return len(runs)


def _remove(directory) -> None:
    try:
        shutil.rmtree(directory, ignore_errors=False)
    except FileNotFoundError:
        pass
    except OSError as exc:  # the rows are gone; the files are the server's to clean up
        logger.error("the directory of a deleted run or checkpoint was not removed: %s (%r)", directory, exc)


# -- checkpoints --

def checkpoint_refusals(checkpoints) -> list[str]:
    """Why `checkpoints` may not be deleted: a run that has not ended may be using one (its trainer
    goes on from its newest at a hand-over or a restart, a paused one holds its step), or another
    run loads a model from one (loaders)."""
    runs = {checkpoint.run_id: checkpoint.run for checkpoint in checkpoints}
    reasons = [f"run {run.pk} '{run.name}' is {run.status}: its trainer may go on from its checkpoints at any "
               "moment (a hand-over, a restart); stop it first"
               for run in runs.values() if run.status not in Run.FINISHED]
    reasons += loaders([(directory, f"checkpoint {_named(checkpoint)} of run {checkpoint.run_id}")
                        for checkpoint in checkpoints if (directory := _directory(checkpoint)[0])])
    return reasons


def _named(checkpoint) -> str:
    return f"v{checkpoint.version} (step {checkpoint.step})" if checkpoint else "the start (step 0)"


def checkpoint_summary(checkpoints) -> list[str]:
    """For the confirmation page: per run, the checkpoint Resume would go on from once these are
    gone (resume_point), then each checkpoint with its directory."""
    checkpoints = list(checkpoints)
    by_run = {}
    for checkpoint in checkpoints:
        by_run.setdefault(checkpoint.run_id, (checkpoint.run, []))[1].append(checkpoint)
    lines = []
    for run, doomed in by_run.values():
        newest, then = resume_point(run), resume_point(run, without=doomed)
        who = f"Run {run.pk} '{run.name}' ({run.status})"
        if run.status == Run.Status.COMPLETED or run.buffer_retired_at is not None:  # never resumed
            why = ("is not resumed again" if run.status == Run.Status.COMPLETED
                   else "cannot be resumed (its buffer was retired)")
            if then == newest:
                lines.append(f"{who} {why}; its newest checkpoint (its trained model) {_named(newest)} stays")
            elif then:
                lines.append(f"{who} {why}; its newest checkpoint (its trained model) becomes {_named(then)}, not "
                             f"{_named(newest)}")
            else:
                lines.append(f"{who} {why}; no checkpoint of it is left: {_named(newest)}, its trained model, goes too")
        elif then == newest:
            lines.append(f"{who} still resumes from {_named(newest)}")
        else:
            lines.append(f"{who} would resume from {_named(then)}, not {_named(newest)}: its counters, charts "
                         "and trainer steps after it go back there")
    for checkpoint in checkpoints:
        directory, why = _directory(checkpoint)
        files = f"its directory {directory} is deleted with it" if directory else f"its directory {why}"
        lines.append(f"Checkpoint {_named(checkpoint)} of run {checkpoint.run_id}: {files}")
    return lines


def _directory(checkpoint):
    """(the checkpoint's directory to delete, None) or (None, why none is)."""
    try:
        return run_checkpoint_dir(checkpoint, run_dir(checkpoint.run)), ""
    except Http404:
        return None, f"{checkpoint.path} is gone already"
    except PermissionDenied as exc:  # the path is a row, not a place any file may be deleted from
        return None, f"{checkpoint.path} stays: {exc}"


def delete_checkpoints(checkpoints) -> int:
    """Delete checkpoints of ended runs, all or none (ValueError naming the refusals), then their
    directories, as a run's deletion takes its own (only one inside its run's checkpoints:
    _directory)."""
    checkpoints = list(checkpoints)
    if reasons := checkpoint_refusals(checkpoints):
        raise ValueError("; ".join(reasons))
    directories = [directory for directory, _ in map(_directory, checkpoints) if directory]
    with transaction.atomic():
        Checkpoint.objects.filter(pk__in=[checkpoint.pk for checkpoint in checkpoints]).delete()
        for run_id in {checkpoint.run_id for checkpoint in checkpoints}:
            services.broadcast(run_id, checkpoints_update(run_id))  # the run page's table
        transaction.on_commit(lambda: [_remove(directory) for directory in directories])
    return len(checkpoints)
