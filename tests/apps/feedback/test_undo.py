"""Undo (apps/feedback/history.py): only one's own judgement; it takes the judgement's effect out
of the buffer and puts the item back in front of the annotator; training that already used it
is said (while the run trains) or protected (once it has finished). And the reference check of
edits (apps/feedback/reference.py)."""
import pytest
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback import history, queue, services
from apps.feedback.models import AnnotationLock, Feedback
from apps.feedback.reference import contradiction
from apps.runs.models import MetricPoint, Run


def test_undoing_a_rating_takes_it_out_of_the_reward_and_reopens_the_item(make_experience, annotator):
    item = make_experience()
    services.rate(item.pk, annotator, "4")
    assert not AnnotationLock.objects.exists()
    undone = history.undo_last(item.run, annotator)
    item.refresh_from_db()
    assert "human" not in item.reward_components and not Feedback.objects.exists()
    assert (undone.experience.pk, undone.trained_on_step, undone.reopened) == (item.pk, None, True)
    assert undone.message == f"Undid your judgement of experience {item.pk} (rated 4)."
    # Back in front of the queue: the annotator holds it again, and the queue hands it back first.
    assert AnnotationLock.objects.get().experience_id == item.pk
    assert queue.next_item(item.run, annotator) == item


def test_undo_leaves_the_item_to_the_other_annotators_ratings(make_experience, annotator, make_annotator, run):
    run.config = {"feedback": {"judgements_per_item": 2}}
    run.save()
    item = make_experience()
    other = make_annotator("other")
    services.rate(item.pk, other, "1")
    services.rate(item.pk, annotator, "5")
    history.undo_last(run, annotator)
    item.refresh_from_db()
    assert "human" not in item.reward_components  # the other's rating alone is 1 of the item's 2
    services.rate(item.pk, annotator, "4")  # the item is back in front of the annotator, who rates it again
    item.refresh_from_db()
    assert item.reward_components["human"] == 0.375  # 1 and 4 on 1-5: the mean of 0 and 0.75


def test_nobody_undoes_another_annotators_judgement_and_the_error_tells_nothing_of_it(make_experience, annotator,
                                                                                      make_annotator):
    item = make_experience()
    theirs = services.rate(item.pk, make_annotator("other"), "4")
    with pytest.raises(history.NothingToUndo, match=f"you have no judgement {theirs.pk} to undo"):
        history.undo(theirs.pk, annotator)
    with pytest.raises(history.NothingToUndo, match="no judgement on this run"):
        history.undo_last(item.run, annotator)
    assert Feedback.objects.get().pk == theirs.pk
    item.refresh_from_db()
    assert item.reward_components["human"] == 0.75


def test_a_rating_trained_on_while_the_run_trains_is_undone_for_future_training_and_says_at_which_step(
    make_experience, annotator, run
):
    item = make_experience()
    services.rate(item.pk, annotator, "4")
    # A trainer step samples the rollout (reading the rating), then marks it consumed and records step 3.
    Experience.objects.filter(pk=item.pk).update(status="consumed", consumed_at=timezone.now(), use_count=1)
    MetricPoint.objects.create(run=run, role="trainer", step=3, values={"loss": 0.1})
    assert history.history(run, annotator)[0]["trained_on_step"] == 3
    undone = history.undo_last(run, annotator)
    assert undone.trained_on_step == 3
    assert "already trained on at step 3: undo removes it from future training only" in undone.message
    item.refresh_from_db()
    assert "human" not in item.reward_components  # a rewound step would train on it without the rating


def test_a_finished_run_keeps_what_it_trained_on_but_an_untrained_judgement_can_be_undone(
    make_experience, annotator, run
):
    trained, untrained = make_experience(), make_experience()
    services.rate(trained.pk, annotator, "4")
    services.rate(untrained.pk, annotator, "2")
    Experience.objects.filter(pk=trained.pk).update(status="consumed", consumed_at=timezone.now(), use_count=1)
    MetricPoint.objects.create(run=run, role="trainer", step=7, values={"loss": 0.1})
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    rating = Feedback.objects.get(experience=trained)
    with pytest.raises(history.TooLateToUndo, match="trained on at step 7 and the run has completed"):
        history.undo(rating.pk, annotator)
    assert Feedback.objects.filter(pk=rating.pk).exists()
    trained.refresh_from_db()
    assert trained.reward_components["human"] == 0.75
    undone = history.undo(Feedback.objects.get(experience=untrained).pk, annotator)
    assert undone.trained_on_step is None and not Feedback.objects.filter(experience=untrained).exists()


def test_undoing_an_edit_deletes_its_unused_row_and_rejects_a_used_one(make_experience, annotator, run):
    unused, used = make_experience(), make_experience()  # both answer task 0: reference 0
    services.edit(unused.pk, annotator, "0 + 0 = 0")
    services.edit(used.pk, annotator, "it is 0")
    Experience.objects.filter(parent=used).update(use_count=2)  # two expert steps trained on it
    MetricPoint.objects.create(run=run, role="trainer", step=5, values={"expert_experiences": 1})
    history.undo(Feedback.objects.get(experience=unused).pk, annotator)
    assert not Experience.objects.filter(parent=unused).exists()
    undone = history.undo(Feedback.objects.get(experience=used).pk, annotator)
    assert undone.trained_on_step == 5
    # Kept as the record of what trained, never sampled again.
    assert Experience.objects.get(parent=used).status == "rejected"


