"""Human feedback reaches training through the Postgres buffer (apps/buffer/store.py): rated
rollouts carry their human reward and recomputed group advantages, flagged ones are never
sampled, human edits are expert data, and a DPO run trains on the pairs of another run."""
import time

import pytest
import torch

from apps.buffer.models import Experience
from apps.buffer.store import DjangoExperienceBuffer
from apps.feedback import services
from apps.feedback.models import PairUse
from apps.runs.models import Run
from workers.rft.algorithms import grpo
from workers.rft.config import RunConfig

pytestmark = pytest.mark.django_db


def configure(run, algorithm="grpo", **feedback):
    run.config = {"algorithm": {"name": algorithm, "repeat_times": 4}, "feedback": feedback}
    run.save()
    return DjangoExperienceBuffer(run.pk)


def group_of_four(make_experience, task, rewards=(0.0, 0.0, 0.0, 0.0)):
    return [
        make_experience(
            task=task, group_id=f"g-{task.pk}", reward=r, reward_components={"exact_match": r}, advantage=0.0
        )
        for r in rewards
    ]


def test_rated_rollouts_train_with_their_human_reward_and_recomputed_group_advantages(
    run, tasks, make_experience, make_annotator
):
    buffer = configure(run, reward_mode="override")
    group = group_of_four(make_experience, tasks[0])
    for member, point in zip(group[:3], ["5", "1", "3"]):
        services.rate(member.pk, make_annotator(f"judge-{member.pk}"), point)
    Experience.objects.filter(pk=group[2].pk).update(status="consumed")  # trained on already: still in the group

    sampled = {e.id: e for e in buffer.sample(10, sources=["rollout"])}

    assert set(sampled) == {group[0].pk, group[1].pk, group[3].pk}
    # The unrated rollout counts as the group's mean rating (0.5).
    expected, _ = grpo(torch.tensor([1.0, 0.0, 0.5, 0.5]), ["g"] * 4, epsilon=1e-6)
    assert [sampled[m.pk].reward for m in (group[0], group[1], group[3])] == [1.0, 0.0, 0.5]
    assert [sampled[m.pk].advantage for m in (group[0], group[1], group[3])] == pytest.approx(
        [expected[0].item(), expected[1].item(), expected[3].item()]
    )
    assert Experience.objects.get(pk=group[0].pk).reward == 0.0  # the stored rule reward is left as it was


def test_without_a_reward_mode_ratings_change_nothing_the_trainer_sees(run, tasks, make_experience, annotator):
    buffer = configure(run)  # reward_mode: none
    group = group_of_four(make_experience, tasks[0], rewards=(1.0, 0.0, 0.0, 0.0))
    services.rate(group[1].pk, annotator, "5")
    sampled = {e.id: e for e in buffer.sample(10, sources=["rollout"])}
    assert (sampled[group[1].pk].reward, sampled[group[1].pk].advantage) == (0.0, 0.0)


def test_flagged_rollouts_are_never_sampled_nor_compared(run, tasks, make_experience, annotator, make_annotator):
    buffer = configure(run, reward_mode="override")
    group = group_of_four(make_experience, tasks[0])
    services.flag(group[0].pk, annotator, "harmful")
    services.rate(group[1].pk, make_annotator("b"), "5")
    services.rate(group[2].pk, make_annotator("c"), "1")
    sampled = {e.id: e for e in buffer.sample(10, sources=["rollout"])}
    assert group[0].pk not in sampled
    expected, _ = grpo(torch.tensor([1.0, 0.0, 0.5]), ["g"] * 3, epsilon=1e-6)  # the unrated one: the mean rating
    assert sampled[group[1].pk].advantage == pytest.approx(expected[0].item())


def test_rated_only_trains_on_rated_rollouts_and_waits_a_bounded_time_for_ratings(
    run, tasks, make_experience, annotator, make_annotator
):
    buffer = configure(run, reward_mode="override", rated_only=True, rating_wait_s=1.0)
    group = group_of_four(make_experience, tasks[0])
    started = time.monotonic()
    assert buffer.sample(4, sources=["rollout"]) == []  # nothing rated: waited, then nothing to train on
    assert time.monotonic() - started >= 1.0
    services.rate(group[0].pk, annotator, "5")
    services.rate(group[1].pk, make_annotator("b"), "2")
    sampled = {e.id: e for e in buffer.sample(4, sources=["rollout"])}
    assert set(sampled) == {group[0].pk, group[1].pk}
    # The group compares its rated members only: the unrated ones carry no reward under override.
    # Two ratings, mean in the middle, sample std √2 times the half-gap: ±1/√2 (GRPO's unbiased std).
    assert sampled[group[0].pk].advantage == pytest.approx(0.7071068, abs=1e-4)
    assert sampled[group[1].pk].advantage == pytest.approx(-0.7071068, abs=1e-4)


