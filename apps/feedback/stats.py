"""Progress and quality of the human feedback on a run: who did how much, how fast, and how far
annotators agree. Reads only."""
import itertools
import json
from collections import defaultdict

from django.db.models import Avg, Count, FloatField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from .models import Feedback


def per_annotator(run) -> list[dict]:
    """Judgements and mean seconds per item, per annotator and kind."""
    rows = (
        Feedback.objects.filter(experience__run=run)
        .values("user__username", "kind")
        .annotate(count=Count("pk"), mean_seconds=Avg("seconds_spent"))
        .order_by("user__username", "kind")
    )
    return [
        {"annotator": r["user__username"], "kind": r["kind"], "count": r["count"], "mean_seconds": r["mean_seconds"]}
        for r in rows
    ]


def _ratings_by_item(run) -> list[list[float]]:
    """The ratings of each item rated more than once."""
    by_item = defaultdict(list)
    ratings = Feedback.objects.filter(experience__run=run, kind=Feedback.Kind.RATING)
    for experience_id, value in ratings.values_list("experience_id", "value"):
        by_item[experience_id].append(value)
    return [values for values in by_item.values() if len(values) > 1]


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


def agreement(run) -> dict:
    units = _ratings_by_item(run)
    return {
        "items_rated_more_than_once": len(units),
        "percent_agreement": percent_agreement(units),
        "krippendorff_alpha": krippendorff_alpha_interval(units),
    }


def export_jsonl(run):
    """The run's feedback, one JSON object a line (streamed: a run's feedback can be large)."""
    rows = (
        Feedback.objects.filter(experience__run=run)
        .order_by("pk")
        .values_list("pk", "experience_id", "user__username", "kind", "value", "label", "edited_text", "other_id",
                     "comment", "seconds_spent", "created_at", "updated_at")
    )
    names = ("id", "experience", "annotator", "kind", "value", "label", "edited_text", "other", "comment",
             "seconds_spent", "created_at", "updated_at")
    for row in rows.iterator(chunk_size=2000):
        record = dict(zip(names, row))
        record["created_at"], record["updated_at"] = record["created_at"].isoformat(), record["updated_at"].isoformat()
        yield json.dumps(record) + "\n"


def summary(run) -> dict:
    """What the run page shows of human feedback: judgements by kind, what reached the buffer
    (rated, flagged, edits, DPO pairs), and the human reward (mean normalised rating) overall and
    per explorer step."""
    from apps.buffer.models import Experience

    from .services import HUMAN_REWARD

    feedback = Feedback.objects.filter(experience__run=run)
    counts = dict.fromkeys(Feedback.Kind.values, 0) | dict(feedback.values_list("kind").annotate(n=Count("pk")))
    rated = Experience.objects.filter(run=run, reward_components__has_key=HUMAN_REWARD)
    human = KeyTextTransform(HUMAN_REWARD, "reward_components")
    by_step = (
        rated.values("explorer_step")
        .annotate(mean=Avg(Cast(human, FloatField())), n=Count("pk"))
        .order_by("explorer_step")
    )
    steps = [{"explorer_step": row["explorer_step"], "human_reward": row["mean"], "rated": row["n"]} for row in by_step]
    total = sum(s["rated"] for s in steps)
    return {
        "judgements": counts,
        "rated_experiences": total,
        "flagged_experiences": feedback.filter(kind=Feedback.Kind.FLAG).values("experience").distinct().count(),
        "human_edits": Experience.objects.filter(run=run, source=Experience.Source.HUMAN_EDIT).count(),
        "dpo_pairs": feedback.filter(kind=Feedback.Kind.PREFERENCE, value=1.0).count(),
        "human_reward": sum(s["human_reward"] * s["rated"] for s in steps) / total if total else None,
        "human_reward_by_step": steps,
    }
