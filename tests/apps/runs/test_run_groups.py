"""The runs list grouped by config keys (?group=, apps/runs/run_groups.py): a row per distinct value
with its runs' count and each number's mean, std, min and max (from the runs' metric summaries),
"(not set)" for the runs without the key, sorting by a column's mean, opening a group to its runs
(?expand=) and listing them alone, the grouped CSV, and bad keys refused naming the key. On
Postgres and SQLite alike."""

import html
import json
import statistics
from urllib.parse import parse_qs

import pytest
from django.urls import reverse

from apps.runs import services
from apps.runs.models import MetricPoint, Run

from .test_run_table import config, listed, read_csv

# name: (algorithm.name or None (not in the config), trainer.lr, rewards step by step)
RUNS = {
    "g1": ("grpo", 1e-5, [0.1, 0.5, 0.4]),
    "g2": ("grpo", 1e-5, [0.2, 0.9, 0.8]),
    "g3": ("grpo", 3e-4, [0.3, 0.3, 0.3]),
    "s1": ("sft", 1e-5, [0.6, 0.7, 0.2]),
    "bare": (None, None, []),
}
COLS = "algorithm.name,best:explorer/reward_mean,explorer/reward_mean,status"


@pytest.fixture
def runs(make_run):
    made = {}
    for name, (algorithm, lr, rewards) in RUNS.items():
        keys = {"algorithm.name": algorithm, "trainer.lr": lr} if algorithm else {}
        made[name] = make_run(name, config=config(**keys) if keys else {"trainer": {"total_steps": 10}},
                              status=Run.Status.COMPLETED if name != "g3" else Run.Status.FAILED)
        for step, reward in enumerate(rewards):
            services.record_metrics(made[name], "explorer", step, {"reward_mean": reward})
    return made


def grouped(client, **query):
    response = client.get(reverse("run-list"), {"cols": COLS, **query})
    assert response.status_code == 200
    return response


def cells(group) -> dict:
    return {column.id: cell for column, cell in group.cells}


def test_a_row_per_value_with_its_count_and_each_numbers_mean_and_spread(researcher_client, runs):
    response = grouped(researcher_client, group="algorithm.name")
    groups = {tuple(group.values): group for group in response.context["groups"]}
    assert {values: len(group.runs) for values, group in groups.items()} == {("grpo",): 3, ("sft",): 1, (None,): 1}
    best = cells(groups[("grpo",)])["best:explorer/reward_mean"]
    assert best["mean"] == pytest.approx(statistics.fmean([0.5, 0.9, 0.3]))
    assert best["std"] == pytest.approx(statistics.pstdev([0.5, 0.9, 0.3]))
    assert (best["min"], best["max"], best["count"]) == (0.3, 0.9, 3)
    latest = cells(groups[("grpo",)])["explorer/reward_mean"]
    assert latest["mean"] == pytest.approx(statistics.fmean([0.4, 0.8, 0.3]))
    assert cells(groups[("sft",)])["best:explorer/reward_mean"]["std"] == 0  # one run
    assert cells(groups[(None,)])["best:explorer/reward_mean"]["mean"] is None  # no metric at all
    assert cells(groups[("grpo",)])["status"]["text"] == "completed 2 · failed 1"
    page = html.unescape(response.content.decode())
    assert "(not set)" in page and "3 groups by <strong>algorithm.name</strong>" in page
    assert response.context["runs_grouped"] == 5


def test_the_figures_are_the_summaries_not_the_points(researcher_client, runs):
    MetricPoint.objects.all().delete()  # a plain delete leaves the summaries (summaries.forget would not)
    groups = grouped(researcher_client, group="algorithm.name").context["groups"]
    group = next(group for group in groups if group.values == ("sft",))
    assert cells(group)["best:explorer/reward_mean"]["max"] == 0.7


def test_two_keys_and_one_number_written_two_ways_is_one_group(researcher_client, runs, make_run):
    make_run("g4", config=config(**{"algorithm.name": "grpo", "trainer.lr": 0.00001}))
    groups = grouped(researcher_client, group="algorithm.name,trainer.lr").context["groups"]
    assert {group.values: len(group.runs) for group in groups} == {
        ("grpo", 1e-5): 3, ("grpo", 3e-4): 1, ("sft", 1e-5): 1, (None, None): 1}


def test_text_numbers_and_booleans_of_a_key_are_groups_apart(researcher_client, make_run):
    make_run("number", config={"algorithm": {"name": 1}})
    make_run("text", config={"algorithm": {"name": "1"}})
    make_run("true", config={"algorithm": {"name": True}})
    make_run("null", config={"algorithm": {"name": None}})
    make_run("whole", config={"algorithm": {"name": 1.0}})
    groups = grouped(researcher_client, group="algorithm.name", cols="status").context["groups"]
    assert sorted((json.dumps(group.values), len(group.runs)) for group in groups) == [
        ('["1"]', 1), ("[1]", 2), ("[null]", 1), ("[true]", 1)]


