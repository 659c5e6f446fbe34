"""The annotation queue: which item of a run an annotator judges next, locked for them while they
judge it (`AnnotationLock`), and skipping or postponing an item (`SetAside`).

Handing out an item follows the rule of the judgements (apps/feedback/services.py): its row is
locked, then its judges and locks are counted, so an item is never handed to more annotators than
the run asks for. Candidates are taken with SKIP LOCKED, so concurrent annotators are handed
different items without waiting.
"""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Exists, F, Func, IntegerField, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Abs, Coalesce
from django.utils import timezone

from apps.buffer.models import Experience

from . import live
from .models import AnnotationLock, SetAside
from .queue_filter import NO_FILTER, QueueFilter
from .services import (
    FeedbackError,
    _check_may_judge,
    _judged,
    _live_locks,
    _locked_row,
    _places_left,
    check_may_annotate,
    judge_count,
    judgements_per_item,
)

Status = Experience.Status

# Queue strategies: which experience of the run an annotator judges next.
NEWEST = "newest"  # what the explorer wrote last: feedback on the current policy
LOWEST_CONFIDENCE = "lowest_confidence"  # unscored first, then rewards nearest 0.5, where the reward fn is least sure
RANDOM = "random"  # an unbiased sample, e.g. for measuring agreement
GROUND_TRUTH_FIRST = "ground_truth_first"  # tasks with a known answer first: annotators can be checked against it
STRATEGIES = {
    NEWEST: "Newest first",
    LOWEST_CONFIDENCE: "Lowest-confidence reward first",
    RANDOM: "Random",
    GROUND_TRUTH_FIRST: "Ground truth first",
}

QUEUED_SOURCES = (Experience.Source.ROLLOUT, Experience.Source.SYNTHETIC)  # what the model wrote
CANDIDATES = 20  # rows the queue locks at once; it walks them in the strategy's order


def _lock_expiry():
    return timezone.now() + timedelta(seconds=settings.RFTWEB_ANNOTATION_LOCK_SECONDS)


def next_item(
    run, user, strategy: str = NEWEST, *, exclude=(), queue_filter: QueueFilter = NO_FILTER
) -> Experience | None:
    """The experience of `run` the user should judge now, locked for them; None when nothing is left.
    An item the user already holds comes back first (a reload, the back button), while it can
    still be judged. `exclude`: ids the page has already (the item shown, when it fetches the
    next one ahead). `queue_filter` narrows what is handed out, held items included; the locking
    rules are the same, so annotators with different filters share out the items as any others."""
    if strategy not in STRATEGIES:
        raise FeedbackError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    check_may_annotate(run, user)
    wanted = queue_filter.q()  # before the transaction: a text filter may index recent writes first
    with transaction.atomic():
        held = _held_item(run, user, exclude, wanted)
        if held is not None:
            return held
        # Candidates were counted before their rows were locked: one can fill up meanwhile, so the
        # count is redone under the lock, and a fresh batch is tried if a whole batch filled up.
        for _ in range(3):
            candidates = list(
                _candidates(run, user, strategy, wanted)
                .exclude(pk__in=exclude)
                .select_related("run")
                .select_for_update(skip_locked=True, of=("self",))[:CANDIDATES]
            )
            for experience in candidates:
                if _places_left(experience, user) > 0:
                    _take(experience, user)
                    return experience
            if len(candidates) < CANDIDATES:
                return None
    return None


def _held_item(run, user, exclude, wanted: Q) -> Experience | None:
    mine = AnnotationLock.objects.filter(experience_id=OuterRef("pk"), user=user, expires_at__gt=timezone.now())
    held = _open_items(run, user).filter(wanted, Exists(mine)).exclude(pk__in=exclude).select_related("run").first()
    if held is not None:
        AnnotationLock.objects.filter(experience=held, user=user).update(expires_at=_lock_expiry())
    return held


def _open_items(run, user):
    """The run's items the user may still judge: what its model wrote, not rejected, not judged or
    skipped by the user, with a place left for them, and not trained on by a run that has finished
    (no more training to come: such a judgement is refused). The exact count of places is redone
    under the row's lock when an item is taken or judged."""
    holders = (
        AnnotationLock.objects.filter(experience_id=OuterRef("pk"), expires_at__gt=timezone.now())
        .exclude(user=user).order_by()
        .values(n=Func(F("pk"), function="COUNT", output_field=IntegerField()))
    )
    items = (
        Experience.objects.filter(run=run, source__in=QUEUED_SOURCES)
        .exclude(status=Status.REJECTED)
        .exclude(Exists(_judged(OuterRef("pk"), user.pk)))
        .exclude(Exists(SetAside.objects.filter(experience=OuterRef("pk"), user=user, postponed=False)))
        .alias(places_taken=judge_count(OuterRef("pk"), leaving_out=user) + Coalesce(Subquery(holders), 0))
        .filter(places_taken__lt=judgements_per_item(run))
    )
    if run.is_finished:
        items = items.exclude(status=Status.CONSUMED)
    return items