def test_undoing_a_flag_puts_the_item_back_into_training_unless_another_annotator_flagged_it(
    make_experience, annotator, make_annotator, run
):
    run.config = {"feedback": {"judgements_per_item": 2}}
    run.save()
    alone, shared = make_experience(), make_experience()
    services.flag(alone.pk, annotator, "garbled")
    services.flag(shared.pk, annotator, "wrong")
    services.flag(shared.pk, make_annotator("other"), "wrong")
    assert history.history(run, annotator)[0]["trained_on_step"] is None  # a flag trains nothing
    history.undo(Feedback.objects.get(experience=alone).pk, annotator)
    history.undo(Feedback.objects.get(experience=shared, user=annotator).pk, annotator)
    assert Experience.objects.get(pk=alone.pk).status == "ready"
    assert Experience.objects.get(pk=shared.pk).status == "rejected"


def test_undoing_a_b_better_comparison_reopens_the_item_shown_as_a(make_experience, annotator, run):
    a, b = make_experience(), make_experience()
    services.compare(a.pk, b.pk, annotator, "b_better")
    entry = history.history(run, annotator)[0]
    assert (entry["item"], entry["summary"]) == (a.pk, "compared: B is better")
    undone = history.undo(entry["id"], annotator)
    assert undone.experience.pk == a.pk and not Feedback.objects.exists()
    assert AnnotationLock.objects.get().experience_id == a.pk


def test_a_pair_counts_as_trained_on_once_a_dpo_step_reading_it_ran(make_experience, annotator, researcher, run):
    a, b = make_experience(), make_experience()
    services.compare(a.pk, b.pk, annotator, "a_better")
    dpo = Run.objects.create(name="dpo", owner=researcher, status=Run.Status.RUNNING,
                             config={"feedback": {"source_runs": [run.pk]}})
    MetricPoint.objects.create(run=dpo, role="trainer", step=1, values={"loss": 0.3})  # no pairs yet
    assert history.history(run, annotator)[0]["trained_on_step"] is None
    MetricPoint.objects.create(run=dpo, role="trainer", step=2, values={"pairs": 1})
    assert history.history(run, annotator)[0]["trained_on_step"] == 2


def test_history_lists_the_annotators_newest_judgements_and_the_session_count(make_experience, annotator,
                                                                               make_annotator, run):
    started = timezone.now()
    items = [make_experience() for _ in range(3)]
    services.rate(items[0].pk, annotator, "1")
    services.flag(items[1].pk, annotator, "harmful")
    services.rate(items[2].pk, make_annotator("other"), "5")  # not theirs
    assert [(e["item"], e["summary"]) for e in history.history(run, annotator)] == [
        (items[1].pk, "flagged as harmful"), (items[0].pk, "rated 1")
    ]
    assert history.session_count(run, annotator, started) == 2
    assert history.session_count(run, annotator, timezone.now()) == 0


@pytest.mark.parametrize("text, asks", [
    ("The answer is 4.", True), ("0 + 0 = 0", False), ("<answer>0</answer>", False), ("zero", True),
])
def test_an_edit_is_checked_against_the_reference_answer_with_the_runs_answer_check(make_experience, text, asks):
    item = make_experience()  # "What is 0 + 0?", reference 0
    question = contradiction(item, text)
    assert (question == "The reference answer is 0; your edit's answer differs. Save anyway?") if asks else (
        question is None
    )


def test_the_runs_numeric_tolerance_is_the_check_and_a_task_without_a_reference_is_not_checked(
    make_experience, run, tasks
):
    run.config = {"explorer": {"reward_fn": {"numeric": {"weight": 1.0, "tolerance": 0.5}}}}
    run.save()
    item = make_experience(task=tasks[1])  # reference 2
    assert contradiction(item, "about 2.4") is None and contradiction(item, "3") is not None
    tasks[1].answer = ""
    tasks[1].save()
    assert contradiction(Experience.objects.get(pk=item.pk), "3") is None


def test_a_contradicting_edit_is_saved_only_once_confirmed(make_experience, annotator):
    item = make_experience()
    with pytest.raises(services.NeedsConfirmation, match="The reference answer is 0"):
        services.edit(item.pk, annotator, "It is 7.")
    assert not Feedback.objects.exists() and not Experience.objects.filter(parent=item).exists()
    services.edit(item.pk, annotator, "It is 7.", confirmed=True)
    assert Experience.objects.get(parent=item).response_text == "It is 7."


def test_a_rating_in_a_run_that_does_not_train_on_ratings_is_never_trained_on(make_experience, annotator, run):
    """Issue #42, finding 8: every rating's history said "trained on at step 20" in a run whose
    feedback.reward_mode is none (and not rated_only): the row was trained on, the rating changed
    nothing of it."""
    Run.objects.filter(pk=run.pk).update(config={"feedback": {"reward_mode": "none"}})
    experience = make_experience()
    rating = Feedback.objects.create(experience=experience, user=annotator, kind="rating", value=1.0)
    Experience.objects.filter(pk=experience.pk).update(status="consumed", consumed_at=timezone.now(), use_count=1)
    MetricPoint.objects.create(run=run, role="trainer", step=20, values={"loss": 0.5})
    assert history.trained_on(Feedback.objects.select_related("experience__run").get(pk=rating.pk)) is None
    Run.objects.filter(pk=run.pk).update(config={"feedback": {"rated_only": True}})
    assert history.trained_on(Feedback.objects.select_related("experience__run").get(pk=rating.pk)) == 20
