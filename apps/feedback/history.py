"""What an annotator has judged: their history, whether training has used a judgement, and undo.

When a judgement has been trained on (how the trainer consumes each kind, apps/buffer/store.py):

- a rating: its rollout's `human` reward component is read when a trainer step samples the row;
  the row is then consumed (`consumed_at`) and not sampled again (unless a resume rewinds it).
  So a rating was trained on when its rollout was claimed or consumed after the rating was saved.
- an edit: its `human_edit` row is expert data, sampled again and again (least used first); it
  was trained on once a step used it (`use_count`) or holds it now (`claimed_at`).
- a comparison: DPO steps of this run, or of runs that name it in `feedback.source_runs`, read the
  pairs as they are when they sample; a pair was trained on when such a step ran after it was saved
  (a step's metrics count its `pairs`; which pair a step took is not recorded).
- a flag trains nothing: it keeps its row out of training. Undoing it puts back the status the
  flag found (`Feedback.status_before`), not a guess: a row a curator had rejected stays rejected.

The undo window. Undo is the annotator's own, for any of their judgements on a run they may still
annotate. What training already did cannot be taken back: while the run trains, undo removes the
judgement from future training (the edit's row stops being sampled, the rating leaves the reward,
the pair is no longer sampled) and says at which step it was already trained on. Once the run has
finished, a judgement it trained on is the record of what the model learned from: undo refuses
(the run's exports and statistics must keep saying what it trained on). A judgement never trained
on can always be undone.
"""
from dataclasses import dataclass

from django.db import transaction

from apps.buffer.models import Experience
from apps.runs.models import MetricPoint, Run

from . import queue, services
from .models import AnnotationLock, Feedback

Status = Experience.Status
HISTORY_ITEMS = 20  # the panel shows the newest judgements; older ones are in the run's export


class NothingToUndo(services.FeedbackError):
    """No such judgement of the user's (another's reads the same: ids are not to be probed)."""


class TooLateToUndo(services.FeedbackError):
    """The judgement is part of what a finished run trained on."""


@dataclass
class Undone:
    experience: Experience  # the item the annotator judged (for a comparison: the one shown as A)
    trained_on_step: int | None  # the trainer step that already trained on the judgement, if any
    message: str  # what the page says
    reopened: bool  # the item is locked for the annotator again, to be judged afresh


def describe(feedback: Feedback) -> str:
    """The judgement in a few words, as the history panel lists it."""
    if feedback.kind == Feedback.Kind.RATING:
        return f"rated {feedback.label}"
    if feedback.kind == Feedback.Kind.EDIT:
        return "edited"
    if feedback.kind == Feedback.Kind.PREFERENCE:
        return f"compared: {services.VERDICTS.get(feedback.label, feedback.label)}"
    return f"flagged as {services.FLAG_REASONS.get(feedback.label, feedback.label).lower()}"


def shown_item_id(feedback: Feedback) -> int:
    """The item the annotator was shown: a comparison is stored with the preferred response first,
    so "B is better" has A as `other`."""
    if feedback.kind == Feedback.Kind.PREFERENCE and feedback.label == "b_better":
        return feedback.other_id
    return feedback.experience_id


def _step_at(run_ids, when) -> int | None:
    """The first trainer step of these runs recorded at or after `when` (a step writes its metrics
    when it ends, so this is the step that was running then)."""
    return (
        MetricPoint.objects.filter(run_id__in=run_ids, role="trainer", time__gte=when)
        .order_by("time").values_list("step", flat=True).first()
    )


def _in_progress_step(run: Run) -> int:
    return run.trainer_step + 1


