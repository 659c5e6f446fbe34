"""Every form of ?where= a person could type (run_columns.condition): what it matches, and each that
could match no run by its form alone (no value, NaN, an infinity, trailing junk, no column, two
operators, a value the key cannot hold) refused with a message naming the problem, on the page
(the filter left out, the list unfiltered), in the CSV (a 400) and by the API (which takes no
?where=). On Postgres and SQLite alike."""

import html

import pytest
from django.urls import reverse

from apps.runs import run_columns, services
from apps.runs.models import Run

from .test_run_table import config, listed, read_csv


@pytest.fixture
def runs(make_run):
    """Two runs whose config keys and metrics tell them apart; one run without any of them."""
    made = {
        "grpo": make_run("grpo", status=Run.Status.RUNNING, config=config(**{
            "trainer.lr": 1e-5, "algorithm.name": "grpo", "algorithm.drop_zero_std_groups": True,
            "model.path": "tiny"})),
        "sft": make_run("sft", status=Run.Status.RUNNING, config=config(**{
            "trainer.lr": 3e-4, "algorithm.name": "sft", "algorithm.drop_zero_std_groups": False,
            "model.path": "big/model"})),
        "bare": make_run("bare", config={"trainer": {"total_steps": 100}}),
    }
    for step, (grpo, sft) in enumerate([(0.2, 0.5), (0.9, 0.6), (0.4, 0.7)]):
        services.record_metrics(made["grpo"], "explorer", step, {"reward_mean": grpo})
        services.record_metrics(made["sft"], "explorer", step, {"reward_mean": sft})
        services.record_metrics(made["grpo"], "trainer", step, {"loss": 1 - grpo})
        services.record_metrics(made["sft"], "trainer", step, {"loss": 1 - sft})
    return made


@pytest.mark.parametrize("where, expected", [
    ("trainer.lr = 1e-5", {"grpo"}),
    ("trainer.lr = .00001", {"grpo"}),  # a number as a person writes it, not only as JSON does
    ("trainer.lr < +1e-4", {"grpo"}),
    ("trainer.lr >= 3e-4", {"sft"}),
    ("trainer.lr != 1e-5", {"sft", "bare"}),  # "differs": a run without the key too
    ("trainer.lr = null", set()),
    ("algorithm.name = grpo", {"grpo"}),
    ('algorithm.name = "sft"', {"sft"}),
    ("algorithm.name != grpo", {"sft", "bare"}),
    ("model.path = big/model", {"sft"}),
    ("model.path != tiny!", {"grpo", "sft", "bare"}),  # a "!" alone is no operator
    ('model.path = "a = b"', set()),  # an operator in quoted text is text
    ("algorithm.drop_zero_std_groups = true", {"grpo"}),
    ("algorithm.drop_zero_std_groups != true", {"sft", "bare"}),
    ("explorer/reward_mean = 0.4", {"grpo"}),  # the latest
    ("explorer/reward_mean != 0.4", {"sft", "bare"}),  # a run without the metric differs
    ("explorer/reward_mean > 0.5", {"sft"}),
    ("best:explorer/reward_mean >= 0.9", {"grpo"}),  # the highest
    ("best:trainer/loss <= 0.1", {"grpo"}),  # a loss's best is its lowest: 0.1
    ("best:trainer/loss < 0.3", {"grpo"}),
    ("trainer/loss > 0.5", {"grpo"}),  # the latest: 0.6 and 0.3
    ("reward >= 0.5", {"sft"}),
    ("progress < 1", {"grpo", "sft", "bare"}),
])
def test_what_a_filter_matches(researcher_client, runs, where, expected):
    assert set(listed(researcher_client, where=where)) == expected


