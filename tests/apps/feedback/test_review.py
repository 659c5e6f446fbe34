"""Review and agreement (issue #44, item 4): on a run that requires review a rating, edit or
comparison reaches training only once a reviewer accepts it; agreement per run and per annotator
pair, checked against the reference formulas on worked examples. On Postgres and SQLite."""
import itertools

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import REVIEWER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback import review, services, stats
from apps.feedback.models import Feedback
from apps.runs.models import Run

HUMAN = services.HUMAN_REWARD


@pytest.fixture
def reviewed_run(run):
    Run.objects.filter(pk=run.pk).update(config={"feedback": {
        "reward_mode": "weight", "require_review": True, "judgements_per_item": 3, "rubric": "Is the sum right?"}})
    run.refresh_from_db()
    return run


@pytest.fixture
def reviewer(db):
    return create_user("rev", "pw-for-tests-123", roles=(REVIEWER,))


def human(experience) -> float | None:
    experience.refresh_from_db()
    return experience.reward_components.get(HUMAN)


def edits(experience) -> list[str]:
    rows = Experience.objects.filter(parent=experience, source="human_edit")
    return list(rows.values_list("response_text", flat=True))


# ---- the reference formulas, written out -----------------------------------------------------------


def reference_kappa(a: list[str], b: list[str]) -> float:
    """scikit-learn's cohen_kappa_score (sklearn/metrics/_classification.py), unweighted: from the
    confusion matrix O and the outer product of its margins E (scaled to O's sum),
    kappa = 1 - sum(W * O) / sum(W * E) with W = 1 off the diagonal, 0 on it."""
    labels = sorted(set(a) | set(b))
    index = {label: i for i, label in enumerate(labels)}
    k = len(labels)
    observed = [[0.0] * k for _ in range(k)]
    for x, y in zip(a, b):
        observed[index[x]][index[y]] += 1
    rows = [sum(row) for row in observed]
    cols = [sum(observed[i][j] for i in range(k)) for j in range(k)]
    total = sum(rows)
    expected = [[rows[i] * cols[j] / total for j in range(k)] for i in range(k)]
    off = lambda m: sum(m[i][j] for i in range(k) for j in range(k) if i != j)  # noqa: E731
    return 1 - off(observed) / off(expected)


def test_cohens_kappa_on_the_worked_example_and_the_edges():
    # Cohen's kappa's worked example (Wikipedia, "Cohen's kappa", Example): 50 proposals, A and B
    # both yes on 20, both no on 15, A yes B no on 5, A no B yes on 10: p_o 0.7, p_e 0.5, kappa 0.4.
    a = ["yes"] * 20 + ["yes"] * 5 + ["no"] * 10 + ["no"] * 15
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert stats.cohen_kappa(list(zip(a, b))) == pytest.approx(0.4, abs=1e-12)
    assert stats.cohen_kappa(list(zip(a, b))) == pytest.approx(reference_kappa(a, b), abs=1e-12)
    cases = [
        (["first", "second", "tie"], ["first", "second", "tie"]),  # full agreement: 1
        (["first", "second"] * 3, ["second", "first"] * 3),  # always opposite: -1
        (["first", "first", "second", "tie"], ["first", "tie", "second", "both_bad"]),
        (["first"] * 9 + ["second"], ["first"] * 10),
    ]
    for a, b in cases:
        assert stats.cohen_kappa(list(zip(a, b))) == pytest.approx(reference_kappa(a, b), abs=1e-12), (a, b)
    assert stats.cohen_kappa([("first", "first")] * 4) is None  # p_e = 1: chance explains it all
    assert stats.cohen_kappa([]) is None


