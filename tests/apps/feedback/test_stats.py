"""Per-annotator progress, agreement between annotators, and the JSONL export."""
import json

import pytest
from django.urls import reverse

from apps.feedback import services, stats

pytestmark = pytest.mark.django_db


def test_krippendorff_alpha_interval():
    assert stats.krippendorff_alpha_interval([[1, 1], [0, 0]]) == 1.0
    # Observed disagreement 1, expected 2/3 (hand-computed): alpha = 1 - 1.5.
    assert stats.krippendorff_alpha_interval([[1, 0], [0, 1]]) == pytest.approx(-0.5)
    assert stats.krippendorff_alpha_interval([[1], [0]]) is None  # nothing rated twice
    assert stats.percent_agreement([[1, 1, 0], [0.5, 0.5]]) == pytest.approx(2 / 4)


def test_a_run_page_counts_per_annotator_and_measures_agreement(
    researcher_client, run, make_experience, make_annotator, settings
):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = 2
    a, b = make_annotator("a"), make_annotator("b")
    same, different = make_experience(), make_experience()
    for user, points in ((a, ("5", "1")), (b, ("5", "5"))):
        services.rate(same.pk, user, points[0], seconds_spent=4)
        services.rate(different.pk, user, points[1], seconds_spent=8)
    none_reviewed = {"pending": 0, "accepted": 0, "rejected": 0}  # the run asks no review
    assert stats.per_annotator(run) == [
        {"annotator": "a", "kind": "rating", "count": 2, "mean_seconds": 6.0, **none_reviewed},
        {"annotator": "b", "kind": "rating", "count": 2, "mean_seconds": 6.0, **none_reviewed},
    ]
    assert stats.agreement(run)["percent_agreement"] == 0.5
    page = researcher_client.get(reverse("annotate-run-feedback", args=[run.pk]))
    assert page.status_code == 200 and b"50%" in page.content


def test_feedback_exports_as_jsonl(researcher_client, run, make_experience, annotator):
    experience = make_experience()
    services.flag(experience.pk, annotator, "wrong", comment="2 + 2 is not 5")
    response = researcher_client.get(reverse("annotate-export", args=[run.pk]))
    lines = b"".join(response).decode().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 1
    assert {k: record[k] for k in ("experience", "annotator", "kind", "label", "comment", "review")} == {
        "experience": experience.pk, "annotator": "ann", "kind": "flag", "label": "wrong", "comment": "2 + 2 is not 5",
        "review": None,  # flags act at once; judgements on a run with feedback.require_review say pending...
    }


def test_a_comparison_exports_as_the_annotator_saw_it(researcher_client, run, make_experience, annotator,
                                                      make_annotator):
    a, b, c, d = (make_experience() for _ in range(4))  # two answers to each of two prompts
    services.compare(a.pk, b.pk, annotator, "b_better")
    services.compare(d.pk, c.pk, make_annotator("other"), "tie")
    lines = b"".join(researcher_client.get(reverse("annotate-export", args=[run.pk]))).decode().splitlines()
    shown = [{k: json.loads(line)[k] for k in ("label", "a", "b", "chosen", "rejected")} for line in lines]
    assert shown == [
        {"label": "b_better", "a": a.pk, "b": b.pk, "chosen": b.pk, "rejected": a.pk},
        {"label": "tie", "a": d.pk, "b": c.pk, "chosen": None, "rejected": None},
    ]


def test_annotators_cannot_export(annotator_client, run):
    assert annotator_client.get(reverse("annotate-export", args=[run.pk])).status_code == 403
