"""The decisions reviewers made on a run (Label Studio's reviewed list): who accepted or rejected
which judgement, whose it was and when, newest first, filtered by reviewer and decision; and
whether the reviewer who made a decision may still change it (review.change): a decision whose
judgement no trainer step used (history.trained_on, the undo window's own test).

A judgement has one reviewer (`Feedback.reviewer`; review.decide refuses another's decision on
it), so there is no agreement between reviewers to measure: stats.per_reviewer counts decisions
and accept rates instead."""
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.paginator import Paginator

from . import history, review
from .models import Feedback
from .review import DECIDED, ReviewError

PAGE_SIZE = 50  # decisions a page lists; a reviewer's session rarely passes it (a run's review: 2-300)


@dataclass(frozen=True)
class DecisionFilter:
    reviewer: str = ""  # a username; empty: every reviewer
    decision: str = ""  # accepted or rejected; empty: both

    @classmethod
    def from_query(cls, run, query) -> "DecisionFilter":
        """The filter a query names; a value that names nothing raises ReviewError naming it."""
        reviewer, decision = query.get("reviewer", "").strip(), query.get("decision", "").strip()
        if decision and decision not in DECIDED:
            raise ReviewError(f"decision must be {' or '.join(DECIDED)}, not {decision[:50]!r}")
        if reviewer and reviewer not in reviewers(run):
            raise ReviewError(f"reviewer {reviewer[:150]!r} decided nothing on this run")
        return cls(reviewer=reviewer, decision=decision)

    def as_query(self) -> dict:
        return {name: value for name, value in (("reviewer", self.reviewer), ("decision", self.decision)) if value}


def decisions(run, chosen: DecisionFilter = DecisionFilter()):
    rows = Feedback.objects.filter(experience__run=run, review__in=DECIDED)
    if chosen.reviewer:
        rows = rows.filter(reviewer__username=chosen.reviewer)
    if chosen.decision:
        rows = rows.filter(review=chosen.decision)
    return rows.select_related("user", "reviewer", "experience__run").order_by("-reviewed_at", "-pk")


def reviewers(run) -> list[str]:
    """The usernames of those who decided on the run's judgements."""
    decided = Feedback.objects.filter(experience__run=run, review__in=DECIDED).values("reviewer")
    return list(get_user_model().objects.filter(pk__in=decided).order_by("username").values_list("username", flat=True))


def page(run, viewer, chosen: DecisionFilter, number) -> tuple:
    """(the page, its rows): each decision with the step that trained on it (accepted ones only:
    a rejected judgement never trains) and whether `viewer` may change it now."""
    shown = Paginator(decisions(run, chosen), PAGE_SIZE).get_page(number)
    readers = (history._pair_readers(run)
               if any(f.kind == Feedback.Kind.PREFERENCE for f in shown.object_list) else None)
    rows = []
    for feedback in shown.object_list:
        step = history.trained_on(feedback, readers)
        rows.append({"judgement": feedback, "summary": history.describe(feedback), "trained_on_step": step,
                     "item": history.shown_item_id(feedback),
                     "may_change": step is None and (feedback.reviewer_id == viewer.pk
                                                     or review.may_take_over(feedback, viewer))})
    return shown, rows