def reference_alpha(units: list[list[float]]) -> float:
    """Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C (interval data):
    alpha = 1 - (n - 1) * sum_c sum_k o_ck d2(c, k) / sum_c sum_k n_c n_k d2(c, k), from the
    coincidence matrix o_ck = sum_u (pairs c-k in unit u) / (m_u - 1) and its margins n_c."""
    pairable = [unit for unit in units if len(unit) > 1]
    values = sorted({v for unit in pairable for v in unit})
    o = {(c, k): 0.0 for c in values for k in values}
    for unit in pairable:
        for i, j in itertools.permutations(range(len(unit)), 2):
            o[(unit[i], unit[j])] += 1 / (len(unit) - 1)
    n_c = {c: sum(o[(c, k)] for k in values) for c in values}
    n = sum(n_c.values())
    d_o = sum(o[(c, k)] * (c - k) ** 2 for c in values for k in values)
    d_e = sum(n_c[c] * n_c[k] * (c - k) ** 2 for c in values for k in values)
    return 1 - (n - 1) * d_o / d_e


def test_krippendorffs_alpha_matches_the_coincidence_matrix_formula():
    cases = [
        [[1.0, 1.0], [0.0, 0.5], [0.25, 0.25, 0.5], [1.0, 0.75]],
        [[0.0, 1.0], [1.0, 0.0]],
        [[0.5, 0.5, 0.75], [0.0, 0.25], [1.0]],  # a unit rated once adds nothing
    ]
    for units in cases:
        assert stats.krippendorff_alpha_interval(units) == pytest.approx(reference_alpha(units), abs=1e-12), units


# ---- review ---------------------------------------------------------------------------------------


def judged_by(run, annotators: int):
    run.config["feedback"]["judgements_per_item"] = annotators
    run.save(update_fields=["config"])


def test_a_rating_counts_only_once_accepted(reviewed_run, make_experience, make_annotator, reviewer):
    judged_by(reviewed_run, 2)
    a, b = make_annotator("a"), make_annotator("b")
    item = make_experience()
    services.rate(item.pk, a, "5")
    services.rate(item.pk, b, "1")
    assert human(item) is None and review.pending(reviewed_run).count() == 2
    first = review.next_for(reviewed_run, reviewer)
    assert first.user == a  # oldest first
    review.decide(first.pk, reviewer, accept=True, note="clear")
    assert human(item) is None  # b's rating of the item's 2 still waits for review
    review.decide(review.next_for(reviewed_run, reviewer).pk, reviewer, accept=False, note="too harsh")
    assert human(item) == 1.0 and review.next_for(reviewed_run, reviewer) is None  # the rejected one left out
    decided = Feedback.objects.get(user=b)
    assert (decided.review, decided.reviewer, decided.review_note) == ("rejected", reviewer, "too harsh")
    services.rate(item.pk, a, "3")  # judged again: back to review, out of the reward meanwhile
    assert human(item) is None and Feedback.objects.get(user=a).review == "pending"


def test_an_edit_becomes_expert_data_only_once_accepted(reviewed_run, make_experience, make_annotator, reviewer):
    a, b = make_annotator("a"), make_annotator("b")
    item = make_experience()
    services.edit(item.pk, a, "the accepted answer", confirmed=True)
    services.edit(item.pk, b, "the rejected answer", confirmed=True)
    assert edits(item) == []
    review.decide(Feedback.objects.get(user=a).pk, reviewer, accept=True)
    review.decide(Feedback.objects.get(user=b).pk, reviewer, accept=False)
    assert edits(item) == ["the accepted answer"]
    # Changed while untrained, then rejected after all: out again.
    review.decide(Feedback.objects.get(user=a).pk, reviewer, accept=False)
    assert edits(item) == []
    review.decide(Feedback.objects.get(user=a).pk, reviewer, accept=True)
    Experience.objects.filter(parent=item).update(use_count=1)  # a trainer step used it
    Run.objects.filter(pk=reviewed_run.pk).update(trainer_step=7)
    with pytest.raises(review.ReviewError, match="trained on at step"):
        review.decide(Feedback.objects.get(user=a).pk, reviewer, accept=False)
    assert Feedback.objects.get(user=a).review == "accepted"


def test_a_comparison_is_a_pair_to_train_on_only_once_accepted(reviewed_run, make_experience, make_annotator,
                                                               reviewer):
    from apps.buffer.store import DjangoExperienceBuffer

    judged_by(reviewed_run, 1)
    a = make_annotator("a")
    first, second = make_experience(), make_experience()
    services.compare(first.pk, second.pk, a, "a_better")
    buffer = DjangoExperienceBuffer(reviewed_run.pk)
    assert buffer.sample_pairs(4) == []
    review.decide(Feedback.objects.get().pk, reviewer, accept=True)
    assert [pair.id for pair in buffer.sample_pairs(4)] == [Feedback.objects.get().pk]


