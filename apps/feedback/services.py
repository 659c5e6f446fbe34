"""State changes from human judgements (rate, edit, compare, flag), and who may make them. The
annotation queue that hands out what to judge is apps/feedback/queue.py.

Every operation that hands out or judges an item first locks the experience's row
(SELECT … FOR UPDATE), then counts its judges and annotation locks in fresh statements: two
annotators racing for the last place on an item are serialised by that row lock, so an item is
never judged by more annotators than the run asks for (`judgements_per_item`).
"""
import math

from django.conf import settings
from django.db import transaction
from django.db.models import F, Func, IntegerField, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.revocation import recheck
from apps.accounts.roles import ANNOTATOR, CURATOR, has_role
from apps.buffer.models import Experience
from workers.rft import sampling
from workers.rft.config import RunConfig
from workers.rft.json_values import text_problem

from . import live
from .edit_rows import store_human_edit, too_long, unused_edit
from .models import AnnotationLock, Feedback, RunAnnotators
from .reference import contradiction

Status = Experience.Status

HUMAN_REWARD = sampling.HUMAN_REWARD  # the reward component that holds the mean human rating

VERDICTS = {"a_better": "A is better", "b_better": "B is better", "tie": "Tie", "both_bad": "Both bad"}
# The preference row's value: 1 makes (experience, other) a DPO pair; the others are no pair.
VERDICT_VALUES = {"a_better": 1.0, "b_better": 1.0, "tie": 0.5, "both_bad": 0.0}
FLAG_REASONS = {"wrong": "Wrong", "harmful": "Harmful", "garbled": "Garbled"}
MAX_EDIT_CHARS = 20_000
MAX_COMMENT_CHARS = 2_000  # a note on a judgement, not a document
MAX_SECONDS_SPENT = 3600.0  # a page left open overnight is not an hour's work per item


class FeedbackError(Exception):
    """A judgement or queue request that cannot be done; the message says why, for the annotator."""


class NeedsConfirmation(FeedbackError):
    """The judgement is allowed but looks like a mistake (an edit that contradicts the reference
    answer): the message asks, and the same judgement sent again with `confirmed` is saved."""


class NotAnnotator(FeedbackError):
    """The user may not annotate the run at all: final on every route (the pages answer 403 and
    show nothing of the item), unlike a refusal of one item (taken, judged enough)."""


def feedback_settings(run):
    """The `feedback` section of the run's config (a FeedbackConfig; defaults without a run). Read,
    not judged again: the launch judged it with the run's algorithm (beside grpo's defaults, a dpo
    run's source_runs has no effect and was refused)."""
    section = ((run.config or {}).get("feedback") or {}) if run else {}
    return RunConfig.model_validate({"feedback": section}).feedback


def rating_scale(run) -> dict[str, float]:
    """The run's rating scale: each point's label (the digit an annotator presses) and the human
    reward it stands for, normalised to [0, 1]."""
    section = feedback_settings(run)
    low, high = section.scale_min, section.scale_max
    return {str(point): (point - low) / (high - low) for point in range(low, high + 1)}


# Labels of the points of a scale that fall on these fractions of it (1-5: all five; 0-9: the ends).
SCALE_ANCHORS = {0.0: "wrong", 0.25: "poor", 0.5: "partly right", 0.75: "good", 1.0: "perfect"}


def scale_labels(run) -> list[tuple[str, str]]:
    """The run's rating scale for the page: (point, label), the label empty between anchors."""
    return [(point, SCALE_ANCHORS.get(value, "")) for point, value in rating_scale(run).items()]


def needs_review(run) -> bool:
    """Whether the run's ratings, edits and comparisons wait for a reviewer (apps/feedback/review.py)."""
    return bool(run) and feedback_settings(run).require_review


def judgements_per_item(run, section=None) -> int:
    """How many annotators judge each item: the run's `feedback.judgements_per_item`, else the
    deployment's RFTWEB_JUDGEMENTS_PER_ITEM. `section`: the run's feedback_settings, where the
    caller has parsed them (a pydantic validation of the config each)."""
    return (section or feedback_settings(run)).judgements_per_item or settings.RFTWEB_JUDGEMENTS_PER_ITEM


# -- who may annotate a run ------------------------------------------------------------------------


def may_annotate(run, user) -> bool:
    """Annotators may judge a run's experiences if it is open to all, or they are assigned to it;
    its owner and curators always may. Imported data (no run) is open to every annotator."""
    if not has_role(user, ANNOTATOR):
        return False
    if run is None or run.owner_id == user.pk or has_role(user, CURATOR):
        return True
    access = RunAnnotators.objects.filter(run=run).first()
    return access is None or access.open_to_all or access.users.filter(pk=user.pk).exists()


