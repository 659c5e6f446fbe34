"""Review (issue #44, item 4; Label Studio's review stream): on a run whose config sets
`feedback.require_review`, a rating, an edit or a comparison waits, `pending`, until a reviewer (the
reviewer role, or a curator) accepts it, and only then reaches training, as it would have at once
without review: a rating counts in the `human` reward, an edit becomes a `human_edit` row, a
comparison becomes a DPO pair. A rejected one never does. Flags act at once (they only keep a row
out of training). Nobody reviews their own judgement; judging again sends it back to review.
A decision can be changed while what it let through is untrained, by the reviewer who made it
(a judgement has one reviewer: `Feedback.reviewer`); review_history.py lists the decisions."""
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from apps.accounts.roles import CURATOR, REVIEWER, has_role
from apps.buffer.models import Experience
from apps.core.bidi import isolate

from . import edit_rows, history, services
from .models import Feedback

Review = Feedback.Review
DECIDED = (Review.ACCEPTED, Review.REJECTED)


class ReviewError(services.FeedbackError):
    pass


def may_review(user) -> bool:
    return has_role(user, REVIEWER)


def may_take_over(feedback: Feedback, user) -> bool:
    """A curator takes over the decision of a reviewer who has left (account deactivated, or no
    reviewer role any more): it stays one reviewer's, and without this no one could change it
    (a wrong acceptance not yet trained could only be withdrawn in the admin)."""
    left = feedback.reviewer
    return (has_role(user, CURATOR) and left is not None and left.pk != user.pk
            and (not left.is_active or not may_review(left)))


def pending(run):
    return Feedback.objects.filter(experience__run=run, review=Review.PENDING)


def waiting_runs(reviewer) -> list[dict]:
    """[{run id, name, waiting, own}] of the runs with judgements waiting for review, those the
    reviewer may take first, most first: `waiting` counts only others' judgements (nobody reviews
    their own: a curator's list showed 4 waiting, all theirs, and Review led to nothing), `own`
    the reviewer's, which wait for another reviewer."""
    rows = (Feedback.objects.filter(review=Review.PENDING).values("experience__run", "experience__run__name")
            .annotate(waiting=Count("pk", filter=~Q(user=reviewer)), own=Count("pk", filter=Q(user=reviewer))))
    found = [{"run": row["experience__run"], "name": row["experience__run__name"], "waiting": row["waiting"],
              "own": row["own"]} for row in rows if row["experience__run"] is not None]
    return sorted(found, key=lambda row: (-row["waiting"], -row["own"], row["run"]))


def next_for(run, reviewer) -> Feedback | None:
    """The oldest judgement of the run waiting for review that is not the reviewer's own."""
    return (pending(run).exclude(user=reviewer).select_related("user", "experience__task", "other")
            .order_by("updated_at", "pk").first())


def seen(feedback: Feedback) -> str:
    """What a review page showed of a judgement: its review and when its annotator judged it. The
    page posts it back, and decide refuses if either moved since: two reviewers on one judgement
    (the later one silently replaced the other's decision and note), or an annotator judging it
    again while the page was open (the decision would be on what the reviewer never saw)."""
    return f"{feedback.review} {feedback.updated_at.isoformat()}"