def test_nobody_reviews_their_own_and_annotators_do_not_review(reviewed_run, make_experience, make_annotator,
                                                               reviewer, annotator):
    item = make_experience()
    services.rate(item.pk, reviewer, "4")  # reviewers annotate too
    assert review.next_for(reviewed_run, reviewer) is None
    with pytest.raises(review.ReviewError, match="someone else than its annotator"):
        review.decide(Feedback.objects.get().pk, reviewer, accept=True)
    with pytest.raises(review.ReviewError, match="reviewer role"):
        review.decide(Feedback.objects.get().pk, annotator, accept=True)
    with pytest.raises(services.FeedbackError, match="NUL"):
        review.decide(Feedback.objects.get().pk, create_user("rev2", "pw-for-tests-123", roles=(REVIEWER,)),
                      accept=True, note="a\x00b")
    assert Feedback.objects.get().review == "pending" and human(item) is None


def test_without_review_judgements_reach_training_at_once(run, make_experience, make_annotator, reviewer):
    item = make_experience()
    services.rate(item.pk, make_annotator("a"), "5")
    assert human(item) == 1.0 and Feedback.objects.get().review == ""
    with pytest.raises(review.ReviewError, match="no review asked"):
        review.decide(Feedback.objects.get().pk, reviewer, accept=False)


def test_the_review_pages_take_one_judgement_after_another(reviewed_run, make_experience, make_annotator, reviewer,
                                                           annotator_client):
    a = make_annotator("a")
    item = make_experience()
    services.edit(item.pk, a, "a better answer", comment="the sum was off by one", confirmed=True)
    client = Client()
    client.force_login(reviewer)
    start = client.get(reverse("review-start")).content.decode()
    assert reviewed_run.name in start and reverse("review-next", args=[reviewed_run.pk]) in start
    own = Client()
    own.force_login(a)
    a.groups.add(*reviewer.groups.all())  # a reviews too, but not their own edit: no Review button
    mine = own.get(reverse("review-start")).content.decode()
    review_link = f'href="{reverse("review-next", args=[reviewed_run.pk])}"'
    assert "+ 1 yours, for another reviewer" in mine and review_link not in mine
    page = client.get(reverse("review-next", args=[reviewed_run.pk]))
    text = page.content.decode()
    assert "a better answer" in text and "the sum was off by one" in text and item.response_text in text
    # The reference answer the annotator judged beside, and the rubric (a walkthrough missed them).
    assert f'<div class="text mono pre" id="answer">{item.task.answer}</div>' in text
    assert '<div class="rubric" id="rubric">Is the sum right?</div>' in text
    judgement = page.context["judgement"]
    done = client.post(reverse("review-accept", args=[judgement.pk]), {"note": "good"}, follow=True)
    shown = done.content.decode()
    assert "Accepted <bdi>a</bdi>&#x27;s edit" in shown and "Nothing of this run waits" in shown
    assert edits(item) == ["a better answer"]
    assert annotator_client.get(reverse("review-start")).status_code == 403


def test_the_review_page_shows_the_prompt_as_the_annotator_saw_it(reviewed_run, make_experience, make_annotator,
                                                                   reviewer):
    """Its chat turns, not the chat template's text: the review page printed prompt_text
    ("<|im_start|>user ..."), where the item page shows "What is 8 + 5?"."""
    item = make_experience(prompt_text="<|im_start|>user\nWhat is 8 + 5?<|im_end|>\n<|im_start|>assistant\n",
                           messages=[{"role": "user", "content": "What is 8 + 5?"},
                                     {"role": "assistant", "content": "13"}])
    services.rate(item.pk, make_annotator("a"), 4)
    client = Client()
    client.force_login(reviewer)
    text = client.get(reverse("review-next", args=[reviewed_run.pk])).content.decode()
    assert '<div class="text mono pre item-text" id="prompt">What is 8 + 5?</div>' in text
    assert "im_start" not in text