def trained_on(feedback: Feedback, pair_readers: list[int] | None = None) -> int | None:
    """The trainer step that trained on the judgement (or is training on it now); None if none has.
    `pair_readers`: _pair_readers of the judgement's run, where the caller has them already."""
    experience, run = feedback.experience, feedback.experience.run
    if run is None or feedback.kind == Feedback.Kind.FLAG or feedback.review not in Feedback.TRAINED:
        return None
    saved = max(feedback.updated_at, feedback.reviewed_at or feedback.updated_at)  # accepted: from then
    if feedback.kind == Feedback.Kind.RATING:
        if not ratings_train(run):
            return None  # the row may be trained on, the rating changed nothing of it (#42, finding 8)
        if experience.consumed_at is not None and experience.consumed_at >= saved:
            return _step_at([run.pk], experience.consumed_at) or run.trainer_step
        if experience.claimed_at is not None and experience.claimed_at >= saved:
            return _in_progress_step(run)
        return None
    if feedback.kind == Feedback.Kind.EDIT:
        row = edit_row(feedback)
        if row is None or (row.use_count == 0 and row.claimed_at is None):
            return None
        return _step_at([run.pk], saved) or _in_progress_step(run)
    if feedback.value != 1.0:
        return None  # a tie or "both bad" is no pair: nothing trains on it
    return (
        MetricPoint.objects.filter(
            run__in=pair_readers or _pair_readers(run), role="trainer", time__gte=saved, values__pairs__gt=0
        ).order_by("time").values_list("step", flat=True).first()
    )


def ratings_train(run: Run) -> bool:
    """Whether the run's training reads ratings: as rewards (feedback.reward_mode weight or
    override) or as what it may sample (feedback.rated_only); with neither, a rating is a record
    (agreement, export) and changes nothing the trainer does (apps/buffer/store._apply_feedback)."""
    feedback = run.config.get("feedback") or {}
    return feedback.get("reward_mode", "none") != "none" or bool(feedback.get("rated_only"))


def _pair_readers(run: Run) -> list[int]:
    """The runs whose DPO steps read the run's pairs: itself, and those naming it in their
    `feedback.source_runs`. Matched here, not in SQL: SQLite, the embedded mode's database, has
    no JSON containment (`source_runs__contains` raised NotSupportedError there and failed every
    annotation call after one comparison, issue #42), and few runs name source runs."""
    named = Run.objects.filter(config__feedback__source_runs__isnull=False).values_list(
        "pk", "config__feedback__source_runs"
    )
    return [run.pk, *(pk for pk, sources in named if isinstance(sources, list) and run.pk in sources)]


def edit_row(feedback: Feedback) -> Experience | None:
    return feedback.experience.children.filter(
        source=Experience.Source.HUMAN_EDIT, metadata__edited_by=feedback.user.username
    ).first()


def history(run, user, limit: int = HISTORY_ITEMS) -> list[dict]:
    """The user's newest judgements on the run, for the history panel."""
    rows = list(
        Feedback.objects.filter(user=user, experience__run=run)
        .select_related("experience__run", "user").order_by("-updated_at", "-pk")[:limit]
    )
    # Read once for all the panel's comparisons: with 1,000 runs naming source runs (SQLite), a
    # panel of 20 comparisons took 212 ms reading them for each, 37 ms reading them once.
    readers = _pair_readers(run) if any(f.kind == Feedback.Kind.PREFERENCE for f in rows) else None
    return [
        {"id": f.pk, "item": shown_item_id(f), "kind": f.kind, "summary": describe(f),
         "at": f.updated_at.isoformat(), "trained_on_step": trained_on(f, readers)}
        for f in rows
    ]


def session_count(run, user, since) -> int:
    """How many items of the run the user has judged since `since` (the start of their session)."""
    return Feedback.objects.filter(user=user, experience__run=run, created_at__gte=since).count()


def _revert(feedback: Feedback, experience: Experience, trained: bool) -> None:
    """Take the judgement's effect out of the buffer, for what training does from now on."""
    # Any judgement: undo makes the item's human reward again once it is deleted (set_human_reward:
    # a place of the item is free again, and a rating may be gone).
    if feedback.kind == Feedback.Kind.EDIT:
        row = edit_row(feedback)
        if row is not None and not trained:
            row.delete()
        elif row is not None:
            # Trained on: the row stays as the record of what trained, but is never sampled again
            # (a step holding it now keeps it rejected when it marks it used: store.mark_used).
            Experience.objects.filter(pk=row.pk).update(status=Status.REJECTED)
    elif feedback.kind == Feedback.Kind.FLAG and feedback.status_before:
        _restore_status(feedback, experience)
    # A comparison is only its row: deleting it takes the pair out of every later DPO sample.


