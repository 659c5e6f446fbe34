"""A bench run in the runs list (mode bench: it evaluates a model and trains nothing): its stored
config keeps the schema's training defaults (algorithm.name grpo, trainer.lr 1e-5), which its row
showed as if it had used them. Its training keys (Run.TRAINING_SECTIONS) are none in its row, the
CSV, the sort (last either way), the filters (no value to match) and the groups ("(not set)"); a
training run's are as before. On Postgres and SQLite: each reads the config in SQL."""

import pytest
from django.urls import reverse

from apps.runs.models import Run
from workers.rft.config import RunConfig

from .test_run_table import listed, read_csv

pytestmark = pytest.mark.django_db
COLS = "algorithm.name,trainer.lr,model.path,mode"


@pytest.fixture
def runs(make_run):
    """Two GRPO runs at lr 3e-5 and 3e-6, and a bench run whose config holds the defaults' grpo and 1e-5."""
    made = {}
    for name, lr in (("grpo-a", 3e-5), ("grpo-b", 3e-6)):
        config = RunConfig.from_dict({"algorithm": {"name": "grpo"}, "trainer": {"lr": lr}}).to_dict()
        made[name] = make_run(name, status=Run.Status.COMPLETED, config=config)
    config = RunConfig.from_dict({"mode": "bench", "buffer": {"taskset": "sums-eval",
                                                              "eval_taskset": "sums-eval"}}).to_dict()
    assert (config["algorithm"]["name"], config["trainer"]["lr"]) == ("grpo", 1e-5)  # stored, never used
    made["bench"] = make_run("bench", mode=Run.Mode.BENCH, status=Run.Status.COMPLETED, config=config)
    return made


def row(page: str, run: Run) -> str:
    start = page.index(f'href="{reverse("run-detail", args=[run.pk])}"')
    return page[start:page.index("</tr>", start)]


def test_a_bench_runs_row_shows_no_algorithm_or_lr_and_a_training_runs_does(researcher_client, runs):
    page = researcher_client.get(reverse("run-list"), {"cols": COLS}).content.decode()
    bench = row(page, runs["bench"])
    assert 'title="algorithm.name: none, a bench run trains nothing"><span class="muted">—</span>' in bench
    assert 'title="trainer.lr: none, a bench run trains nothing"><span class="muted">—</span>' in bench
    assert ">grpo<" not in bench and "<td>bench</td>" in bench and ">tiny<" in bench  # its model is its own
    grpo = row(page, runs["grpo-a"])
    assert 'title="algorithm.name: grpo">grpo</td>' in grpo and 'title="trainer.lr: 3e-05">3e-05</td>' in grpo


def test_the_csv_leaves_a_bench_runs_training_keys_empty(researcher_client, runs):
    rows = {row["name"]: row for row in read_csv(researcher_client.get(reverse("run-list-csv"), {"cols": COLS}))}
    assert (rows["bench"]["algorithm.name"], rows["bench"]["trainer.lr"], rows["bench"]["mode"]) == ("", "", "bench")
    assert (rows["grpo-a"]["algorithm.name"], rows["grpo-a"]["trainer.lr"]) == ("grpo", "3e-05")


def test_a_bench_run_sorts_last_by_a_training_key_either_way(researcher_client, runs):
    assert listed(researcher_client, cols=COLS, sort="trainer.lr") == ["grpo-b", "grpo-a", "bench"]
    assert listed(researcher_client, cols=COLS, sort="-trainer.lr") == ["grpo-a", "grpo-b", "bench"]
    assert listed(researcher_client, cols=COLS, sort="algorithm.name")[-1] == "bench"
    assert listed(researcher_client, cols=COLS, sort="-algorithm.name")[-1] == "bench"


@pytest.mark.parametrize("where, expected", [
    ("algorithm.name = grpo", ["grpo-a", "grpo-b"]),
    ("algorithm.name != grpo", ["bench"]),  # != keeps the runs without a value
    ("trainer.lr = 1e-5", []),  # the bench's stored default, which it never used
    ("trainer.lr <= 3e-5", ["grpo-a", "grpo-b"]),
    ("trainer.lr != 3e-5", ["bench", "grpo-b"]),
    ("mode = bench", ["bench"]),
])
def test_a_filter_on_a_training_key_finds_no_value_in_a_bench_run(researcher_client, runs, where, expected):
    assert sorted(listed(researcher_client, cols=COLS, where=where)) == expected


def test_a_bench_run_groups_as_not_set_by_a_training_key(researcher_client, runs):
    response = researcher_client.get(reverse("run-list"), {"cols": COLS, "group": "algorithm.name"})
    groups = {group.values: group for group in response.context["groups"]}
    assert {values: len(group.runs) for values, group in groups.items()} == {("grpo",): 2, (None,): 1}
    assert groups[(None,)].runs == [runs["bench"].pk]
    lr = {column.id: cell for column, cell in groups[(None,)].cells}["trainer.lr"]
    assert (lr["mean"], lr["count"]) == (None, 0)
    by_mode = researcher_client.get(reverse("run-list"), {"cols": COLS, "group": "mode"}).context["groups"]
    bench = next(group for group in by_mode if group.values == ("bench",))
    assert {column.id: cell["text"] for column, cell in bench.cells}["algorithm.name"] is None
