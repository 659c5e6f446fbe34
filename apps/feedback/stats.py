"""Progress and quality of the human feedback on a run: who did how much, how fast, and how far
annotators agree. Reads only."""
import itertools
import json
from collections import defaultdict

from django.db.models import Avg, Count, Exists, FloatField, OuterRef, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from apps.buffer.models import Experience
from apps.buffer.store import judged_pairs, trained_ratings

from .models import Feedback
from .queue import QUEUED_SOURCES
from .services import HUMAN_REWARD, feedback_settings, judge_count, judgements_per_item


def per_annotator(run) -> list[dict]:
    """Judgements, mean seconds per item and (on a run that requires review) how many wait, were
    accepted or rejected, per annotator and kind."""
    rows = (
        Feedback.objects.filter(experience__run=run)
        .values("user__username", "kind")
        .annotate(count=Count("pk"), mean_seconds=Avg("seconds_spent"),
                  **{review: Count("pk", filter=Q(review=review)) for review in REVIEWS})
        .order_by("user__username", "kind")
    )
    return [
        {"annotator": r["user__username"], "kind": r["kind"], "count": r["count"], "mean_seconds": r["mean_seconds"],
         **{review: r[review] for review in REVIEWS}}
        for r in rows
    ]


REVIEWS = ("pending", "accepted", "rejected")  # Feedback.Review values


def per_reviewer(run) -> list[dict]:
    """Decisions per reviewer on the run's judgements: accepted, rejected, and the accept rate.
    Counted as they stand (a decision changed counts once, as it is now; one whose judgement was
    judged again is pending, no one's). One reviewer per judgement (review.decide): no agreement
    between reviewers to measure."""
    rows = (
        Feedback.objects.filter(experience__run=run, review__in=REVIEWS[1:], reviewer__isnull=False)
        .values("reviewer__username")
        .annotate(decisions=Count("pk"), accepted=Count("pk", filter=Q(review="accepted")))
        .order_by("reviewer__username")
    )
    return [
        {"reviewer": r["reviewer__username"], "decisions": r["decisions"], "accepted": r["accepted"],
         "rejected": r["decisions"] - r["accepted"], "accept_rate": r["accepted"] / r["decisions"]}
        for r in rows
    ]
REVIEWED_KINDS = (Feedback.Kind.RATING, Feedback.Kind.EDIT, Feedback.Kind.PREFERENCE)  # flags act at once


def percent_agreement(units: list[list[float]]) -> float | None:
    """The share of annotator pairs on one item that gave the same rating."""
    pairs = [a == b for values in units for a, b in itertools.combinations(values, 2)]
    return sum(pairs) / len(pairs) if pairs else None


def krippendorff_alpha_interval(units: list[list[float]]) -> float | None:
    """Krippendorff's alpha with the interval metric: 1 − observed / expected disagreement, over
    the items with at least two ratings. None when there is nothing to compare (or no spread)."""
    units = [values for values in units if len(values) > 1]
    values = [v for unit in units for v in unit]
    n = len(values)
    if n < 2:
        return None
    observed = sum(
        sum((a - b) ** 2 for a, b in itertools.permutations(unit, 2)) / (len(unit) - 1) for unit in units
    ) / n
    expected = sum((a - b) ** 2 for a, b in itertools.permutations(values, 2)) / (n * (n - 1))
    return None if expected == 0 else 1 - observed / expected


def cohen_kappa(pairs: list[tuple[str, str]]) -> float | None:
    """Cohen's kappa of two annotators' labels of the same items (Cohen 1960): (p_o - p_e) / (1 - p_e),
    p_o the share of items they labelled alike, p_e = sum over labels k of p_A(k) * p_B(k), the
    agreement expected by chance from how often each used each label. None without items, or when
    chance alone agrees always (p_e = 1: both used one and the same label throughout)."""
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(a == b for a, b in pairs) / n
    labels = {label for pair in pairs for label in pair}
    expected = sum((sum(a == k for a, _ in pairs) / n) * (sum(b == k for _, b in pairs) / n) for k in labels)
    return None if expected == 1 else (observed - expected) / (1 - expected)


def _verdicts(run) -> dict[tuple[int, int], dict[str, str]]:
    """{(lower experience id, higher one): {annotator: verdict}} of the run's comparisons, each
    verdict said of the pair in that order: "first" or "second" preferred, "tie" or "both_bad"."""
    found: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    rows = Feedback.objects.filter(experience__run=run, kind=Feedback.Kind.PREFERENCE)
    for chosen, other, value, name in rows.values_list("experience_id", "other_id", "value", "user__username"):
        pair = (min(chosen, other), max(chosen, other))
        found[pair][name] = ("first" if chosen == pair[0] else "second") if value == 1.0 else \
            ("tie" if value == 0.5 else "both_bad")
    return found