def _restore_status(flag: Feedback, experience: Experience) -> None:
    """Put back the status the flag found, as the flag was the one that rejected the row. While
    another annotator's flag stays, the row stays rejected and that flag keeps the status to
    restore; a status someone set since (the row is no longer rejected) is theirs and stays."""
    others = experience.feedback.filter(kind=Feedback.Kind.FLAG).exclude(pk=flag.pk)
    if others.exists():
        others.filter(status_before="").update(status_before=flag.status_before)
        return
    if experience.status != Status.REJECTED:
        return
    status = flag.status_before
    if status == Status.READY and experience.consumed_at is not None and experience.consumed_at >= flag.created_at:
        # A trainer step held the row when it was flagged and trained on it (store.mark_used
        # leaves a rejected row rejected, with its time): it is consumed, not to be trained on again.
        status = Status.CONSUMED
    experience.status = status
    experience.save(update_fields=["status"])


def status_decided(experiences) -> int:
    """Someone set these experiences' status by hand (a curator, in the buffer admin): that is the
    state to keep, so undoing a flag made before no longer restores the status the flag found.
    `experiences`: a queryset of them, or their ids. Returns how many flags forgot theirs."""
    flags = Feedback.objects.filter(kind=Feedback.Kind.FLAG, experience__in=experiences).exclude(status_before="")
    return flags.update(status_before="")


@transaction.atomic
def undo(feedback_id: int, user) -> Undone:
    """Undo one of the user's judgements (see the module's note for the window), and put the item
    back in front of their queue (locked for them again) when it can still be judged."""
    feedback = Feedback.objects.select_related("user").filter(pk=feedback_id, user=user).first()
    if feedback is None:
        raise NothingToUndo(f"you have no judgement {feedback_id} to undo: it was undone already, or is not yours")
    shown_id = shown_item_id(feedback)
    # The judged rows are locked in id order, as compare() locks them (no deadlock with it).
    ids = sorted({feedback.experience_id, *([feedback.other_id] if feedback.other_id else [])})
    locked = {pk: services._locked_row(pk, user) for pk in ids}
    feedback = Feedback.objects.select_related("experience__run", "user").get(pk=feedback.pk)
    experience, run = locked[feedback.experience_id], locked[feedback.experience_id].run
    step = trained_on(feedback)
    if step is not None and run is not None and run.is_finished:
        raise TooLateToUndo(
            f"your judgement of experience {shown_id} ({describe(feedback)}) was trained on at step {step} and the "
            f"run has {run.status}: it stays, as the record of what the run learned from"
        )
    _revert(feedback, experience, trained=step is not None)
    feedback.delete()
    for judged in locked.values():  # from the other annotators' ratings, if the item still has its number
        services.set_human_reward(judged)
    shown = locked[shown_id]
    reopened = services.refusal(shown, user) is None
    if reopened:
        queue._take(shown, user)
    else:
        AnnotationLock.objects.filter(experience=shown, user=user).delete()
    message = f"Undid your judgement of experience {shown_id} ({describe(feedback)})."
    if feedback.kind == Feedback.Kind.FLAG and experience.status == Status.REJECTED:
        message += " It stays out of training: " + (
            "another annotator flagged it too." if experience.feedback.filter(kind=Feedback.Kind.FLAG).exists()
            else "it was rejected before your flag, or since."
        )
    if step is not None:
        message += f" It was already trained on at step {step}: undo removes it from future training only."
    return Undone(experience=shown, trained_on_step=step, message=message, reopened=reopened)


def undo_last(run, user) -> Undone:
    """Undo the user's newest judgement on the run."""
    last = Feedback.objects.filter(user=user, experience__run=run).order_by("-updated_at", "-pk").first()
    if last is None:
        raise NothingToUndo("you have no judgement on this run to undo")
    return undo(last.pk, user)
