"""Judgements and the annotation queue: validation, locks, overlap, strategies, skip and postpone."""
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback import edit_rows, queue, services
from apps.feedback.models import AnnotationLock, Feedback, SetAside
from apps.feedback.services import FeedbackError
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


def test_rating_maps_the_scale_to_a_human_reward_component(make_experience, make_annotator):
    experience = make_experience()
    first, second = make_annotator("a1"), make_annotator("a2")
    services.rate(experience.pk, first, "5", seconds_spent=3.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(services, "judgements_per_item", lambda run: 2)
        services.rate(experience.pk, second, "2")
    experience.refresh_from_db()
    assert experience.reward_components == {"exact_match": 1.0, "human": pytest.approx(0.625)}
    assert experience.reward == 1.0  # the run decides how the human reward counts
    rating = Feedback.objects.get(user=first)
    assert (rating.kind, rating.value, rating.label, rating.seconds_spent) == ("rating", 1.0, "5", 3.5)


def test_a_run_defines_its_scale_and_ratings_are_normalised_to_it(make_experience, annotator, run):
    run.config = {"feedback": {"scale_min": 0, "scale_max": 2}}
    run.save()
    assert services.rating_scale(run) == {"0": 0.0, "1": 0.5, "2": 1.0}
    experience = make_experience()
    with pytest.raises(FeedbackError, match=r"not on this run's scale \(0, 1, 2\)"):
        services.rate(experience.pk, annotator, "3")
    assert services.rate(experience.pk, annotator, "1").value == 0.5


def test_a_flag_only_records_when_the_run_keeps_flagged_experiences(make_experience, annotator, run):
    run.config = {"feedback": {"exclude_flagged": False}}
    run.save()
    experience = make_experience()
    services.flag(experience.pk, annotator, "wrong")
    experience.refresh_from_db()
    assert experience.status == "ready" and Feedback.objects.get().label == "wrong"


@pytest.mark.parametrize("point", ["0", "6", "", "five", "4.5"])
def test_ratings_off_the_scale_are_refused_and_nothing_is_saved(make_experience, annotator, point):
    experience = make_experience()
    with pytest.raises(FeedbackError, match="not on this run's scale"):
        services.rate(experience.pk, annotator, point)
    assert not Feedback.objects.exists()
    experience.refresh_from_db()
    assert "human" not in experience.reward_components


def test_an_edit_becomes_a_ready_expert_experience_tokenized_for_the_run(make_experience, annotator, run):
    run.config = {"model": {"path": "tiny"}}
    run.save()
    original = make_experience()
    services.edit(original.pk, annotator, "The answer is 0.", seconds_spent=12)
    child = Experience.objects.get(parent=original)
    tokenizer = edit_rows._tokenizer("tiny")
    assert (child.source, child.status, child.run_id, child.task_id) == (
        "human_edit", "ready", run.pk, original.task_id
    )
    assert child.response_text == "The answer is 0."
    expected_ids = tokenizer("The answer is 0.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert child.response_ids == expected_ids
    assert child.action_mask == [1] * len(child.response_ids)
    assert (child.prompt_text, child.prompt_ids) == (original.prompt_text, original.prompt_ids)
    assert Feedback.objects.get(kind="edit").edited_text == "The answer is 0."
    # Editing again replaces the unused edit instead of piling up copies.
    services.edit(original.pk, annotator, "0 + 0 = 0")
    edits = Experience.objects.filter(parent=original).values_list("response_text", flat=True)
    assert list(edits) == ["0 + 0 = 0"]


def test_an_edit_longer_than_the_model_may_answer_is_refused_naming_the_limit(make_experience, annotator, run):
    """5,000 emoji passed the character limit as 20,018 tokens: the trainer's step on it took 159 s
    on the tiny model (40 times its context) and held Stop as long. An edit must fit in the answer
    the run's model may write, its end-of-text token included."""
    run.config = {"model": {"path": "tiny"}, "explorer": {"max_new_tokens": 8}}
    run.save()
    original = make_experience()
    tokenizer = edit_rows._tokenizer("tiny")
    fits = "The answer is 0."
    assert len(tokenizer(fits, add_special_tokens=False)["input_ids"]) < 8
    with pytest.raises(services.FeedbackError) as refused:
        services.edit(original.pk, annotator, "😀" * 5000, confirmed=True)
    assert "this run's model answers in at most 8 (explorer.max_new_tokens)" in str(refused.value)
    assert not Feedback.objects.exists() and not Experience.objects.filter(parent=original).exists()
    services.edit(original.pk, annotator, fits)
    assert len(Experience.objects.get(parent=original).response_ids) <= 8
    # The editor says so before anyone types.
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(annotator)
    page = client.get(reverse("annotate-experience", args=[make_experience().pk])).content.decode()
    assert "(at most 8 tokens, as the model writes)" in page


def test_an_edit_without_a_model_waits_raw_for_tokenizing(make_experience, annotator):
    original = make_experience()
    services.edit(original.pk, annotator, "fixed", confirmed=True)  # no number: not the reference answer
    child = Experience.objects.get(parent=original)
    assert (child.status, child.response_ids, child.metadata["needs_tokenizing"]) == ("raw", [], True)


@pytest.mark.parametrize(
    "text, error",
    [
        ("", "empty"),
        ("  \n ", "empty"),
        ("x" * (services.MAX_EDIT_CHARS + 1), "at most"),
        ("response number 0", "same as the model's"),
    ],
)
def test_bad_edits_are_refused_and_nothing_is_saved(make_experience, annotator, text, error):
    original = make_experience()
    with pytest.raises(FeedbackError, match=error):
        services.edit(original.pk, annotator, text)
    assert not Feedback.objects.exists()
    assert Experience.objects.count() == 1


def test_a_multi_turn_episode_is_not_editable_and_its_page_offers_no_edit(make_experience, annotator, client):
    """A trajectory's response holds the environment's turns (mask 0): an edit's tokens all train
    as the model's, so a FrozenLake episode's board text was imitated."""
    episode = make_experience(response_ids=[5, 6, 7, 8], action_mask=[1, 0, 0, 1], logprobs=[-0.5] * 4, messages=[
        {"role": "user", "content": "go"}, {"role": "assistant", "content": "left"},
        {"role": "user", "content": "board"}, {"role": "assistant", "content": "down"}])
    with pytest.raises(FeedbackError, match="multi-turn episode"):
        services.edit(episode.pk, annotator, "right", confirmed=True)
    assert not Feedback.objects.exists() and Experience.objects.count() == 1
    client.force_login(annotator)
    page = client.get(f"/annotate/experience/{episode.pk}/").content.decode()
    assert 'id="edit-form"' not in page and 'id="not-editable"' in page
    one_turn = make_experience()
    page = client.get(f"/annotate/experience/{one_turn.pk}/").content.decode()
    assert 'id="edit-form"' in page and 'id="not-editable"' not in page


def test_a_comparison_is_a_dpo_pair_with_the_preferred_response_first(make_experience, annotator):
    a, b = make_experience(), make_experience()
    services.compare(a.pk, b.pk, annotator, "b_better")
    pref = Feedback.objects.get()
    assert (pref.kind, pref.experience_id, pref.other_id, pref.value, pref.label) == (
        "preference", b.pk, a.pk, 1.0, "b_better"
    )
    # Changing one's mind replaces the verdict, whichever way round it now goes.
    services.compare(a.pk, b.pk, annotator, "tie")
    pref = Feedback.objects.get()
    assert (pref.experience_id, pref.other_id, pref.value, pref.label) == (a.pk, b.pk, 0.5, "tie")


def test_comparisons_need_two_responses_to_one_prompt_and_a_known_verdict(make_experience, annotator):
    a, b, elsewhere = make_experience(), make_experience(), make_experience()
    with pytest.raises(FeedbackError, match="different prompts"):
        services.compare(a.pk, elsewhere.pk, annotator, "a_better")
    with pytest.raises(FeedbackError, match="itself"):
        services.compare(a.pk, a.pk, annotator, "a_better")
    with pytest.raises(FeedbackError, match="unknown verdict"):
        services.compare(a.pk, b.pk, annotator, "a_much_better")
    assert not Feedback.objects.exists()


def test_a_flag_excludes_the_experience_from_training(make_experience, annotator):
    experience = make_experience()
    with pytest.raises(FeedbackError, match="unknown flag"):
        services.flag(experience.pk, annotator, "boring")
    services.flag(experience.pk, annotator, "harmful")
    experience.refresh_from_db()
    assert experience.status == "rejected"
    assert Feedback.objects.get().label == "harmful"


def test_a_consumed_item_of_a_stopped_run_cannot_be_judged(make_experience, annotator, run):
    experience, same_prompt = make_experience(status="consumed"), make_experience(status="consumed")
    run.status = Run.Status.STOPPED
    run.save()
    for judge in (
        lambda: services.rate(experience.pk, annotator, "3"),
        lambda: services.edit(experience.pk, annotator, "better"),
        lambda: services.compare(experience.pk, same_prompt.pk, annotator, "a_better"),
        lambda: services.flag(experience.pk, annotator, "wrong"),
    ):
        with pytest.raises(FeedbackError, match="already trained on and its run is stopped"):
            judge()
    assert not Feedback.objects.exists() and Experience.objects.count() == 2
    assert queue.next_item(run, annotator) is None


def test_an_item_locked_by_someone_else_cannot_be_judged(make_experience, make_annotator):
    first, second = make_annotator("first"), make_annotator("second")
    experience = make_experience()
    assert queue.next_item(experience.run, first) == experience
    with pytest.raises(FeedbackError, match="taken by first"):
        services.rate(experience.pk, second, "4")
    with pytest.raises(FeedbackError, match="taken by first"):
        queue.take(experience.pk, second)
    assert not Feedback.objects.exists()
    services.rate(experience.pk, first, "4")
    assert not AnnotationLock.objects.exists()  # judged: the lock goes
    with pytest.raises(FeedbackError, match="has all the judgements it needs"):
        services.rate(experience.pk, second, "4")


def test_an_expired_lock_frees_the_item(make_experience, make_annotator):
    first, second = make_annotator("first"), make_annotator("second")
    experience = make_experience()
    queue.next_item(experience.run, first)
    AnnotationLock.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert queue.next_item(experience.run, second) == experience
    services.rate(experience.pk, second, "1")


def test_the_queue_hands_each_item_to_as_many_annotators_as_judgements_wanted(
    make_experience, make_annotator, settings, run
):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = 2
    experience = make_experience()
    a, b, c = (make_annotator(name) for name in "abc")
    assert queue.next_item(run, a) == experience
    assert queue.next_item(run, b) == experience
    assert queue.next_item(run, c) is None
    assert queue.next_item(run, a) == experience  # a reload gives the held item back
    services.rate(experience.pk, a, "5")
    services.rate(experience.pk, b, "4")
    assert queue.next_item(run, a) is None  # judged it already
    with pytest.raises(FeedbackError):
        services.rate(experience.pk, c, "3")


def test_strategies_order_the_queue(make_experience, annotator, run, tasks):
    tasks[1].answer = ""
    tasks[1].save()
    old_unsure = make_experience(explorer_step=0, reward=0.4, task=tasks[0])
    old_sure = make_experience(explorer_step=0, reward=1.0, task=tasks[0])
    new_no_answer = make_experience(explorer_step=5, reward=0.0, task=tasks[1])
    unscored = make_experience(explorer_step=1, reward=None, task=tasks[0])

    def order(strategy):
        taken = []
        while (item := queue.next_item(run, annotator, strategy)) is not None:
            taken.append(item)
            queue.set_aside(item.pk, annotator, postpone=False)
        SetAside.objects.all().delete()
        return taken

    assert order("newest") == [new_no_answer, unscored, old_sure, old_unsure]
    assert order("lowest_confidence") == [unscored, old_unsure, new_no_answer, old_sure]
    assert order("ground_truth_first") == [unscored, old_sure, old_unsure, new_no_answer]
    every_item = (old_unsure, old_sure, new_no_answer, unscored)
    assert sorted(e.pk for e in order("random")) == sorted(e.pk for e in every_item)
    with pytest.raises(FeedbackError, match="unknown strategy"):
        queue.next_item(run, annotator, "best")


def test_skipped_items_never_come_back_and_postponed_ones_come_last(make_experience, annotator, run):
    older, newer = make_experience(explorer_step=0), make_experience(explorer_step=1)
    assert queue.next_item(run, annotator) == newer
    queue.set_aside(newer.pk, annotator, postpone=True)
    assert queue.next_item(run, annotator) == older
    queue.set_aside(older.pk, annotator, postpone=False)
    assert queue.next_item(run, annotator) == newer
    services.rate(newer.pk, annotator, "3")
    assert queue.next_item(run, annotator) is None


def test_rejected_items_and_human_edits_are_not_queued(make_experience, annotator, run):
    make_experience(status="rejected")
    make_experience(source="human_edit")
    assert queue.next_item(run, annotator) is None


def test_a_judgement_stands_when_the_live_hint_cannot_be_sent(
    make_experience, annotator, settings, django_capture_on_commit_callbacks, caplog
):
    # Nothing listens on port 1: the channel layer fails after the judgement has committed.
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}
    }
    experience = make_experience()
    with django_capture_on_commit_callbacks(execute=True):
        services.rate(experience.pk, annotator, "4")
    assert Feedback.objects.get().value == 0.75
    assert "annotation hint judged" in caplog.text and "not sent" in caplog.text