def test_human_edits_are_expert_data_unless_the_run_says_otherwise(run, tasks, make_experience, annotator, researcher):
    run.config = {"model": {"path": "tiny"}}
    run.save()
    original = make_experience()
    services.edit(original.pk, annotator, "The answer is 0.")
    edit = Experience.objects.get(source="human_edit")
    buffer = configure(run, "sft")  # expert data: what sft (and mix) trains on
    assert [e.id for e in buffer.sample(5, sources=["expert", "human_edit"])] == [edit.pk]
    Experience.objects.update(claimed_at=None)
    assert configure(run, "sft", edits_as_expert=False).sample(5, sources=["expert", "human_edit"]) == []
    # Another run trains on this run's edits when it names it as a feedback source.
    sft = Run.objects.create(name="sft", owner=researcher,
                             config={"algorithm": {"name": "sft"}, "feedback": {"source_runs": [run.pk]}})
    sampled = DjangoExperienceBuffer(sft.pk).sample(5, sources=["expert", "human_edit"])
    assert [e.response_text for e in sampled] == ["The answer is 0."]


def test_a_dpo_run_in_mode_train_trains_on_the_pairs_collected_on_another_run(
    run, tasks, make_experience, make_annotator, researcher
):
    from workers.rft.models import load_policy, load_reference, load_tokenizer
    from workers.rft.trainer import Trainer

    pairs, judges = [], [make_annotator(f"j{i}") for i in range(3)]
    for i, verdict in enumerate(["a_better", "b_better", "tie"]):
        a, b = make_experience(task=tasks[i]), make_experience(task=tasks[i])
        pairs.append(services.compare(a.pk, b.pk, judges[i], verdict))
    services.flag(pairs[1].experience_id, judges[1], "wrong")  # a flagged response trains nothing
    config = {
        "mode": "train",
        "algorithm": {"name": "dpo"},
        "trainer": {"batch_size": 8},
        "feedback": {"source_runs": [run.pk]},
    }
    dpo = Run.objects.create(name="dpo", owner=researcher, config=RunConfig.from_dict(config).to_dict(), mode="train")
    buffer = DjangoExperienceBuffer(dpo.pk)
    device = torch.device("cpu")
    trainer = Trainer(
        buffer.config,
        load_policy("tiny", device),
        load_tokenizer("tiny"),
        buffer,
        reference=load_reference("tiny", device),
    )

    metrics = trainer.train_step()

    assert metrics["pairs"] == 1 and "skipped" not in metrics
    # the pair's use by this run, not its chosen rollout's, nor one of the run it was made on
    assert list(PairUse.objects.values_list("run", "preference", "uses")) == [(dpo.pk, pairs[0].pk, 1)]
    assert Experience.objects.get(pk=pairs[0].experience_id).use_count == 0


def test_each_run_counts_its_own_uses_of_a_pair_and_a_resumed_run_gets_back_those_of_its_lost_steps(
    run, make_experience, make_annotator, researcher
):
    """Counted on the preference, a mode train run reading this run's comparisons (source_runs) used
    them up, under max_pair_uses 1, before this run's own trainer saw them; and a resumed run had
    lost for good the pairs its lost steps used."""
    from django.utils import timezone

    a, b = make_experience(), make_experience()
    pair = services.compare(a.pk, b.pk, make_annotator("j"), "a_better")
    config = {"mode": "train", "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [run.pk]}}
    reader = Run.objects.create(name="reader", owner=researcher, config=RunConfig.from_dict(config).to_dict(),
                                mode="train")
    own, other = DjangoExperienceBuffer(run.pk), DjangoExperienceBuffer(reader.pk)
    assert [p.id for p in other.sample_pairs(4, max_uses=1)] == [pair.pk]
    checkpoint = timezone.now()
    assert [p.id for p in own.sample_pairs(4, max_uses=1)] == [pair.pk]  # the reader's use is the reader's
    assert own.sample_pairs(4, max_uses=1) == []
    own.rewind(checkpoint)  # resumed from a checkpoint before that step
    assert [p.id for p in own.sample_pairs(4, max_uses=1)] == [pair.pk]
    assert dict(PairUse.objects.values_list("run", "uses")) == {run.pk: 1, reader.pk: 1}
    own.rewind(None)  # from the start
    assert PairUse.objects.get(run=run).uses == 0