def test_groups_sort_by_a_columns_mean_either_way_and_by_their_values(researcher_client, runs):
    def order(sort):
        return [group.values[0] for group in grouped(researcher_client, group="algorithm.name",
                                                     sort=sort).context["groups"]]

    # best means: grpo 0.567, sft 0.7; the group without the metric last either way
    assert order("-best:explorer/reward_mean") == ["sft", "grpo", None]
    assert order("best:explorer/reward_mean") == ["grpo", "sft", None]
    assert order("-max:explorer/reward_mean") == ["sft", "grpo", None]  # a sort not shown: its mean too
    assert order("name") == ["grpo", "sft", None]
    assert order("-name") == ["sft", "grpo", None]
    assert order("-created") == [None, "sft", "grpo"]  # by each group's newest run


def test_grouping_keeps_the_filters_search_and_where(researcher_client, runs):
    groups = grouped(researcher_client, group="algorithm.name", where="trainer.lr = 1e-5", q="g").context["groups"]
    assert [(group.values, len(group.runs)) for group in groups] == [(("grpo",), 2)]
    groups = grouped(researcher_client, group="trainer.lr", status="completed").context["groups"]
    assert {group.values: len(group.runs) for group in groups} == {(1e-5,): 3, (None,): 1}


def test_a_group_opens_to_its_runs_and_lists_them_alone(researcher_client, runs):
    response = grouped(researcher_client, group="algorithm.name", sort="name")
    grpo, sft, not_set = response.context["groups"]
    opened = grouped(researcher_client, **{k: v[0] for k, v in parse_qs(grpo.expand).items()})
    assert opened.context["open_group"].values == ("grpo",)
    assert sorted(run.name for run in opened.context["runs"]) == ["g1", "g2", "g3"]
    again = next(group for group in opened.context["groups"] if group.values == ("grpo",))
    assert "expand" not in parse_qs(again.expand)  # its link closes it
    alone = parse_qs(grpo.listed)
    assert "group" not in alone and alone["where"] == ["algorithm.name = grpo"]
    assert sorted(listed(researcher_client, **{k: v if len(v) > 1 else v[0] for k, v in alone.items()})) == [
        "g1", "g2", "g3"]
    assert not_set.listed is None  # no filter says "not set": it opens in place
    opened = grouped(researcher_client, group="algorithm.name", expand=not_set.token)
    assert [run.name for run in opened.context["runs"]] == ["bare"]


def test_runs_group_by_their_own_status_mode_and_owner_and_each_group_lists_alone(researcher_client, runs, make_run,
                                                                                  django_user_model):
    other = django_user_model.objects.create_user("other-owner")
    make_run("theirs", owner=other, status=Run.Status.COMPLETED, mode=Run.Mode.BENCH)
    response = grouped(researcher_client, group="owner,status", sort="name")
    groups = {group.values: group for group in response.context["groups"]}
    me = runs["g1"].owner.username
    assert {values: len(group.runs) for values, group in groups.items()} == {
        (me, "completed"): 4, (me, "failed"): 1, ("other-owner", "completed"): 1}
    # "list" opens them through the menus the list has for these two
    alone = parse_qs(groups[(me, "failed")].listed)
    assert (alone["owner"], alone["status"], "where" in alone) == ([me], ["failed"], False)
    assert listed(researcher_client, **{k: v[0] for k, v in alone.items()}) == ["g3"]
    # mode is the run's own (config keys hold it too; it was refused as "not a config key")
    by_mode = {group.values: group for group in grouped(researcher_client, group="mode").context["groups"]}
    assert {values: len(group.runs) for values, group in by_mode.items()} == {("both",): 5, ("bench",): 1}
    alone = parse_qs(by_mode[("bench",)].listed)
    assert alone["where"] == ["mode = bench"]
    assert listed(researcher_client, **{k: v[0] for k, v in alone.items()}) == ["theirs"]
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {"group": "owner,status", "cols": "progress"}))
    assert sorted((row["owner"], row["status"], row["runs"]) for row in rows) == sorted([
        (me, "completed", "4"), (me, "failed", "1"), ("other-owner", "completed", "1")])
    offered = response.context["group_keys"]
    assert offered[:3] == ["status", "mode", "owner"] and offered.count("mode") == 1