def annotatable_runs(runs, user):
    """`runs` (a queryset) narrowed to those the user may annotate."""
    if has_role(user, CURATOR):
        return runs
    return runs.filter(
        Q(owner=user) | Q(annotators__isnull=True) | Q(annotators__open_to_all=True) | Q(annotators__users=user)
    ).distinct()


def check_may_annotate(run, user) -> None:
    """NotAnnotator unless the user may annotate the run: every service that reads or changes an
    item of a run checks this first, so an outsider learns nothing more of it."""
    if not may_annotate(run, user):
        raise NotAnnotator(f"you are not an annotator of run {run.name!r}: its owner assigns who annotates it")


@transaction.atomic
def set_annotators(run, user, *, open_to_all: bool, usernames: list[str]) -> RunAnnotators:
    """Who may annotate the run (its owner or a curator decides): everyone, or the named annotators."""
    from django.contrib.auth import get_user_model

    if run.owner_id != user.pk and not has_role(user, CURATOR):
        raise FeedbackError(f"only the owner of run {run.name!r} or a curator assigns its annotators")
    names = sorted({name.strip() for name in usernames if name.strip()})
    users = list(get_user_model().objects.filter(username__in=names))
    unknown = sorted(set(names) - {u.username for u in users})
    if unknown:
        raise FeedbackError(f"no user named {', '.join(unknown)}: nothing was changed")
    not_annotators = sorted(u.username for u in users if not has_role(u, ANNOTATOR))
    if not_annotators:
        raise FeedbackError(f"{', '.join(not_annotators)} cannot annotate (no annotator role): nothing was changed")
    access, _ = RunAnnotators.objects.update_or_create(run=run, defaults={"open_to_all": open_to_all})
    access.users.set(users)
    recheck(live.annotate_group(run.pk))  # the run's open sockets of those left out are closed
    release_lost_locks(run=run)  # and the items they held are handed to others
    return access


@transaction.atomic
def assign_annotator(run, annotator, by, *, assigned: bool) -> RunAnnotators:
    """Add one annotator to the run's list, or take them off it (the people pages); the run stays
    open to every annotator or not as it was: a run with no list yet starts one, open to all."""
    if run.owner_id != by.pk and not has_role(by, CURATOR):
        raise FeedbackError(f"only the owner of run {run.name!r} or a curator assigns its annotators")
    if assigned and not has_role(annotator, ANNOTATOR):
        raise FeedbackError(f"{annotator.username} cannot annotate (no annotator role): give them one first")
    access, _ = RunAnnotators.objects.get_or_create(run=run)
    if assigned:
        access.users.add(annotator)
    else:
        access.users.remove(annotator)
        recheck(live.annotate_group(run.pk))  # their open sockets on the run check again
        release_lost_locks(user_ids=[annotator.pk], run=run)
    return access


# -- who holds and who judged an item ---------------------------------------------------------------


def _judged(experience_id, user_id=None):
    """Feedback on the experience, counting a comparison for both of its responses."""
    rows = Feedback.objects.filter(Q(experience_id=experience_id) | Q(other_id=experience_id))
    return rows if user_id is None else rows.filter(user_id=user_id)


def judge_count(experience, *, leaving_out=None):
    """How many annotators judged the experience (a subquery on `experience`, an OuterRef), leaving
    out `leaving_out`'s judgements: the places its judgements take (`_places_left` counts the same)."""
    rows = _judged(experience)
    if leaving_out is not None:
        rows = rows.exclude(user=leaving_out)
    distinct = Func(F("user_id"), function="COUNT", template="COUNT(DISTINCT %(expressions)s)",
                    output_field=IntegerField())
    return Coalesce(Subquery(rows.order_by().values(n=distinct)), 0)


def _live_locks(experience_id):
    return AnnotationLock.objects.filter(experience_id=experience_id, expires_at__gt=timezone.now())


def _places_left(experience: Experience, user=None) -> int:
    """How many more annotators may take the item, leaving `user`'s own lock and judgements out
    of the count. Call with its row locked."""
    me = user.pk if user is not None else None
    judges = set(_judged(experience.pk).values_list("user_id", flat=True)) - {me}
    holders = _live_locks(experience.pk).exclude(user_id=me).exclude(user_id__in=judges).count()
    return judgements_per_item(experience.run) - len(judges) - holders