def _ratings_by_annotator(run) -> dict[int, dict[str, float]]:
    """{experience id: {annotator: normalised rating}} of the run's ratings."""
    found: dict[int, dict[str, float]] = defaultdict(dict)
    rows = Feedback.objects.filter(experience__run=run, kind=Feedback.Kind.RATING)
    for experience_id, value, name in rows.values_list("experience_id", "value", "user__username"):
        found[experience_id][name] = value
    return found


def pairwise_agreement(run) -> dict:
    """Per pair of annotators who judged the same items: for ratings, how many items, their percent
    agreement and Krippendorff's alpha; for comparisons, how many pairs, percent agreement and
    Cohen's kappa."""
    return {"ratings": _rating_pairs(_ratings_by_annotator(run)), "comparisons": _comparison_pairs(_verdicts(run))}


def _rating_pairs(ratings: dict) -> list[dict]:
    rows = []
    for a, b in itertools.combinations(sorted({name for item in ratings.values() for name in item}), 2):
        units = [[item[a], item[b]] for item in ratings.values() if a in item and b in item]
        if units:
            rows.append({"annotators": [a, b], "items": len(units), "percent_agreement": percent_agreement(units),
                         "krippendorff_alpha": krippendorff_alpha_interval(units)})
    return rows


def _comparison_pairs(verdicts: dict) -> list[dict]:
    rows = []
    for a, b in itertools.combinations(sorted({name for pair in verdicts.values() for name in pair}), 2):
        both = [(pair[a], pair[b]) for pair in verdicts.values() if a in pair and b in pair]
        if both:
            rows.append({"annotators": [a, b], "pairs": len(both),
                         "percent_agreement": sum(x == y for x, y in both) / len(both),
                         "cohen_kappa": cohen_kappa(both)})
    return rows


def agreement(run) -> dict:
    """The run's agreement: ratings over the items rated more than once (percent agreement,
    Krippendorff's alpha); comparisons over the pairs compared more than once (percent agreement
    over every two annotators of a pair, and the mean of the annotator pairs' kappas: Light's kappa)."""
    units = [list(item.values()) for item in _ratings_by_annotator(run).values() if len(item) > 1]
    verdicts = _verdicts(run)
    judged = [list(pair.values()) for pair in verdicts.values() if len(pair) > 1]
    agreeing = [x == y for labels in judged for x, y in itertools.combinations(labels, 2)]
    kappas = [row["cohen_kappa"] for row in _comparison_pairs(verdicts) if row["cohen_kappa"] is not None]
    return {
        "items_rated_more_than_once": len(units),
        "percent_agreement": percent_agreement(units),
        "krippendorff_alpha": krippendorff_alpha_interval(units),
        "pairs_compared_more_than_once": len(judged),
        "comparison_percent_agreement": sum(agreeing) / len(agreeing) if agreeing else None,
        "comparison_kappa": sum(kappas) / len(kappas) if kappas else None,
    }


def export_jsonl(run):
    """The run's feedback, one JSON object a line (streamed: a run's feedback can be large). A
    comparison also says it plainly: `a` and `b` (the responses as the annotator saw them) and, for
    a decisive verdict, `chosen` and `rejected`; read alone, its stored `experience` (the preferred
    one) and `other` next to "b_better" said the opposite of what the annotator meant. `review`:
    pending, accepted or rejected on a run that asks for review (a rejected one never trains), null
    elsewhere, as the API lists it."""
    rows = (
        Feedback.objects.filter(experience__run=run)
        .order_by("pk")
        .values_list("pk", "experience_id", "user__username", "kind", "value", "label", "edited_text", "other_id",
                     "comment", "seconds_spent", "review", "created_at", "updated_at")
    )
    names = ("id", "experience", "annotator", "kind", "value", "label", "edited_text", "other", "comment",
             "seconds_spent", "review", "created_at", "updated_at")
    for row in rows.iterator(chunk_size=2000):
        record = dict(zip(names, row))
        record["created_at"], record["updated_at"] = record["created_at"].isoformat(), record["updated_at"].isoformat()
        record["review"] = record["review"] or None
        if record["kind"] == Feedback.Kind.PREFERENCE:
            first, second = record["experience"], record["other"]  # services.compare: the preferred first
            decisive = record["label"] in ("a_better", "b_better")
            record["a"], record["b"] = (second, first) if record["label"] == "b_better" else (first, second)
            record["chosen"], record["rejected"] = (first, second) if decisive else (None, None)
        yield json.dumps(record) + "\n"


# What flags an experience of a run, by the trace each leaves: a flag judgement (the item page's
# one-item flag; the bulk flag, page and API, flags each item through the same service in its
# owner's or curator's name), a buffer operator that dropped it in a curation job (its status
# "rejected", `rejected_by` in its metadata: apps/buffer/curation.py), and the admin (a curator
# set its status to rejected: apps/buffer/services.set_status, which leaves no other trace).
FLAGGED_BY = ("judgement", "pipeline", "admin")