def test_a_bench_runs_progress_is_its_evaluation_everywhere(researcher_client, make_run):
    """1 once completed, 0 before: as its row shows it (queries.run_progress). Grouped, filtered,
    sorted and in the grouped CSV it was trainer_step / total_steps: 0 for a completed one."""
    for name, status in (("scored-1", Run.Status.COMPLETED), ("scored-2", Run.Status.COMPLETED),
                         ("scoring", Run.Status.QUEUED)):
        make_run(name, status=status, mode=Run.Mode.BENCH, config={"mode": "bench", "trainer": {"total_steps": 100}})
    assert sorted(listed(researcher_client, where="progress >= 1")) == ["scored-1", "scored-2"]
    assert listed(researcher_client, where="progress = 0") == ["scoring"]
    group = grouped(researcher_client, group="mode", cols="progress").context["groups"][0]
    assert cells(group)["progress"]["mean"] == pytest.approx(2 / 3)
    assert listed(researcher_client, sort="-progress")[-1] == "scoring"


def test_mode_is_filtered_by_the_filter_box(researcher_client, runs, make_run):
    make_run("scored", status=Run.Status.COMPLETED, mode=Run.Mode.BENCH)
    assert listed(researcher_client, where="mode = bench") == ["scored"]
    assert sorted(listed(researcher_client, where="mode != bench")) == sorted(runs)
    for typed in ("mode = scoring", "mode >= 1"):
        response = researcher_client.get(reverse("run-list"), {"where": typed})
        assert "mode takes = or != and one of both, explore, train, bench" in html.unescape(response.content.decode())


def test_an_expand_naming_no_group_is_said(researcher_client, runs):
    response = grouped(researcher_client, group="algorithm.name", expand='["ppo"]')
    assert response.context["open_group"] is None
    assert "Expand: no group &#x27;[&quot;ppo&quot;]&#x27; in this view" in response.content.decode()


@pytest.mark.parametrize("group, message", [
    ("algorithm.nam", "Group: unknown column 'algorithm.nam'; did you mean 'algorithm.name'?"),
    ("progress", "Group: 'progress' is not a key runs are grouped by: a config key"),
    ("best:explorer/reward_mean", "Group: 'best:explorer/reward_mean' is not a key runs are grouped by"),
    ("algorithm.name,trainer.lr,model.path", "Group: 3 keys: runs are grouped by at most 2"),
])
def test_a_bad_group_key_is_named_on_the_page_not_applied_and_a_400_in_the_csv(researcher_client, runs, group,
                                                                                message):
    response = grouped(researcher_client, group=group)
    assert message in html.unescape(response.content.decode()) and "not grouped" in response.content.decode()
    assert response.context["table"].group == [] and len(response.context["runs"]) == 5
    assert "group=" not in response.context["csv_query"]
    refused = researcher_client.get(reverse("run-list-csv"), {"group": group})
    assert refused.status_code == 400 and message in refused.content.decode()


def test_the_grouped_csv_has_a_row_per_group_for_researchers_alone(researcher_client, runs, annotator):
    response = grouped(researcher_client, group="algorithm.name", sort="-best:explorer/reward_mean")
    assert "group=algorithm.name" in response.context["csv_query"]
    rows = read_csv(researcher_client.get(f"{reverse('run-list-csv')}?{response.context['csv_query']}"))
    assert [(row["algorithm.name"], row["runs"]) for row in rows] == [("sft", "1"), ("grpo", "3"), ("", "1")]
    grpo = rows[1]
    assert float(grpo["best:explorer/reward_mean mean"]) == pytest.approx(statistics.fmean([0.5, 0.9, 0.3]))
    assert float(grpo["best:explorer/reward_mean std"]) == pytest.approx(statistics.pstdev([0.5, 0.9, 0.3]))
    assert (grpo["best:explorer/reward_mean min"], grpo["best:explorer/reward_mean max"]) == ("0.3", "0.9")
    assert grpo["status"] == "completed 2 · failed 1"
    assert rows[2]["best:explorer/reward_mean mean"] == ""
    newest = max(Run.objects.filter(config__algorithm__name="grpo").values_list("created_at", flat=True))
    dated = read_csv(researcher_client.get(reverse("run-list-csv"), {"group": "algorithm.name", "cols": "created"}))
    # as the list's CSV writes it, not "newest 0 minutes ago"
    assert next(row["created"] for row in dated if row["algorithm.name"] == "grpo") == newest.isoformat()
    researcher_client.force_login(annotator)  # an annotator reads neither the grouped page nor its CSV
    assert researcher_client.get(reverse("run-list"), {"group": "algorithm.name"}).status_code == 403
    assert researcher_client.get(reverse("run-list-csv"), {"group": "algorithm.name"}).status_code == 403