def _locked_row(experience_id: int, user) -> Experience:
    """The experience's row, locked, once the user is known to annotate its run: whoever may not
    learns nothing more of the item from any later check."""
    try:
        experience = Experience.objects.select_for_update(of=("self",)).select_related("run").get(pk=experience_id)
    except Experience.DoesNotExist:
        raise FeedbackError(f"experience {experience_id} does not exist") from None
    check_may_annotate(experience.run, user)
    return experience


def _check_may_judge(experience: Experience, user) -> None:
    """Refuse a judgement by someone not annotating the run, one that would go past the
    judgements per item, or one on what is settled."""
    run = experience.run
    check_may_annotate(run, user)
    if experience.status == Status.CONSUMED and run is not None and run.is_finished:
        raise FeedbackError(
            f"experience {experience.pk} was already trained on and its run is {run.status}: it can no longer be judged"
        )
    if _live_locks(experience.pk).filter(user=user).exists() or _judged(experience.pk, user.pk).exists():
        return
    if _places_left(experience, user) <= 0:
        holders = ", ".join(
            _live_locks(experience.pk)
            .exclude(user=user)
            .values_list("user__username", flat=True)
            .order_by("user__username")
        )
        raise FeedbackError(
            f"experience {experience.pk} is taken by {holders or 'other annotators'}: go on to the next item"
            if holders
            else f"experience {experience.pk} has all the judgements it needs: go on to the next item"
        )


def refusal(experience: Experience, user) -> str | None:
    """Why the user cannot judge the item now (None: they can), for the page to say so instead of
    offering judgements that would be refused. The services check again when judging."""
    try:
        _check_may_judge(experience, user)
    except FeedbackError as exc:
        return str(exc)
    return None


def _judgement_done(experience: Experience, user) -> None:
    """The user has judged the item: their lock goes, and the others watching the run hear of it."""
    AnnotationLock.objects.filter(experience=experience, user=user).delete()
    live.broadcast(experience.run_id, {"type": "judged", "experience": experience.pk, "user": user.username})


def release_lost_locks(*, user_ids=None, run=None) -> int:
    """Let go of the items held by people who may no longer judge them (deactivated, their
    annotator role taken away, left off the run's annotators), so others are handed them now:
    their sockets close at once (apps.accounts.revocation), and their items stayed taken for
    RFTWEB_ANNOTATION_LOCK_SECONDS (300 s) before. Returns how many were let go."""
    locks = AnnotationLock.objects.select_related("experience__run", "user")
    if user_ids is not None:
        locks = locks.filter(user_id__in=user_ids)
    if run is not None:
        locks = locks.filter(experience__run=run)
    lost = [lock for lock in locks if not (lock.user.is_active and may_annotate(lock.experience.run, lock.user))]
    for lock in lost:
        lock.delete()
        live.broadcast(lock.experience.run_id,
                       {"type": "released", "experience": lock.experience_id, "user": lock.user.username})
    return len(lost)


def checked_comment(comment: str) -> str:
    """The annotator's comment, if it can be stored as typed."""
    if problem := text_problem(comment):
        raise FeedbackError(f"the comment {problem}, which cannot be stored: remove it")
    if len(comment) > MAX_COMMENT_CHARS:
        raise FeedbackError(f"the comment is {len(comment)} characters long; at most {MAX_COMMENT_CHARS} are allowed")
    return comment


def _save_feedback(experience, user, kind, seconds_spent, *, other=None, **fields) -> Feedback:
    """Save the user's judgement. Their earlier one of this kind on the item (a comparison: on the
    same pair, either way round) is replaced in place, and `replaced` says what it was; a
    comparison of another pair is a judgement of its own."""
    seconds = float(seconds_spent or 0.0)
    # The time comes from the page's `shown_at`: one that is not a finite number is unknown (0).
    seconds = min(max(seconds, 0.0), MAX_SECONDS_SPENT) if math.isfinite(seconds) else 0.0
    fields = {"experience": experience, "other": other, "seconds_spent": seconds, **fields}
    if kind != Feedback.Kind.FLAG:  # judged (again): a reviewer looks at what it says now
        review = Feedback.Review.PENDING if needs_review(experience.run) else Feedback.Review.NONE
        fields |= {"review": review, "reviewer": None, "reviewed_at": None, "review_note": ""}
    earlier = Feedback.objects.filter(user=user, kind=kind)
    if kind == Feedback.Kind.PREFERENCE:
        earlier = earlier.filter(Q(experience=experience, other=other) | Q(experience=other, other=experience))
    else:
        earlier = earlier.filter(experience=experience)
    feedback = earlier.first()
    if feedback is None:
        return Feedback.objects.create(user=user, kind=kind, **fields)
    replaced = _what_it_was(feedback)
    for name, value in fields.items():
        setattr(feedback, name, value)
    feedback.save()
    feedback.replaced = replaced
    return feedback


