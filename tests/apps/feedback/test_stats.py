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


def test_the_trained_figures_leave_out_what_was_flagged_after_it_was_judged_as_the_trainer_does(
    researcher_client, run, make_experience, make_annotator
):
    """Rated 3, of which one an annotator flagged and one a curator rejected: the page said 3 rated
    and a human reward of 0.5 while the trainer read one rating (1.0). The trained figures are the
    trainer's own queries; what was judged and then flagged is counted beside them."""
    from apps.buffer import services as buffer
    from apps.buffer.models import Experience
    from apps.buffer.store import DjangoExperienceBuffer

    a = make_annotator("a")  # one annotator per item: each judgement counts at once
    kept, flagged, rejected, unrated = (make_experience() for _ in range(4))
    services.compare(kept.pk, flagged.pk, a, "a_better")
    for item, point in ((kept, "5"), (flagged, "1"), (rejected, "3")):
        services.rate(item.pk, a, point)
    services.flag(flagged.pk, a, "wrong")
    buffer.set_status(Experience.objects.filter(pk=rejected.pk), Experience.Status.REJECTED)

    summary = researcher_client.get(reverse("annotate-run-summary", args=[run.pk])).json()
    assert (summary["rated_experiences"], summary["rated_flagged"]) == (1, 2)
    assert summary["human_reward"] == 1.0
    assert summary["human_reward_by_step"] == [{"explorer_step": 0, "human_reward": 1.0, "rated": 1}]
    # Flagged: one by a flag judgement, one rejected by a curator in the admin.
    assert (summary["dpo_pairs"], summary["dpo_pairs_flagged"], summary["flagged_experiences"]) == (0, 1, 2)
    api = researcher_client.get(reverse("api-run-annotation", args=[run.pk])).json()
    assert {key: api[key] for key in summary if key != "human_reward_by_step"} == {
        key: value for key, value in summary.items() if key != "human_reward_by_step"}

    trainer = DjangoExperienceBuffer(run.pk)
    sampled = trainer.sample(10, sources=["rollout"])
    assert sorted(e.id for e in sampled) == [kept.pk, unrated.pk]
    assert [e.id for e in sampled if "human" in e.reward_components] == [kept.pk]  # one rating trains
    assert trainer.sample_pairs(10) == []  # the flagged pair: not a DPO pair


def test_without_exclude_flagged_a_flag_is_recorded_and_everything_still_counts(
    researcher_client, run, make_experience, make_annotator
):
    run.config = {**run.config, "feedback": {**run.config["feedback"], "exclude_flagged": False}}
    run.save(update_fields=["config"])
    a = make_annotator("a")  # one annotator per item: each judgement counts at once
    first, second = make_experience(), make_experience()
    services.compare(first.pk, second.pk, a, "a_better")
    services.rate(second.pk, a, "1")
    services.flag(second.pk, a, "wrong")
    summary = stats.summary(run)
    assert (summary["rated_experiences"], summary["rated_flagged"]) == (1, 0)
    assert (summary["dpo_pairs"], summary["dpo_pairs_flagged"], summary["flagged_experiences"]) == (1, 0, 1)


def test_the_summary_reads_the_runs_feedback_settings_once(run, make_experience, make_annotator, monkeypatch):
    """It parsed the run's config twice a call (its own exclude_flagged, judgements_per_item's),
    and the run page asks every 5 s."""
    run.config = {**run.config, "feedback": {**run.config["feedback"], "judgements_per_item": 2}}
    run.save(update_fields=["config"])
    services.rate(make_experience().pk, make_annotator("a"), "4")
    parsed = []
    read = services.feedback_settings
    monkeypatch.setattr(services, "feedback_settings", lambda run: parsed.append(run.pk) or read(run))
    monkeypatch.setattr(stats, "feedback_settings", services.feedback_settings)

    summary = stats.summary(run)

    assert parsed == [run.pk]
    assert (summary["judgements_per_item"], summary["rated_waiting"]) == (2, 1)


def test_flagged_experiences_counts_every_flag_once_whatever_flagged_it(
    researcher_client, run, make_experience, make_annotator, tasks
):
    """An annotator's flag, a bulk flag (page and API: the same service), a curator's rejection in
    the admin and a buffer operator's each flag a rollout; counted once each, and by what. The
    count was of flag judgements alone: 3 here, as if nothing else had flagged anything."""
    from apps.buffer import services as buffer
    from apps.buffer.curation import start_pipeline
    from apps.buffer.models import Experience
    from apps.core.jobs import run_job
    from apps.feedback import bulk
    from apps.feedback.queue_filter import QueueFilter

    annotator = make_annotator("a")
    by_annotator, by_bulk, by_curator, twice, untouched = (make_experience(explorer_step=step) for step in range(5))
    kept, dropped = (make_experience(task=tasks[3], response_ids=[7, 7], explorer_step=9) for _ in range(2))
    services.flag(by_annotator.pk, annotator, "wrong")
    flagged = bulk.flag_all(run, run.owner, QueueFilter(step_min=1, step_max=1), "garbled", confirmed_count=1)
    assert len(flagged.feedback_ids) == 1
    buffer.set_status(Experience.objects.filter(pk__in=[by_curator.pk, twice.pk]), Experience.Status.REJECTED)
    services.flag(twice.pk, annotator, "harmful")  # rejected already: the flag is recorded beside it
    job = run_job("buffer.bufferjob", start_pipeline(Experience.objects.filter(pk__in=[kept.pk, dropped.pk]),
                                                     operator="dedupe", params={}).pk)
    assert job.status == "succeeded", job.error
    assert Experience.objects.get(pk=dropped.pk).metadata["rejected_by"] == "dedupe"
    # Not a rollout of the run: a human edit's row rejected (an undone edit that had trained) is no flag.
    make_experience(source=Experience.Source.HUMAN_EDIT, status=Experience.Status.REJECTED)

    summary = researcher_client.get(reverse("annotate-run-summary", args=[run.pk])).json()
    assert summary["flagged_experiences"] == 5  # by_annotator, by_bulk, by_curator, twice, dropped
    assert summary["flagged_by"] == {"judgement": 3, "pipeline": 1, "admin": 1}
    assert summary["judgements"]["flag"] == 3
    api = researcher_client.get(reverse("api-run-annotation", args=[run.pk])).json()
    assert (api["flagged_experiences"], api["flagged_by"]) == (5, summary["flagged_by"])
    assert untouched.pk not in flagged.feedback_ids
