"""With `feedback.judgements_per_item` N, an item reaches training once N annotators have judged
it, as their combination: the mean of its ratings, the side more than half of a pair's verdicts
chose (docs/feedback.md, "Several annotators per item"). Training took an item at its first
judgement: two annotators rated 8 items 9 and 0, and the step trained on reward 1.0; opposite
verdicts on one pair both became DPO pairs."""
import pytest

from apps.buffer.models import Experience
from apps.buffer.store import DjangoExperienceBuffer
from apps.feedback import history, services, stats

pytestmark = pytest.mark.django_db


def configure(run, **feedback) -> DjangoExperienceBuffer:
    run.config = {"algorithm": {"name": "grpo", "repeat_times": 2},
                  "feedback": {"judgements_per_item": 2, "scale_min": 0, "scale_max": 9} | feedback}
    run.save()
    return DjangoExperienceBuffer(run.pk)


def human(experience) -> float | None:
    return Experience.objects.get(pk=experience.pk).reward_components.get("human")


def test_a_rating_trains_once_the_items_judgements_are_in_as_their_mean(run, make_experience, make_annotator):
    buffer = configure(run, reward_mode="override", rated_only=True, rating_wait_s=0)
    a1, a2 = make_annotator("a1"), make_annotator("a2")
    item, other = make_experience(), make_experience()
    services.rate(item.pk, a1, "9")
    services.rate(other.pk, a1, "9")
    assert human(item) is None  # 1 of 2: not rated yet
    assert buffer.sample(2, sources=["rollout"]) == []
    assert stats.summary(run)["rated_experiences"] == 0

    services.rate(item.pk, a2, "0")
    assert human(item) == 0.5
    assert [(e.id, e.reward) for e in buffer.sample(2, sources=["rollout"])] == [(item.pk, 0.5)]
    assert stats.summary(run)["rated_experiences"] == 1
    # The second rating undone: the item is short of its 2 again (it was not trained on: sampled only).
    Experience.objects.update(claimed_at=None, claimed_by=None)
    history.undo_last(run, a2)
    assert human(item) is None and buffer.sample(2, sources=["rollout"]) == []


@pytest.mark.parametrize("second", ["edit", "flag", "compare"])
def test_a_place_taken_by_another_kind_of_judgement_completes_the_items_rating(
    run, tasks, make_experience, make_annotator, second
):
    """The queue hands an item to N annotators, whatever each does with it: rated by one and edited,
    flagged (recorded only) or compared by the other, it waited under rated_only for a second rating
    no one could give. Its rating is the mean of the ratings it has; an undone judgement reopens it."""
    buffer = configure(run, reward_mode="override", rated_only=True, rating_wait_s=0, exclude_flagged=False)
    a1, a2 = make_annotator("a1"), make_annotator("a2")
    item, other = make_experience(task=tasks[0]), make_experience(task=tasks[0])
    services.rate(item.pk, a1, "9")
    assert human(item) is None and stats.summary(run)["rated_waiting"] == 1
    if second == "edit":
        services.edit(item.pk, a2, "a better answer", confirmed=True)
    elif second == "flag":
        services.flag(item.pk, a2, "wrong")
    else:
        services.compare(other.pk, item.pk, a2, "a_better")

    assert human(item) == 1.0
    assert [e.id for e in buffer.sample(1, sources=["rollout"])] == [item.pk]
    summary = stats.summary(run)
    assert (summary["rated_experiences"], summary["rated_waiting"]) == (1, 0)
    Experience.objects.update(claimed_at=None, claimed_by=None)
    history.undo_last(run, a2)
    assert human(item) is None


def test_an_item_judged_by_all_whose_rating_waits_for_review_is_not_shown_waiting_for_judgements(
    run, make_experience, make_annotator, curator
):
    """The tile said "1 more waiting for 2 judgements each" of an item both annotators had judged:
    it waits for a reviewer, and the page counts it there."""
    from apps.feedback import review
    from apps.feedback.models import Feedback

    configure(run, require_review=True)
    a1, a2 = make_annotator("a1"), make_annotator("a2")
    item = make_experience()
    services.rate(item.pk, a1, "9")
    services.rate(item.pk, a2, "0")
    review.decide(Feedback.objects.get(experience=item, user=a1).pk, curator, accept=True)
    summary = stats.summary(run)
    assert (summary["rated_experiences"], summary["rated_waiting"]) == (0, 0)
    assert summary["waiting_for_review"]["rating"] == 1


def test_with_one_annotator_per_item_the_first_rating_is_the_items(run, make_experience, annotator):
    configure(run, judgements_per_item=1)
    item = make_experience()
    services.rate(item.pk, annotator, "9")
    assert human(item) == 1.0


def test_a_pair_trains_as_the_majority_of_its_verdicts_and_opposite_ones_make_no_pair(
    run, tasks, make_experience, make_annotator
):
    buffer = configure(run)
    a1, a2 = make_annotator("a1"), make_annotator("a2")
    agreed, opposed, tied, alone = [(make_experience(task=t), make_experience(task=t)) for t in tasks]
    for (first, second), verdicts in [(agreed, ["a_better", "a_better"]), (opposed, ["a_better", "b_better"]),
                                      (tied, ["b_better", "tie"]), (alone, ["a_better"])]:
        for judge, verdict in zip((a1, a2), verdicts):
            services.compare(first.pk, second.pk, judge, verdict)

    pairs = buffer.sample_pairs(10, max_uses=1)

    assert len(pairs) == 1  # one pair however many agreed, not one per annotator
    assert (pairs[0].chosen_ids, pairs[0].rejected_ids) == (agreed[0].response_ids, agreed[1].response_ids)
    assert stats.summary(run)["dpo_pairs"] == 1
    # The pair's second verdict, once in, makes the lone one a pair.
    services.compare(alone[1].pk, alone[0].pk, a2, "b_better")  # from B's side: A is better
    assert [(p.chosen_ids, p.rejected_ids) for p in buffer.sample_pairs(10, max_uses=1)] == [
        (alone[0].response_ids, alone[1].response_ids)]