def _what_it_was(feedback: Feedback) -> str:
    """An earlier judgement, as the page says it was replaced."""
    of = f"of experience {feedback.experience_id}"
    if feedback.kind == Feedback.Kind.RATING:
        return f"your earlier rating {feedback.label} {of}"
    if feedback.kind == Feedback.Kind.EDIT:
        return f"your earlier edit {of}"
    if feedback.kind == Feedback.Kind.FLAG:
        return f"your earlier flag ({FLAG_REASONS.get(feedback.label, feedback.label).lower()}) {of}"
    first, second = sorted((feedback.experience_id, feedback.other_id))
    verdict = {1.0: f"{feedback.experience_id} was better", 0.5: "a tie", 0.0: "both bad"}.get(feedback.value, "")
    return f"your earlier comparison of experiences {first} and {second}" + (f" ({verdict})" if verdict else "")


# -- judgements -------------------------------------------------------------------------------------


@transaction.atomic
def rate(experience_id: int, user, point: str, *, seconds_spent: float = 0.0, comment: str = "") -> Feedback:
    """Rate on the run's scale; once the item has its judgements, the mean of the human ratings
    becomes the experience's `human` reward component (which the run may weight into its reward, or
    override it with): set_human_reward."""
    comment = checked_comment(comment)
    experience = _locked_row(experience_id, user)
    scale = rating_scale(experience.run)
    point = str(point).strip()
    if point not in scale:
        raise FeedbackError(f"rating {point!r} is not on this run's scale ({', '.join(scale)})")
    _check_may_judge(experience, user)
    feedback = _save_feedback(
        experience, user, Feedback.Kind.RATING, seconds_spent, value=scale[point], label=point, comment=comment
    )
    set_human_reward(experience)
    _judgement_done(experience, user)
    return feedback


def set_human_reward(experience: Experience) -> None:
    """The experience's `human` reward component, which training reads as its rating. It is set
    once the item's `judgements_per_item` places are taken (by annotators who judged it any way:
    the queue hands it to no more, `_places_left`) and no rating waits for a reviewer: the mean of
    its ratings that may reach training (a rejected one is left out; none left, no component).
    Before, the item is not rated yet: with 2 per item, the first rating alone trained as the
    item's reward and the second never counted. Called by every judgement, undo and review that
    changes the item's places or ratings: an item rated by one annotator and edited by the other
    waited for a second rating that could never come."""
    ratings = experience.feedback.filter(kind=Feedback.Kind.RATING)
    counted = list(ratings.filter(review__in=Feedback.TRAINED).values_list("value", flat=True))
    judges = _judged(experience.pk).values("user_id").distinct().count()
    complete = (judges >= judgements_per_item(experience.run)
                and not ratings.filter(review=Feedback.Review.PENDING).exists())
    components = {key: value for key, value in experience.reward_components.items() if key != HUMAN_REWARD}
    if complete and counted:
        components[HUMAN_REWARD] = sum(counted) / len(counted)
    if components != experience.reward_components:
        experience.reward_components = components
        experience.save(update_fields=["reward_components"])


@transaction.atomic
def edit(
    experience_id: int, user, text: str, *, seconds_spent: float = 0.0, comment: str = "", confirmed: bool = False
) -> Feedback:
    """Correct the response: the edit becomes a `human_edit` experience (parent: the original),
    ready for SFT/MIX at once. Editing again replaces the annotator's edit while it is unused.
    An edit whose answer contradicts the task's reference answer is saved only once `confirmed`:
    expert data that teaches a wrong answer is worse than none."""
    comment = checked_comment(comment)
    experience = _locked_row(experience_id, user)
    text = text.replace("\r\n", "\n")
    if not text.strip():
        raise FeedbackError("the edited response is empty: write the corrected response, or skip the item")
    # A person typing a NUL made a mistake (the model's output has NULs replaced, buffer.store).
    if problem := text_problem(text):
        raise FeedbackError(f"the edited response {problem}, which cannot be stored: remove it")
    if len(text) > MAX_EDIT_CHARS:
        raise FeedbackError(f"the edited response is {len(text)} characters long; at most {MAX_EDIT_CHARS} are allowed")
    if text == experience.response_text:
        raise FeedbackError("the edited response is the same as the model's: change it, or rate the response instead")
    if has_environment_turns(experience):
        raise FeedbackError(EPISODE_EDIT)
    _check_may_judge(experience, user)
    if problem := too_long(experience.run, text):
        raise FeedbackError(problem)
    if not confirmed and (question := contradiction(experience, text)):
        raise NeedsConfirmation(question)
    feedback = _save_feedback(experience, user, Feedback.Kind.EDIT, seconds_spent, edited_text=text, comment=comment)
    if feedback.review != Feedback.Review.PENDING:
        store_human_edit(experience, user, text)
    elif (earlier := unused_edit(experience, user)) is not None:
        earlier.delete()  # an accepted edit, changed: what trains is what a reviewer accepts next
    set_human_reward(experience)
    _judgement_done(experience, user)
    return feedback