def flagged(run) -> dict:
    """How many of the run's rollouts are flagged, each once whatever flagged it, and by what
    (FLAGGED_BY; one flagged by a judgement and a pipeline counts under both). A flag judgement
    keeps its row out of training unless the run's `feedback.exclude_flagged` is off; the others
    reject it. Counted among what the queue hands out (QUEUED_SOURCES): human edits are the
    annotators' own rows (human_edits)."""
    judged = Exists(Feedback.objects.filter(experience_id=OuterRef("pk"), kind=Feedback.Kind.FLAG))
    rejected, by_operator = Q(status=Experience.Status.REJECTED), Q(metadata__has_key="rejected_by")
    counts = (
        Experience.objects.filter(run=run, source__in=QUEUED_SOURCES)
        .alias(judged=judged)
        .aggregate(
            total=Count("pk", filter=Q(judged=True) | rejected),
            judgement=Count("pk", filter=Q(judged=True)),
            pipeline=Count("pk", filter=rejected & by_operator),
            admin=Count("pk", filter=rejected & ~by_operator & Q(judged=False)),
        )
    )
    return {"flagged_experiences": counts.pop("total"), "flagged_by": {name: counts[name] for name in FLAGGED_BY}}


def summary(run) -> dict:
    """What the run page shows of human feedback: judgements by kind; what reaches training (rated,
    flagged, edits, DPO pairs) as the trainer takes it, through the trainer's own queries
    (store.trained_ratings, store.judged_pairs), so on a run that requires review only once
    accepted, and never a flagged row; beside them what was judged and then flagged, as Argilla
    and Label Studio show submitted beside discarded ("rated 12, 2 flagged: not trained on"); the
    judgements waiting for a reviewer, by kind; and the human reward (mean normalised rating of
    the rated rows that train) overall and per explorer step."""
    feedback = Feedback.objects.filter(experience__run=run)
    counts = dict.fromkeys(Feedback.Kind.values, 0) | dict(feedback.values_list("kind").annotate(n=Count("pk")))
    waiting = feedback.filter(review=Feedback.Review.PENDING).values_list("kind").annotate(n=Count("pk"))
    rows = Experience.objects.filter(run=run)
    rated = trained_ratings(rows)
    human = KeyTextTransform(HUMAN_REWARD, "reward_components")
    by_step = (
        rated.values("explorer_step")
        .annotate(mean=Avg(Cast(human, FloatField())), n=Count("pk"))
        .order_by("explorer_step")
    )
    steps = [{"explorer_step": row["explorer_step"], "human_reward": row["mean"], "rated": row["n"]} for row in by_step]
    total = sum(s["rated"] for s in steps)
    # The run's config parsed once: the page asks every 5 s (it was parsed three times a call).
    section = feedback_settings(run)
    per_item = judgements_per_item(run, section)
    # Rated, but judged by fewer than judgements_per_item annotators so far: not an item's reward
    # yet (services.set_human_reward). Without it a run judged twice per item showed "rated 0"
    # after an annotator's three ratings, as if they had been lost. One judged by all whose rating
    # waits for a reviewer is counted under waiting_for_review instead.
    rated_once = Exists(Feedback.objects.filter(experience_id=OuterRef("pk"), kind=Feedback.Kind.RATING,
                                                review__in=Feedback.TRAINED))
    waiting_judgements = (rows.exclude(reward_components__has_key=HUMAN_REWARD)
                          .exclude(status=Experience.Status.REJECTED).filter(rated_once)
                          .alias(judges=judge_count(OuterRef("pk"))).filter(judges__lt=per_item)
                          .count())
    # A pending or rejected edit has no human_edit row; a row flagged, or undone after a step used
    # it, is rejected: never sampled again.
    edits = rows.filter(source=Experience.Source.HUMAN_EDIT).exclude(status=Experience.Status.REJECTED)
    # Every judged pair, and those a flag keeps out, in one pass: counting a pair's verdicts took
    # 0.17 s a pass at 4,000 verdicts on Postgres.
    rejected = Experience.Status.REJECTED
    pairs = judged_pairs([run.pk], exclude_flagged=False, per_item={run.pk: per_item}).aggregate(
        all=Count("pk"), flagged=Count("pk", filter=Q(experience__status=rejected) | Q(other__status=rejected)))
    # Without exclude_flagged a flag is only recorded: every pair trains, none is set apart.
    pairs_flagged = pairs["flagged"] if section.exclude_flagged else 0
    return {
        "judgements": counts,
        "rated_experiences": total,
        "rated_waiting": waiting_judgements,
        "judgements_per_item": per_item,
        "rated_flagged": rows.filter(reward_components__has_key=HUMAN_REWARD).count() - total,
        **flagged(run),
        "human_edits": edits.count(),
        "dpo_pairs": pairs["all"] - pairs_flagged,
        "dpo_pairs_flagged": pairs_flagged,
        "waiting_for_review": dict.fromkeys(REVIEWED_KINDS, 0) | dict(waiting),
        "human_reward": sum(s["human_reward"] * s["rated"] for s in steps) / total if total else None,
        "human_reward_by_step": steps,
    }