def test_the_queue_offers_what_the_trainer_has_not_taken_yet_first(make_experience, annotator, run):
    trained_on = make_experience(explorer_step=5, status="consumed")
    waiting = make_experience(explorer_step=1)
    assert queue.next_item(run, annotator) == waiting  # a rating on it can still shape this run's training
    services.rate(waiting.pk, annotator, "3")
    # A running run's consumed items still count (agreement, pairs).
    assert queue.next_item(run, annotator) == trained_on


def test_a_held_item_the_run_trained_on_is_not_handed_back_once_the_run_has_failed(make_experience, annotator, run):
    held = make_experience(explorer_step=5)
    waiting = make_experience(explorer_step=1)
    assert queue.next_item(run, annotator) == held
    Experience.objects.filter(pk=held.pk).update(status="consumed")  # the trainer took it meanwhile
    assert queue.next_item(run, annotator) == held  # the run goes on: still open to judge
    run.status = Run.Status.FAILED
    run.save()
    # The lock is still live, but a judgement would be refused: the queue moves on.
    assert queue.next_item(run, annotator) == waiting
    services.rate(waiting.pk, annotator, "4")
    assert queue.next_item(run, annotator) is None
    assert queue.items_left(run, annotator) == 0


def test_items_others_judged_do_not_hide_the_rest_of_the_queue(make_experience, annotator, make_annotator, run):
    # More items than the queue looks at in one go are judged by someone else (one judge an item).
    other = make_annotator("other")
    judged = [make_experience(explorer_step=10) for _ in range(3 * queue.CANDIDATES + 1)]
    Feedback.objects.bulk_create([Feedback(experience=e, user=other, kind="rating", value=1.0) for e in judged])
    left = make_experience(explorer_step=0)
    assert queue.items_left(run, annotator) == 1
    assert queue.next_item(run, annotator) == left


