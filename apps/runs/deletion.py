"""Deleting runs (the admin's Delete): only ended runs that no other run still reads, their rows in
SQL chunks, and their directories with them.

Django's own delete let a curator delete a running run: its worker failed on its next write
(IntegrityError, then Run.DoesNotExist), and the embedded server waited 60 s at shutdown for a
run that no longer trained. It also loaded every experience of the run first (8.5 s for the
confirmation page of 11,624, 17.5 s for the delete, on SQLite) and left the run's 79 MB of
checkpoints on disk."""
import logging
import shutil

from django.db import transaction
from django.db.models import Count, Q

from apps.buffer.models import Experience
from apps.buffer.services import delete_experiences
from apps.feedback.models import Feedback

from .models import Run
from .supervision import run_dir

logger = logging.getLogger(__name__)


def refusals(runs) -> list[str]:
    """Why each of `runs` may not be deleted: it has not ended, or a run that may still train
    (any but a completed one) trains on its human edits (feedback.source_runs)."""
    ids = {run.pk for run in runs}
    reasons = [f"run {run.pk} '{run.name}' is {run.status}: stop it first" for run in runs
               if run.status not in Run.FINISHED]
    readers = Run.objects.exclude(status=Run.Status.COMPLETED).exclude(pk__in=ids).filter(
        config__feedback__source_runs__isnull=False).only("pk", "name", "config")
    for reader in readers:
        for source in set(ids) & set((reader.config.get("feedback") or {}).get("source_runs") or []):
            reasons.append(f"run {reader.pk} '{reader.name}' trains on the human edits of run {source} "
                           "(feedback.source_runs)")
    return reasons


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
        logger.error("the directory of a deleted run was not removed: %s (%r)", directory, exc)