def test_a_stale_review_page_changes_nothing_another_reviewer_or_the_annotator_did(
        reviewed_run, make_experience, make_annotator, reviewer):
    """A reviewer's finding: demo rejected a rating with a note; rev1, on a page opened before, then
    accepted it: 302, "Accepted ...", and demo's decision and note were gone."""
    a = make_annotator("a")
    item = make_experience()
    services.rate(item.pk, a, "5")
    judgement = Feedback.objects.get(experience=item)
    first, second = Client(), Client()
    first.force_login(reviewer)
    second.force_login(create_user("rev2", "pw-for-tests-123", roles=(REVIEWER,)))
    pages = [client.get(reverse("review-next", args=[reviewed_run.pk])).context["seen"] for client in (first, second)]
    assert pages[0] == pages[1] == review.seen(judgement)
    first.post(reverse("review-reject", args=[judgement.pk]), {"note": "off by one", "seen": pages[0]})
    late = second.post(reverse("review-accept", args=[judgement.pk]), {"seen": pages[1]}, follow=True)
    judgement.refresh_from_db()
    assert (judgement.review, judgement.reviewer, judgement.review_note) == ("rejected", reviewer, "off by one")
    assert "rejected this rating while you looked at it (their note: &#x27;off by one&#x27;); nothing changed" in (
        late.content.decode())
    assert human(item) is None  # still out of training
    # The annotator judging again while a page is open: it waits for review again, and the open page
    # (which showed the first judgement) decides nothing.
    services.rate(item.pk, a, "1")
    judgement.refresh_from_db()
    stale = review.seen(judgement)
    services.rate(item.pk, a, "5")
    with pytest.raises(review.ReviewError, match="its annotator judged it again while you looked at it"):
        review.decide(judgement.pk, reviewer, accept=True, seen_as=stale)
    judgement.refresh_from_db()
    assert judgement.review == "pending"


# ---- agreement ------------------------------------------------------------------------------------


def test_agreement_per_pair_of_annotators_matches_a_hand_computation(run, make_experience, make_annotator,
                                                                     researcher_client, settings):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = 3
    a, b, c = make_annotator("a"), make_annotator("b"), make_annotator("c")
    items = [make_experience() for _ in range(8)]  # 0-1, 2-3, 4-5, 6-7 answer one prompt each
    # Ratings on a 1-5 scale (normalised: 1 -> 0, 3 -> 0.5, 5 -> 1): a and b on items 0 and 1.
    services.rate(items[0].pk, a, "5")
    services.rate(items[0].pk, b, "5")
    services.rate(items[1].pk, a, "1")
    services.rate(items[1].pk, b, "3")
    # Comparisons of the four pairs: a and c on all four, b on the first two.
    verdicts = {a: ["a_better", "b_better", "tie", "a_better"], c: ["a_better", "a_better", "tie", "b_better"],
                b: ["a_better", "b_better"]}
    for user, said in verdicts.items():
        for (first, second), verdict in zip(zip(items[0::2], items[1::2]), said):
            services.compare(first.pk, second.pk, user, verdict)
    pairwise = stats.pairwise_agreement(run)
    # Ratings a-b: units [[1, 1], [0, 0.5]]: one of two alike; alpha by the coincidence matrix.
    assert pairwise["ratings"] == [{"annotators": ["a", "b"], "items": 2, "percent_agreement": 0.5,
                                    "krippendorff_alpha": pytest.approx(reference_alpha([[1, 1], [0, 0.5]]))}]
    by_pair = {tuple(row["annotators"]): row for row in pairwise["comparisons"]}
    # a-c: first, first | second, first | tie, tie | first, second -> 2 of 4 alike;
    # p_e = p_a(first) p_c(first) + p_a(second) p_c(second) + p_a(tie) p_c(tie)
    #     = 2/4 * 2/4 + 1/4 * 1/4 + 1/4 * 1/4 = 0.375; kappa = (0.5 - 0.375) / 0.625 = 0.2
    assert by_pair[("a", "c")]["pairs"] == 4 and by_pair[("a", "c")]["percent_agreement"] == 0.5
    assert by_pair[("a", "c")]["cohen_kappa"] == pytest.approx(0.2, abs=1e-12)
    # a-b: first, first | second, second: kappa 1. b-c: first, first | second, first: p_o 0.5,
    # p_e = 1/2 * 2/2 = 0.5: kappa 0.
    assert by_pair[("a", "b")]["cohen_kappa"] == pytest.approx(1.0)
    assert by_pair[("b", "c")]["cohen_kappa"] == pytest.approx(0.0)
    run_level = stats.agreement(run)
    assert run_level["pairs_compared_more_than_once"] == 4
    # Every two annotators of a pair: pair 1: 3 alike of 3; pair 2: a-b alike, a-c, b-c not (1/3);
    # pairs 3, 4: one couple each, alike then not: (3 + 1 + 1 + 0) / (3 + 3 + 1 + 1) = 5/8.
    assert run_level["comparison_percent_agreement"] == pytest.approx(5 / 8)
    assert run_level["comparison_kappa"] == pytest.approx((0.2 + 1.0 + 0.0) / 3)  # Light's: the mean
    page = researcher_client.get(reverse("annotate-run-feedback", args=[run.pk])).content.decode()
    assert "κ 0.200" in page and "<bdi>a</bdi> · <bdi>c</bdi>" in page