def test_an_empty_queue_says_why(make_experience, annotator, make_annotator, run):
    judged, skipped, flagged, trained, by_other = (make_experience() for _ in range(5))
    services.rate(judged.pk, annotator, "3")
    queue.set_aside(skipped.pk, annotator, postpone=False)
    services.flag(flagged.pk, make_annotator("flagger"), "wrong")
    Experience.objects.filter(pk=trained.pk).update(status="consumed")
    services.rate(by_other.pk, make_annotator("other"), "3")
    assert queue.next_item(run, annotator) == trained  # the run goes on: a trained-on item is still open
    AnnotationLock.objects.all().delete()
    run.status = Run.Status.COMPLETED
    run.save()
    assert queue.next_item(run, annotator) is None
    assert queue.why_empty(run, annotator) == [
        (1, "judged by you"), (1, "skipped by you"), (1, "flagged, so out of training"),
        (1, "trained on before the run completed: no longer open to judge"),
        (1, "judged by or held by other annotators"),
    ]


def test_the_comparison_is_another_response_of_the_same_model_version_where_there_is_one(make_experience, run, tasks):
    def answer(step, version, text, task=tasks[0], **fields):
        return make_experience(task=task, explorer_step=step, model_version=version, response_text=text, **fields)

    item = answer(9, 4, "4")
    answer(0, 0, "an old answer")
    answer(9, 4, "4")  # the same answer: nothing to choose between
    answer(9, 4, "5", status="rejected")  # flagged: trains nothing
    near = answer(7, 3, "a nearer answer")
    assert queue.choose_comparison(item) == near  # no other answer of version 4: the nearest version
    same_version = answer(8, 4, "8")
    assert queue.choose_comparison(item) == same_version
    same_step = answer(9, 4, "9")
    assert queue.choose_comparison(item) == same_step
    make_experience(task=tasks[1], explorer_step=9, model_version=4)  # another prompt never compares
    assert queue.choose_comparison(answer(1, 0, "alone", task=tasks[2])) is None


def test_the_scale_labels_its_anchor_points(run):
    assert services.scale_labels(run) == [
        ("1", "wrong"), ("2", "poor"), ("3", "partly right"), ("4", "good"), ("5", "perfect")
    ]
    run.config = {"feedback": {"scale_min": 0, "scale_max": 9}}
    assert [label for _, label in services.scale_labels(run)] == ["wrong", *[""] * 8, "perfect"]


def test_a_big_queue_is_counted_up_to_a_bound(make_experience, annotator, run, monkeypatch):
    monkeypatch.setattr(queue, "ITEMS_LEFT_COUNTED", 3)
    for _ in range(5):
        make_experience()
    assert queue.items_left(run, annotator) == 4
    assert (queue.items_left_label(4), queue.items_left_label(3)) == ("3+", "3")