@transaction.atomic
def decide(feedback_id: int, reviewer, *, accept: bool, note: str = "", seen_as: str | None = None) -> Feedback:
    """Accept or reject the judgement. seen_as: seen() as the reviewer's page showed it (None: the
    caller means whatever it is now)."""
    if not may_review(reviewer):
        raise ReviewError("reviewing needs the reviewer role (curators have it)")
    note = services.checked_comment(note)
    found = Feedback.objects.filter(pk=feedback_id).values_list("experience_id", flat=True).first()
    if found is None:
        raise ReviewError(f"no judgement {feedback_id}: its annotator may have undone it")
    experience = Experience.objects.select_for_update().get(pk=found)  # as every judgement locks it
    feedback = Feedback.objects.select_for_update().select_related("user").get(pk=feedback_id)
    if feedback.review == Review.NONE:
        raise ReviewError("this judgement was made with no review asked: it reached training at once")
    if feedback.user_id == reviewer.pk:
        raise ReviewError("a judgement is reviewed by someone else than its annotator")
    if seen_as is not None and seen_as != seen(feedback):
        raise ReviewError(_moved_since(feedback, reviewer))
    if (feedback.review in DECIDED and feedback.reviewer_id not in (None, reviewer.pk)
            and not may_take_over(feedback, reviewer)):
        # A judgement keeps one reviewer (Feedback.reviewer): another's decision is theirs to change.
        raise ReviewError(f"{isolate(feedback.reviewer)} {feedback.review} this {feedback.get_kind_display().lower()}: "
                          "only they change their decision")
    withdrawn = feedback.review == Review.ACCEPTED and not accept
    if withdrawn and (step := history.trained_on(feedback)) is not None:
        raise ReviewError(f"accepted and trained on at step {step}: it can no longer be rejected")
    feedback.review = Review.ACCEPTED if accept else Review.REJECTED
    feedback.reviewer, feedback.reviewed_at, feedback.review_note = reviewer, timezone.now(), note
    # Not updated_at: that is when the annotator judged (history and trained_on read it).
    feedback.save(update_fields=["review", "reviewer", "reviewed_at", "review_note"])
    # What it lets through, or takes back: a rating counts in the human reward once accepted; an
    # edit is a human_edit row; a comparison is its row, read by the trainer's pair sampling
    # (buffer.store.sample_pairs) once accepted.
    if feedback.kind == Feedback.Kind.RATING:
        services.set_human_reward(experience)
    elif feedback.kind == Feedback.Kind.EDIT and accept:
        edit_rows.store_human_edit(experience, feedback.user, feedback.edited_text)
    elif feedback.kind == Feedback.Kind.EDIT and withdrawn and (row := history.edit_row(feedback)) is not None:
        row.delete()
    return feedback


def change(feedback_id: int, reviewer, *, accept: bool, note: str = "", seen_as: str | None = None) -> Feedback:
    """The reviewer turns their own decision round (the history page's Change): accepted to
    rejected while no trainer step has used the judgement (decide refuses then, naming the step),
    rejected to accepted at any time (a rejected judgement never trained)."""
    feedback = Feedback.objects.select_related("reviewer").filter(pk=feedback_id).first()
    if feedback is None:
        raise ReviewError(f"no judgement {feedback_id}: its annotator may have undone it")
    theirs = feedback.reviewer_id == reviewer.pk or may_take_over(feedback, reviewer)
    if feedback.review not in DECIDED or not theirs:
        whose = (f": {isolate(feedback.reviewer)} decided it, and only they change it"
                 if feedback.review in DECIDED and feedback.reviewer else "")
        raise ReviewError(f"judgement {feedback_id} has no decision of yours to change{whose}"
                          + (": its annotator judged it again, and it waits for review" if
                             feedback.review == Review.PENDING else ""))
    if (feedback.review == Review.ACCEPTED) == accept:
        who = "you" if feedback.reviewer_id == reviewer.pk else isolate(feedback.reviewer)
        raise ReviewError(f"{who} {feedback.review} judgement {feedback_id} already; nothing changed")
    return decide(feedback_id, reviewer, accept=accept, note=note, seen_as=seen_as)


def _moved_since(feedback: Feedback, reviewer) -> str:
    if feedback.review in (Review.ACCEPTED, Review.REJECTED):
        kind = feedback.get_kind_display().lower()
        if feedback.reviewer_id == reviewer.pk:  # another tab of theirs, or a second click
            said = f" (your note: {feedback.review_note!r})" if feedback.review_note else ""
            return f"you {feedback.review} this {kind} since this page showed it (another tab?){said}; nothing changed"
        said = f" (their note: {feedback.review_note!r})" if feedback.review_note else ""
        who = isolate(feedback.reviewer)
        return f"{who} {feedback.review} this {kind} while you looked at it{said}; nothing changed"
    return "its annotator judged it again while you looked at it; nothing changed: review what they judged now"