def test_the_counts_of_what_reaches_training_wait_for_review(reviewed_run, make_experience, make_annotator,
                                                            reviewer, researcher_client):
    """The run page's, summary.json's and the API's DPO pairs and human edits are what training
    takes: a reviewed run's comparisons counted 3 pairs while 2 were rejected and the trainer
    sampled 1. What waits for a reviewer is counted apart, by kind."""
    from apps.buffer.store import DjangoExperienceBuffer

    judged_by(reviewed_run, 1)  # each pair is compared once
    a = make_annotator("a")
    items = [make_experience() for _ in range(8)]  # 0-1, 2-3, 4-5, 6-7 answer one prompt each
    comparisons = [services.compare(first.pk, second.pk, a, "a_better")
                   for first, second in zip(items[0:6:2], items[1:6:2])]
    services.edit(items[6].pk, a, "the answer, edited", confirmed=True)

    def counts():
        summary = researcher_client.get(reverse("annotate-run-summary", args=[reviewed_run.pk])).json()
        api = researcher_client.get(reverse("api-run-annotation", args=[reviewed_run.pk])).json()
        assert {key: api[key] for key in summary if key != "human_reward_by_step"} == {
            key: value for key, value in summary.items() if key != "human_reward_by_step"}
        return summary["dpo_pairs"], summary["human_edits"], summary["waiting_for_review"]

    waiting = {"rating": 0, "edit": 1, "preference": 3}
    assert counts() == (0, 0, waiting)
    review.decide(comparisons[0].pk, reviewer, accept=True)
    for rejected in comparisons[1:]:
        review.decide(rejected.pk, reviewer, accept=False)
    review.decide(Feedback.objects.get(kind="edit").pk, reviewer, accept=True)
    assert [(row["accepted"], row["rejected"]) for row in stats.per_annotator(reviewed_run)] == [(1, 0), (1, 2)]
    assert counts() == (1, 1, {"rating": 0, "edit": 0, "preference": 0})
    assert len(DjangoExperienceBuffer(reviewed_run.pk).sample_pairs(10)) == 1
    # A tie, accepted, trains nothing; an accepted pair whose response is flagged is never sampled.
    tie = services.compare(items[7].pk, items[6].pk, a, "tie")
    review.decide(tie.pk, reviewer, accept=True)
    services.flag(items[1].pk, a, "wrong")
    assert counts() == (0, 1, {"rating": 0, "edit": 0, "preference": 0})
    assert DjangoExperienceBuffer(reviewed_run.pk).sample_pairs(10) == []
    # An edit's row rejected (undone after a step used it, or a curator's Mark rejected) trains no more.
    Experience.objects.filter(source="human_edit").update(status="rejected")
    assert counts() == (0, 0, {"rating": 0, "edit": 0, "preference": 0})
    page = researcher_client.get(reverse("run-detail", args=[reviewed_run.pk])).content.decode()
    assert 'data-feedback="waiting_for_review"' in page
