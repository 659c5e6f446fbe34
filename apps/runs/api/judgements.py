"""The human judgements of an experience as /api/runs/<id>/experiences/ lists them, each read from
that experience's side.

A comparison is stored once, on the preferred response (`experience`) with the one it beat as
`other` (apps/feedback/services.compare; a tie or "both bad" keeps the annotator's A first). Listed
only under `experience`, the loser showed nothing and the winner showed "b_better" beside the
loser's id, which read alone says the other won. So a comparison is listed under both of its
experiences, each saying whether this one won (`preferred`), with the raw label and `a`/`b` as the
annotator saw them, as the feedback export names them (apps/feedback/stats.export_jsonl)."""

from django.db.models import Prefetch

from apps.feedback.models import Feedback

DECISIVE = ("a_better", "b_better")  # the verdicts that make a DPO pair (services.VERDICT_VALUES: 1)


def with_judgements(experiences):
    """Experiences with their judgements fetched in two queries: those stored on them, and the
    comparisons that name them as `other`."""
    judgements = Feedback.objects.select_related("user").order_by("created_at", "pk")
    return experiences.prefetch_related(
        Prefetch("feedback", judgements, to_attr="judged"),
        Prefetch("preferred_over_by", judgements.filter(kind=Feedback.Kind.PREFERENCE), to_attr="compared_as_other"),
    )


def judgements_json(experience) -> list[dict]:
    """Every judgement of the experience (fetched by `with_judgements`), oldest first."""
    found = sorted([*experience.judged, *experience.compared_as_other], key=lambda f: (f.created_at, f.pk))
    return [judgement_json(f, experience.pk) for f in found]


def judgement_json(judgement: Feedback, experience_id: int) -> dict:
    seen = {
        "kind": judgement.kind,
        "value": judgement.value,
        "label": judgement.label,
        "edited_text": judgement.edited_text,
        "other": None,
        "preferred": None,
        "a": None,
        "b": None,
        "comment": judgement.comment,
        "annotator": judgement.user.get_username(),
        "created_at": judgement.created_at,
        # "" where the run asks no review (and for flags, which act at once): it counts as is.
        "review": judgement.review or None,
    }
    if judgement.kind == Feedback.Kind.PREFERENCE:
        seen |= comparison_seen_from(judgement, experience_id)
    return seen


def comparison_seen_from(judgement: Feedback, experience_id: int) -> dict:
    """`other`, `preferred` (true: this one won, false: it lost, null: a tie or both bad), `value`
    for this side (1 won, 0 lost, 0.5 a tie, 0 both bad) and the annotator's `a` and `b`."""
    first, second = judgement.experience_id, judgement.other_id  # the preferred one first
    this_first = experience_id == first
    decisive = judgement.label in DECISIVE
    value = judgement.value if not decisive else float(this_first)
    a, b = (second, first) if judgement.label == "b_better" else (first, second)
    return {"other": second if this_first else first, "preferred": this_first if decisive else None,
            "value": value, "a": a, "b": b}