# A trajectory's response holds the environment's turns between the model's (action mask 0 on
# them). An edit is one response the model should have written: its environment text would be
# trained as the model's (an edited FrozenLake episode trained its 140 board tokens).
EPISODE_EDIT = ("this response is a multi-turn episode with the environment's turns between the model's: "
                "an edit would be trained as if the model wrote them all. Rate it, flag it or compare it instead")


def has_environment_turns(experience: Experience) -> bool:
    return min(experience.action_mask, default=1) == 0


@transaction.atomic
def compare(
    experience_id: int, other_id: int, user, verdict: str, *, seconds_spent: float = 0.0, comment: str = ""
) -> Feedback:
    """Compare two responses to one prompt (A: the queued item, B: the other). A decisive verdict
    is a DPO pair (the preferred response as `experience`); a tie or "both bad" is recorded with
    value 0.5 or 0 and trains nothing."""
    if verdict not in VERDICTS:
        raise FeedbackError(f"unknown verdict {verdict!r}: choose one of {', '.join(VERDICTS)}")
    if experience_id == other_id:
        raise FeedbackError("a response cannot be compared with itself")
    comment = checked_comment(comment)
    # Rows are locked in id order: two annotators comparing the same pair from either side must
    # not each hold one row and wait for the other's (a deadlock Postgres answers with an error).
    locked = {pk: _locked_row(pk, user) for pk in sorted((experience_id, other_id))}
    experience, other = locked[experience_id], locked[other_id]
    if (other.run_id, other.task_id, other.prompt_text) != (
        experience.run_id, experience.task_id, experience.prompt_text
    ):
        raise FeedbackError(
            f"experiences {experience.pk} and {other.pk} answer different prompts: "
            "only responses to one prompt compare"
        )
    _check_may_judge(experience, user)
    chosen, rejected = (other, experience) if verdict == "b_better" else (experience, other)
    # One verdict per annotator and pair: a changed mind replaces the earlier one, either way round.
    feedback = _save_feedback(
        chosen, user, Feedback.Kind.PREFERENCE, seconds_spent,
        other=rejected, value=VERDICT_VALUES[verdict], label=verdict, comment=comment,
    )
    for judged in (experience, other):  # a comparison takes a place of both
        set_human_reward(judged)
    _judgement_done(experience, user)
    return feedback


@transaction.atomic
def flag(experience_id: int, user, reason: str, *, seconds_spent: float = 0.0, comment: str = "") -> Feedback:
    """Flag the response (wrong, harmful, garbled): it is rejected, so never trained on, unless
    the run's `feedback.exclude_flagged` is off (then the flag is only recorded)."""
    if reason not in FLAG_REASONS:
        raise FeedbackError(f"unknown flag {reason!r}: choose one of {', '.join(FLAG_REASONS)}")
    comment = checked_comment(comment)
    experience = _locked_row(experience_id, user)
    _check_may_judge(experience, user)
    rejects = feedback_settings(experience.run).exclude_flagged and experience.status != Status.REJECTED
    # The status the flag found is kept for undo (apps/feedback/history.py): only a flag that
    # rejected the row may put it back; flagging again keeps what the first flag found.
    before = {"status_before": experience.status} if rejects else {}
    feedback = _save_feedback(
        experience, user, Feedback.Kind.FLAG, seconds_spent, label=reason, comment=comment, **before
    )
    if rejects:
        experience.status = Status.REJECTED
        experience.save(update_fields=["status"])
    set_human_reward(experience)
    _judgement_done(experience, user)
    return feedback


def split_conversation(messages) -> tuple[list, list]:
    """The item's chat messages as (prompt, response) turns: the prompt is what precedes the
    model's first turn; the response turns are shown only for a multi-turn episode (for one
    model turn, the response text is the response)."""
    first = next((i for i, m in enumerate(messages or []) if m.get("role") == "assistant"), None)
    if first is None:
        return [], []
    rest = messages[first:]
    return messages[:first], rest if len(rest) > 1 else []
