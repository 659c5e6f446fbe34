"""Flagging every item of a run that a filter matches in one confirmed action (Argilla's bulk
actions), for a run's owner or a curator. Each item is flagged by `services.flag`, as one flag from
the annotation page is: its row rejected (per the run's `feedback.exclude_flagged`), a flag
judgement recorded in the person's name, so training and the run's statistics see it the same way;
and each is undone by `history.undo`, as that flag's undo is. An item the one-item flag would
refuse (all the judgements it needs, a finished run's consumed item) is left as it is and counted.
"""
import hashlib
from collections import Counter
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.roles import CURATOR, RESEARCHER, has_role
from apps.buffer.models import Experience

from . import history, services
from .models import AnnotationLock, Feedback
from .queue import QUEUED_SOURCES
from .queue_filter import QueueFilter
from .services import FeedbackError

MAX_ITEMS = 1000  # one confirmed action: more is a filter too wide to have been looked at
SHOWN_ITEMS = 20  # what the page lists of the matching items before the flag


class NotAllowed(FeedbackError):
    """The person may not flag a run's items in bulk."""


class Changed(FeedbackError):
    """The items the filter matches are not those the person confirmed: nothing flagged."""


@dataclass
class Flagged:
    feedback_ids: list[int]
    refused: Counter = field(default_factory=Counter)  # why, and how many items, the one-item flag refused

    @property
    def message(self) -> str:
        said = f"Flagged {len(self.feedback_ids)} item{'s' if len(self.feedback_ids) != 1 else ''}."
        if self.refused:
            said += " Left as they were: " + "; ".join(f"{n} ({why})" for why, n in self.refused.items()) + "."
        return said


def check_may_bulk_flag(run, user) -> None:
    """A run's owner (a researcher) or a curator: as for who annotates the run."""
    if not (has_role(user, CURATOR) or (has_role(user, RESEARCHER) and run.owner_id == user.pk)):
        raise NotAllowed(f"only the owner of run {run.name!r} or a curator may flag its items in bulk")


def matching(run, queue_filter: QueueFilter, user):
    """The run's items the filter matches that `user`'s flag would change, as the page counts them
    before the flag: not rejected already, and none the one-item flag refuses
    (services._check_may_judge): a finished run's consumed item, one that others' judgements and
    live locks leave no place for, unless the user judged or holds it. The page counted those too:
    "Flag these 128 items", then "Flagged 0 items"."""
    items = (Experience.objects.filter(run=run, source__in=QUEUED_SOURCES)
             .exclude(status=Experience.Status.REJECTED).filter(queue_filter.q()))
    if run.is_finished:
        items = items.exclude(status=Experience.Status.CONSUMED)
    judged = Feedback.objects.filter(Q(experience=OuterRef("pk")) | Q(other=OuterRef("pk")))
    live = AnnotationLock.objects.filter(experience=OuterRef("pk"), expires_at__gt=timezone.now())
    judges = _count(judged.exclude(user=user), Count("user", distinct=True))
    holders = _count(live.exclude(user=user).exclude(user__in=judged.values("user")), Count("pk"))
    places = services.judgements_per_item(run) - Coalesce(judges, 0) - Coalesce(holders, 0)
    return (items.annotate(places=places)
            .filter(Q(places__gt=0) | Exists(judged.filter(user=user)) | Exists(live.filter(user=user)))
            .order_by("-explorer_step", "-pk"))


def _count(rows, count) -> Subquery:
    return Subquery(rows.order_by().annotate(one=Value(1)).values("one").annotate(n=count).values("n"))


def matching_ids(run, queue_filter: QueueFilter, user) -> list[int]:
    """The ids of `matching`, newest first, at most MAX_ITEMS + 1: one more says the filter is too wide."""
    return list(matching(run, queue_filter, user).values_list("pk", flat=True)[: MAX_ITEMS + 1])


def seen(ids) -> str:
    """The items a page showed as matching, as it posts them back: a digest of their ids."""
    return hashlib.sha256(",".join(map(str, sorted(ids))).encode()).hexdigest()[:32]


def flag_all(run, user, queue_filter: QueueFilter, reason: str, *, confirmed_count: int,
             confirmed: str | None = None) -> Flagged:
    """Flag every item the filter matches, once the person has seen them: `confirmed_count` must
    be the number matching now and `confirmed` (the page's `seen`) these items, or nothing is
    flagged (items came or went since: as many others as went came, and the count alone let the
    flag through)."""
    check_may_bulk_flag(run, user)
    if not queue_filter:
        raise FeedbackError("choose a filter first: a bulk flag without one would flag the whole run")
    if reason not in services.FLAG_REASONS:
        raise FeedbackError(f"unknown flag {reason!r}: choose one of {', '.join(services.FLAG_REASONS)}")
    ids = matching_ids(run, queue_filter, user)
    if len(ids) > MAX_ITEMS:
        raise FeedbackError(f"the filter matches more than {MAX_ITEMS} items: narrow it to flag them in one action")
    if len(ids) != confirmed_count:
        raise Changed(
            f"the filter matches {len(ids)} items now, not the {confirmed_count} you confirmed: look again and confirm"
        )
    if confirmed is not None and seen(ids) != confirmed:
        raise Changed(f"the filter matches {len(ids)} items now, not the same ones you confirmed (some went, "
                            "others came): look again and confirm")
    flagged = Flagged(feedback_ids=[])
    with transaction.atomic():
        for pk in sorted(ids):  # rows are locked in id order, as every other service locks them
            try:
                with transaction.atomic():
                    flagged.feedback_ids.append(services.flag(pk, user, reason, comment="bulk flag").pk)
            except FeedbackError as exc:
                flagged.refused[_why(str(exc))] += 1
    return flagged


def flagged_already(run, user, item_ids: list[int]) -> bool:
    """Whether every item named carries `user`'s flag already (a confirmed flag sent twice)."""
    wanted = set(item_ids)
    mine = Feedback.objects.filter(experience__run=run, experience_id__in=wanted, user=user, kind=Feedback.Kind.FLAG)
    return bool(wanted) and set(mine.values_list("experience_id", flat=True)) == wanted


def undo_all(feedback_ids: list[int], user) -> int:
    """Undo the flags of one bulk action, each as its one-item undo does; the items undo would
    lock for the person again (to judge once more) are let go, for the annotators."""
    undone = 0
    with transaction.atomic():
        for pk in sorted(feedback_ids):
            try:
                done = history.undo(pk, user)
            except FeedbackError:  # undone already, one by one: nothing left to do for it
                continue
            AnnotationLock.objects.filter(experience=done.experience, user=user).delete()
            undone += 1
    return undone


def undo_flags(run, feedback_ids: list[int], user) -> int:
    """undo_all for the ids a script names (the API's undo): only the person's own flags of the
    run's items; another judgement's id undoes nothing here (its undo is the annotation page's)."""
    own = Feedback.objects.filter(pk__in=feedback_ids, user=user, kind=Feedback.Kind.FLAG, experience__run=run)
    return undo_all(list(own.values_list("pk", flat=True)), user)


def _why(refusal: str) -> str:
    """A refusal without its item's id, so alike ones are counted together."""
    return refusal.split(": ")[0].split(" ", 2)[-1] if refusal.startswith("experience ") else refusal