REFUSED = [
    # no value
    ("trainer.lr =", "no value after '=' in 'trainer.lr ='"),
    ("trainer.lr ==", "no value after '=' in 'trainer.lr =='"),
    ("trainer.lr != ", "no value after '!=' in 'trainer.lr !='"),
    ("algorithm.name =", "no value after '=' in 'algorithm.name ='"),
    ("explorer/reward_mean >=", "no value after '>=' in 'explorer/reward_mean >='"),
    # no finite number
    ("trainer.lr = nan", "'nan' is not a number in 'trainer.lr = nan': no run holds NaN or an infinity"),
    ("trainer.lr = NaN", "'NaN' is not a number"),
    ("trainer.lr = inf", "'inf' is not a number in 'trainer.lr = inf': no run holds NaN or an infinity"),
    ("trainer.lr = -inf", "'-inf' is not a number"),
    ("trainer.lr != Infinity", "'Infinity' is not a number"),
    ("trainer.lr = 1e999", "'1e999' is not a number in 'trainer.lr = 1e999': past the largest a run holds"),
    ("explorer/reward_mean != nan", "'nan' is not a number"),
    ("best:explorer/reward_mean >= -1e400", "'-1e400' is not a number"),
    ("reward >= -inf", "'-inf' is not a number"),
    ("progress < 1e309", "'1e309' is not a number"),
    # trailing junk, or no number at all
    ("trainer.lr = 1e-5abc", "'1e-5abc' is not a number in 'trainer.lr = 1e-5abc': trainer.lr is compared as a number"),
    ("trainer.lr = 1e-5 x", "'1e-5 x' is not a number"),
    ("trainer.lr = 1,5", "'1,5' is not a number"),
    ("trainer.lr = 0x10", "'0x10' is not a number"),
    ("trainer.lr = 1_000", "'1_000' is not a number"),
    ("trainer.lr = true", "'true' is not a number"),
    ('trainer.lr = "1e-5"', "'\"1e-5\"' is not a number"),
    ("explorer/reward_mean = 0.5 0.6", "'0.5 0.6' is not a number"),
    ("explorer/reward_mean = null", "'null' is not a number"),
    ('algorithm.name = "grpo" x', "'\"grpo\" x' is no quoted text in"),
    ('algorithm.name = "grpo', "'\"grpo' is no quoted text"),
    # an operator with no column
    ("= 1e-5", "no column before '=' in '= 1e-5'"),
    (" >= 0.5", "no column before '>=' in '>= 0.5'"),
    ("!= grpo", "no column before '!='"),
    # two operators
    ("trainer.lr = = 1", "two operators in 'trainer.lr = = 1'"),
    ("trainer.lr => 1", "two operators in 'trainer.lr => 1'"),
    ("trainer.lr =< 1", "two operators"),
    ("trainer.lr <> 1", "two operators"),
    ("trainer.lr >= <= 1", "two operators"),
    ("trainer.lr < = 1", "two operators"),
    ("trainer.lr ! = 1", "two operators"),
    ("trainer.lr =! 1", "two operators"),
    ("trainer.lr ≥≥ 1", "two operators"),
    ("trainer.lr = 1 = 2", "two operators"),
    ("algorithm.name = grpo = sft", "two operators in 'algorithm.name = grpo = sft'"),
    ("algorithm.name != <none>", "two operators"),
    # a value the key cannot hold, an operator it does not take
    ("algorithm.drop_zero_std_groups = 1", "'1' is not true or false in 'algorithm.drop_zero_std_groups = 1'"),
    ("algorithm.drop_zero_std_groups = yes", "'yes' is not true or false"),
    ("algorithm.name >= 1", "algorithm.name is not compared as a number in 'algorithm.name >= 1': it takes = and !="),
    ("algorithm.drop_zero_std_groups < 1", "algorithm.drop_zero_std_groups is not compared as a number"),
    ("explorer.pipeline = x", "explorer.pipeline holds a list in 'explorer.pipeline = x': a filter compares one value"),
]


@pytest.mark.parametrize("where, message", REFUSED)
def test_a_filter_that_could_match_nothing_by_its_form_is_named_and_not_applied(researcher_client, runs, where,
                                                                                  message):
    response = researcher_client.get(reverse("run-list"), {"where": where})
    assert response.status_code == 200
    assert html.escape(message) in response.content.decode()
    assert {run.name for run in response.context["runs"]} == set(runs)  # the list unfiltered
    assert [chip["bad"] for chip in response.context["where"]] == [True]
    response = researcher_client.get(reverse("run-list-csv"), {"where": where})
    assert response.status_code == 400 and message in response.content.decode()


def test_every_refused_form_is_refused_by_condition_itself():
    """What the page, the CSV and the chips read (condition, is_condition), without a database."""
    for where, message in REFUSED:
        with pytest.raises(run_columns.BadCondition) as refused:
            run_columns.condition(where)
        assert message in str(refused.value)
        assert not run_columns.is_condition(where)


def test_a_bad_filter_leaves_out_the_good_ones_with_it_as_said(researcher_client, runs):
    """One refused ?where= is named; the list is not filtered by the others either (the form is
    one field): a list filtered by less than was asked is never shown as if it were."""
    response = researcher_client.get(reverse("run-list"), {"where": ["algorithm.name = grpo", "trainer.lr = nan"]})
    assert html.escape("'nan' is not a number") in response.content.decode()
    assert {run.name for run in response.context["runs"]} == set(runs)


def test_the_csv_filters_by_metric_summaries_and_inequality(researcher_client, runs):
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {
        "cols": "explorer/reward_mean,best:trainer/loss", "where": ["explorer/reward_mean != 0.4"], "sort": "name"}))
    assert [(row["name"], row["explorer/reward_mean"], row["best:trainer/loss"]) for row in rows] == [
        ("bare", "", ""), ("sft", "0.7", "0.30000000000000004")]


def test_the_api_refuses_a_where_it_does_not_read(researcher_client, runs):
    """GET /api/runs/ filters by q, status, owner and tag: a ?where= is refused, never ignored."""
    response = researcher_client.get("/api/runs/", {"where": "trainer.lr = nan"})
    assert response.status_code == 400
    assert "unknown query parameter: 'where'" in response.json()["error"]