def _candidates(run, user, strategy: str, wanted: Q):
    items = _open_items(run, user).filter(wanted).annotate(
        postponed=Exists(SetAside.objects.filter(experience=OuterRef("pk"), user=user, postponed=True))
    )
    newest = (F("explorer_step").desc(), F("pk").desc())
    order = {
        NEWEST: newest,
        LOWEST_CONFIDENCE: (Abs(F("reward") - Value(0.5)).asc(nulls_first=True), *newest),
        # Sorting every candidate is fine at queue sizes of a run; a sampled scan would be the next step.
        RANDOM: ("?",),
        GROUND_TRUTH_FIRST: (Case(When(task__answer__gt="", then=Value(0)), default=Value(1)), *newest),
    }[strategy]
    # What the trainer has not taken yet first: a judgement on it can still shape this run's training.
    consumed_last = Case(When(status=Status.CONSUMED, then=Value(1)), default=Value(0))
    return items.order_by("postponed", consumed_last, *order)


ITEMS_LEFT_COUNTED = 1000  # counting a big run's queue exactly would cost every page more than it tells


def items_left(run, user, queue_filter: QueueFilter = NO_FILTER, leaving=()) -> int:
    """How many items of the run the user may still judge (an item another annotator holds now
    counts while places are left on it), of those the filter keeps, but those the page is leaving
    (`leaving`: the item being judged while the next is fetched ahead), counted up to
    ITEMS_LEFT_COUNTED + 1: more reads "1000+"."""
    items = _open_items(run, user).filter(queue_filter.q()).exclude(pk__in=leaving)
    return items[: ITEMS_LEFT_COUNTED + 1].count()


def left_note(run, user, queue_filter: QueueFilter, leaving=()) -> str:
    """What the page says of the queue: "412 left to judge", or with a filter "37 of 412 left
    match". Fetched ahead, it counted the item still on screen: one more than was left."""
    left = items_left_label(items_left(run, user, leaving=leaving))
    if not queue_filter:
        return f"{left} left to judge"
    return f"{items_left_label(items_left(run, user, queue_filter, leaving))} of {left} left match"


def items_left_label(count: int) -> str:
    return f"{ITEMS_LEFT_COUNTED}+" if count > ITEMS_LEFT_COUNTED else str(count)


def why_empty(run, user) -> list[tuple[int, str]]:
    """Why nothing of the run is left for the user, for the empty queue's page: (count, reason)
    pairs over its items, each item counted once, under the first reason that holds."""
    judged_by_me = Exists(_judged(OuterRef("pk"), user.pk))
    skipped = Exists(SetAside.objects.filter(experience=OuterRef("pk"), user=user, postponed=False))
    reasons = [
        (judged_by_me, "judged by you"),
        (skipped, "skipped by you"),
        (Q(status=Status.REJECTED), "flagged, so out of training"),
    ]
    if run.is_finished:
        reasons.append((Q(status=Status.CONSUMED), f"trained on before the run {run.status}: no longer open to judge"))
    rest = Experience.objects.filter(run=run, source__in=QUEUED_SOURCES)
    counts = []
    for condition, reason in reasons:
        counts.append((rest.filter(condition).count(), reason))
        rest = rest.exclude(condition)
    counts.append((rest.count(), "judged by or held by other annotators"))
    return [(n, reason) for n, reason in counts if n]


def choose_comparison(experience: Experience) -> Experience | None:
    """Another response to the item's prompt to compare it with (B): from the same model version
    where there is one, else the nearest version; within that the same explorer step first.
    Responses identical to the item's teach nothing as a pair, and flagged ones train nothing."""
    if experience.run_id is None:
        return None
    return (
        Experience.objects.filter(
            run_id=experience.run_id,
            task_id=experience.task_id,
            prompt_text=experience.prompt_text,
            source__in=QUEUED_SOURCES,
        )
        .exclude(pk=experience.pk)
        .exclude(status=Status.REJECTED)
        .exclude(response_text=experience.response_text)
        .order_by(
            Abs(F("model_version") - experience.model_version),
            Abs(F("explorer_step") - experience.explorer_step),
            "rollout_index", "pk",
        )
        .first()
    )


def _take(experience: Experience, user) -> None:
    AnnotationLock.objects.update_or_create(experience=experience, user=user, defaults={"expires_at": _lock_expiry()})
    live.broadcast(
        experience.run_id,
        {"type": "taken", "experience": experience.pk, "user": user.username, "places_left": _places_left(experience)},
    )


def holders(experience: Experience, user) -> list[str]:
    """Other annotators holding the experience now, for the page to show."""
    return list(
        _live_locks(experience.pk)
        .exclude(user=user)
        .order_by("user__username")
        .values_list("user__username", flat=True)
    )


@transaction.atomic
def take(experience_id: int, user) -> Experience:
    """Lock an item the user opened directly (a link from the rollout browser), if places are left."""
    experience = _locked_row(experience_id, user)
    _check_may_judge(experience, user)
    if not _judged(experience.pk, user.pk).exists():
        _take(experience, user)
    return experience


@transaction.atomic
def set_aside(experience_id: int, user, *, postpone: bool) -> None:
    """Skip (never offer it to this user again) or postpone (offer it after everything else);
    either way the user's lock goes, and the item is free for others."""
    experience = _locked_row(experience_id, user)
    SetAside.objects.update_or_create(experience=experience, user=user, defaults={"postponed": postpone})
    if AnnotationLock.objects.filter(experience=experience, user=user).delete()[0]:
        live.broadcast(experience.run_id, {"type": "released", "experience": experience.pk, "user": user.username})
