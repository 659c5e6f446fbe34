"""Sweeps (apps/runs/sweeps.py; issue #44, item 1): the space as typed and as the API takes it, a
grid and a seeded random search, every run's config validated before any run is made, the launch
form's Sweep box, the sweep page's table and chart, and the API. On Postgres and SQLite."""
import json

import pytest
from django.urls import reverse

from apps.runs import services, sweeps
from apps.runs.api import token_for
from apps.runs.forms import LaunchForm
from apps.runs.models import Run, Sweep
from apps.runs.presets import preset_config

from .test_launch import posted

SPACE = [{"key": "trainer.lr", "values": [1e-5, 3e-5, 1e-4]}, {"key": "algorithm.kl.coef", "values": [0, 0.01]}]


def base() -> dict:
    config = preset_config("quick-demo")
    config["algorithm"]["kl"] = {"fn": "k3", "coef": 0.001}  # a coefficient needs an estimator
    return config


# ---- the space -----------------------------------------------------------------------------------


def test_the_box_reads_listed_values_and_ranges():
    axes = sweeps.parse_space("trainer.lr: 1e-5, 3e-5\n# a comment\n\nalgorithm.kl.fn: k1, k3\n"
                              "algorithm.kl.coef: 0.001 .. 0.1 log\nexplorer.temperature: 0.5..1.0")
    assert [axis.to_json() for axis in axes] == [
        {"key": "trainer.lr", "values": [1e-5, 3e-5]}, {"key": "algorithm.kl.fn", "values": ["k1", "k3"]},
        {"key": "algorithm.kl.coef", "low": 0.001, "high": 0.1, "scale": "log"},
        {"key": "explorer.temperature", "low": 0.5, "high": 1.0, "scale": "linear"},
    ]
    assert sweeps.parse_space('mode: "both", true, null')[0].values == ("both", True, None)
    # a scale in capitals is a scale, not a text value ("the space holds 1 distinct point")
    assert [axis.scale for axis in sweeps.parse_space("trainer.lr: 1e-5 .. 1e-3 LOG\nx.y: 1 .. 2 Linear")] == \
        ["log", "linear"]
    # `..` inside a value, not between numbers, is text
    assert sweeps.parse_space("a.path: ../data, b..c")[0].values == ("../data", "b..c")
    assert sweeps.parse_space("a.path: ../data")[0].values == ("../data",)


@pytest.mark.parametrize(("text", "message"), [
    ("trainer.lr 1e-5", "line 1: write `key: value, value`"),
    ("trainer.lr: 1e-5\ntrainer.lr: 1e-4", "swept twice"),
    ("trainer.lr: 1e-5, 1e-5", "listed twice"),
    ("trainer.lr: 0.1 .. 0.01", "low < high"),
    ("trainer.lr: 0 .. 0.01 log", "log range needs low > 0"),
    ("trainer.lr: a .. b", "two numbers"),
    ("trainer..lr: 1", "is not a config key"),
    ("", "name at least one key"),
    ("\n".join(f"k{i}: 1" for i in range(9)), "at most 8 keys"),
    ("trainer.lr: " + ", ".join(str(i) for i in range(33)), "1 to 32 values"),
    ("x" * 4001, "at most 4000 characters"),
    ("trainer.lr: 1 .. 2 .. 3", "line 1: a range is `low .. high`, then `log` or `linear`"),
    ("# lr\ntrainer.lr: .. 1e-3", "line 2: a range is `low .. high`"),
    ("trainer.lr: 1e-5 .. 1e-3 logg", "line 1: a range is"),
    ("trainer.lr: 1e-5 ... 1e-3", "line 1: a range is"),
])
def test_a_bad_space_names_what_is_wrong(text, message):
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.parse_space(text)
    assert message in str(err.value)


def test_a_grid_takes_every_combination_in_order():
    made = sweeps.combinations(sweeps.axes_of(SPACE), "grid", None, 0)
    assert made == [{"trainer.lr": lr, "algorithm.kl.coef": coef} for lr in (1e-5, 3e-5, 1e-4) for coef in (0, 0.01)]


def test_a_grid_refuses_ranges_and_more_than_32_runs():
    with pytest.raises(sweeps.SweepError, match="a range needs method random"):
        sweeps.combinations(sweeps.parse_space("trainer.lr: 1e-5 .. 1e-3"), "grid", None, 0)
    with pytest.raises(sweeps.SweepError, match="makes 36 runs; at most 32"):
        sweeps.combinations(sweeps.parse_space("a.b: 1,2,3,4,5,6\na.c: 1,2,3,4,5,6"), "grid", None, 0)


def test_a_random_search_draws_within_its_ranges_the_same_for_the_same_seed():
    axes = sweeps.parse_space("trainer.lr: 1e-6 .. 1e-3 log\ntrainer.warmup_steps: 0 .. 10\nalgorithm.kl.fn: k1, k3")
    drawn = sweeps.combinations(axes, "random", 20, seed=7)
    assert drawn == sweeps.combinations(axes, "random", 20, seed=7) != sweeps.combinations(axes, "random", 20, seed=8)
    assert all(1e-6 <= run["trainer.lr"] <= 1e-3 for run in drawn)
    assert all(isinstance(run["trainer.warmup_steps"], int) and 0 <= run["trainer.warmup_steps"] <= 10 for run in drawn)
    assert {run["algorithm.kl.fn"] for run in drawn} == {"k1", "k3"}
    # Log-uniform: about as many draws below 3e-5 (the geometric middle) as above it.
    below = sum(run["trainer.lr"] < 10 ** -4.5 for run in sweeps.combinations(axes, "random", 32, seed=1))
    assert 8 <= below <= 24
    for count in (0, 33, None, True):
        with pytest.raises(sweeps.SweepError, match="count is 1 to 32"):
            sweeps.combinations(axes, "random", count, 0)


def test_a_random_search_draws_distinct_points_and_refuses_a_space_too_small():
    """Seed 0, count 2 and explorer.batch_size: 1 .. 8 drew batch_size=7 twice: two identical runs."""
    axes = sweeps.parse_space("explorer.batch_size: 1 .. 8")
    assert [run["explorer.batch_size"] for run in sweeps.combinations(axes, "random", 2, seed=0)] == [7, 1]
    assert sorted(run["explorer.batch_size"] for run in sweeps.combinations(axes, "random", 8, seed=0)) == \
        list(range(1, 9))
    with pytest.raises(sweeps.SweepError, match="the space holds 8 distinct points, and a random search draws "
                                                "each of its 9 runs once: lower the count to 8"):
        sweeps.combinations(axes, "random", 9, 0)
    narrow = sweeps.parse_space("trainer.lr: 1e-5 .. 1.0000000000000002e-5")  # no 15-figure number in it
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.combinations(narrow, "random", 2, 0)
    assert str(err.value).startswith("trainer.lr: the range 1e-05 .. 1.00000000000000") and \
        str(err.value).endswith("is too narrow to draw from: widen it")
    two = sweeps.parse_space("algorithm.kl.fn: k1, k3\ntrainer.warmup_steps: 0 .. 2")  # 2 x 3 points
    drawn = sweeps.combinations(two, "random", 6, seed=4)
    assert len({json.dumps(run) for run in drawn}) == 6 and drawn == sweeps.combinations(two, "random", 6, seed=4)


def test_an_integer_keys_log_range_draws_distinct_whole_numbers_log_uniformly():
    """`trainer.batch_size: 2 .. 64 log` drew 2.71 and 45.3: runs the launch then refused."""
    (axis,) = sweeps.parse_space("trainer.batch_size: 2 .. 64 log")
    drawn = [run["trainer.batch_size"] for seed in range(40) for run in sweeps.combinations([axis], "random", 8, seed)]
    assert all(type(value) is int and 2 <= value <= 64 for value in drawn)
    assert sum(value <= 11 for value in drawn) > len(drawn) / 3  # 2 .. 11 is half the log range, a sixth of the line
    (small,) = sweeps.parse_space("explorer.batch_size: 1 .. 16 log")
    assert sorted(run["explorer.batch_size"] for run in sweeps.combinations([small], "random", 16, 3)) == \
        list(range(1, 17))
    with pytest.raises(sweeps.SweepError, match="the space holds 16 distinct points, and a random search draws "
                                                "each of its 17 runs once: lower the count to 16"):
        sweeps.combinations([small], "random", 17, 0)


def test_a_ranges_numbers_follow_the_keys_type_not_how_its_bounds_are_written():
    floats = sweeps.combinations(sweeps.parse_space("trainer.weight_decay: 0 .. 1"), "random", 8, 0)
    assert all(type(run["trainer.weight_decay"]) is float for run in floats)  # drew only 0 and 1, refusing count 3
    assert len({run["trainer.weight_decay"] for run in floats}) == 8
    (whole,) = sweeps.parse_space("explorer.batch_size: 1.0 .. 8")
    assert (whole.low, whole.high, whole.integer) == (1, 8, True)
    assert all(type(run["explorer.batch_size"]) is int for run in sweeps.combinations([whole], "random", 8, 0))
    untyped = sweeps.parse_space("explorer.workflow_args.max_turns: 1 .. 4\nexplorer.workflow_args.p: 1 .. 4 log")
    assert [axis.integer for axis in untyped] == [True, False]  # a mapping's keys: as written, as before
    with pytest.raises(sweeps.SweepError, match="explorer.batch_size: takes whole numbers"):
        sweeps.parse_space("explorer.batch_size: 1.5 .. 8")


@pytest.mark.parametrize(("text", "count", "figures"), [
    ("explorer.temperature: 0.5 .. 0.502", 5, 4),  # three numbers of 3 figures: 0.500, 0.501, 0.502
    ("explorer.temperature: 0.1234 .. 0.1236", 3, 4),  # none of 3 figures: each draw left the range
    ("trainer.lr: 1.0001e-5 .. 1.0002e-5 log", 4, 6),
    ("algorithm.kl.coef: -0.502 .. -0.5", 5, 4),
    ("trainer.lr: 1e-6 .. 1e-3 log", 32, 3),  # a range as wide as a person's: as before
])
def test_a_ranges_draws_stay_inside_it_and_distinct_with_the_fewest_figures_that_allow(text, count, figures):
    (axis,) = sweeps.parse_space(text)
    for seed in range(20):
        values = [run[axis.key] for run in sweeps.combinations([axis], "random", count, seed)]
        assert len(set(values)) == count and all(axis.low <= value <= axis.high for value in values), values
        assert max(len(f"{abs(value):e}".split("e")[0].replace(".", "").rstrip("0")) for value in values) <= figures
    assert any(len(f"{abs(value):e}".split("e")[0].replace(".", "").rstrip("0")) == figures
               for seed in range(20) for run in sweeps.combinations([axis], "random", count, seed)
               for value in run.values())


def test_run_names_say_what_each_run_swept():
    assert sweeps.run_name("lr sweep", {"trainer.lr": 1e-05, "algorithm.kl.coef": 0.01}, 1) == \
        "lr sweep · lr=1e-05 · coef=0.01"
    assert sweeps.run_name("s", {"trainer.batch_size": 8, "explorer.batch_size": 4}, 1) == \
        "s · trainer.batch_size=8 · explorer.batch_size=4"


def test_a_long_sweep_name_is_cut_before_the_swept_values():
    """A 200-character sweep name was all of each run's name: its runs were named alike."""
    names = [sweeps.run_name("s" * 200, {"trainer.lr": lr}, n) for n, lr in enumerate((1e-5, 3e-5), 1)]
    assert names == ["s" * 188 + "… · lr=1e-05", "s" * 188 + "… · lr=3e-05"] and len(names[0]) == 200
    long_values = [sweeps.run_name("sweep", {"a.b": "v" * 300 + tail}, n) for n, tail in enumerate("xy", 1)]
    assert long_values == [f"sweep… #{n} · b={'v' * (199 - len('sweep… #1 · b='))}…" for n in (1, 2)]
    assert all(len(name) == 200 for name in long_values)


# ---- launching -----------------------------------------------------------------------------------


def test_a_sweep_launches_each_run_with_its_values(researcher, tasksets, worker_queue,
                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        sweep = sweeps.launch_sweep(researcher, "lr x kl", base(), SPACE, "grid")
    runs = list(sweep.runs.order_by("pk"))
    assert sweep.count == len(runs) == 6 and worker_queue == [run.pk for run in runs]
    for run, values in zip(runs, sweeps.combinations(sweeps.axes_of(SPACE), "grid", None, 0)):
        assert run.swept == values and run.status == Run.Status.QUEUED
        assert (run.config["trainer"]["lr"], run.config["algorithm"]["kl"]["coef"]) == tuple(values.values())
        assert run.config["algorithm"]["name"] == "mix"  # the rest is the base's
    assert runs[0].name == "lr x kl · lr=1e-05 · coef=0"


def test_a_sweep_with_the_longest_name_names_its_runs_apart(researcher, tasksets, worker_queue):
    sweep = sweeps.launch_sweep(researcher, "n" * 200, base(), SPACE, "grid")
    names = list(sweep.runs.values_list("name", flat=True))
    assert len(set(names)) == 6 and all(len(name) <= 200 and "· lr=" in name for name in names)


def test_a_sweep_with_one_bad_run_makes_no_run(researcher, tasksets, worker_queue):
    space = [{"key": "trainer.lr", "values": [1e-5, -1.0]}, {"key": "trainer.total_stepz", "values": [3]}]
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.launch_sweep(researcher, "bad", base(), space, "grid")
    messages = {issue.key: issue.message for issue in err.value.errors}
    assert "trainer.lr" in messages and "with trainer.lr=-1.0" in messages["trainer.lr"]
    assert "total_steps" in messages["trainer.total_stepz"]  # the closest valid name
    assert not Run.objects.exists() and not Sweep.objects.exists() and worker_queue == []


def test_a_sweep_over_the_algorithm_leaves_out_what_each_run_does_not_read(researcher, tasksets, worker_queue):
    """From the quick demo (mix, mix.mu 0.5): the grpo run takes neither mix.mu nor the expert
    share, and is not refused for them; the mix run keeps them. A swept key the algorithm ignores
    is still refused: the person chose it."""
    config = base()
    space = [{"key": "algorithm.name", "values": ["mix", "grpo"]}]
    sweep = sweeps.launch_sweep(researcher, "algorithms", config, space, "grid")
    mixed, grpo = (run.config["algorithm"] for run in sweep.runs.order_by("pk"))
    assert (mixed["name"], mixed["mix"]) == ("mix", {"mu": 0.5, "expert_data_ratio": 0.5})
    assert (grpo["name"], grpo["mix"]) == ("grpo", {"mu": 0.1, "expert_data_ratio": 0.25})
    config["algorithm"]["name"] = "grpo"
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.launch_sweep(researcher, "mu", config, [{"key": "algorithm.mix.mu", "values": [0.3, 0.6]}], "grid")
    assert "algorithm.mix.mu" in {issue.key for issue in err.value.errors}


# ---- the launch form and the sweep page ----------------------------------------------------------


def test_the_launch_form_launches_a_sweep_and_its_page_tables_the_results(
        researcher_client, tasksets, worker_queue, django_capture_on_commit_callbacks):
    form = LaunchForm.for_config(base(), name="lr x kl")
    data = posted(form, sweep="trainer.lr: 1e-5, 3e-5, 1e-4\nalgorithm.kl.coef: 0, 0.01", sweep_method="grid",
                  launch_sweep="")
    with django_capture_on_commit_callbacks(execute=True):
        response = researcher_client.post(reverse("run-launch"), data)
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response.url == reverse("sweep-detail", args=[sweep.pk])
    runs = list(sweep.runs.order_by("pk"))
    assert len(runs) == 6 and len(worker_queue) == 6
    # Two runs evaluated: the better held-out figure is first, and the chart carries it.
    for run, accuracy in ((runs[2], 0.25), (runs[4], 0.75)):
        for step, value in ((0, 0.1), (2, accuracy), (4, accuracy - 0.05)):
            services.record_metrics(run, "eval", step, {"reward_mean": value})
    page = researcher_client.get(response.url)
    rows = page.context["table"]["rows"]
    assert [row["run"] for row in rows[:2]] == [runs[4], runs[2]] and rows[0]["result"] == 0.75
    assert [row["values"] for row in rows[:2]] == [[1e-4, 0], [3e-5, 0]]
    chart = json.loads(page.context["chart"] and json.dumps(page.context["chart"]))
    assert chart["axes"] == ["trainer.lr", "algorithm.kl.coef", page.context["table"]["result_label"]]
    assert chart["runs"][0]["values"] == [1e-4, 0, 0.75] and chart["runs"][-1]["values"][-1] is None
    text = page.content.decode()
    assert "Stop the sweep" in text and f"runs={runs[0].pk}&amp;runs={runs[1].pk}" in text
    assert " · 6 runs · " in text
    listed = researcher_client.get(reverse("sweep-list")).content.decode()
    assert "lr x kl" in listed and "grid over" in listed
    # A curator deletes a run: the page counts what is left, as the list does (it said 6, listing 5);
    # its runs stopping, Stop is no longer offered (it was, and did nothing more).
    runs.pop().delete()
    Run.objects.filter(pk__in=[run.pk for run in runs]).update(status=Run.Status.STOPPING)
    text = researcher_client.get(response.url).content.decode()
    assert " · 5 runs (1 deleted) · " in text and "Stop the sweep" not in text
    detail = researcher_client.get(reverse("run-detail", args=[runs[0].pk])).content.decode()
    assert "in sweep" in detail and "trainer.lr=1e-05" in detail


def test_the_launch_form_shows_a_sweeps_problems_where_they_are(researcher_client, tasksets, worker_queue):
    form = LaunchForm.for_config(base(), name="s")
    response = researcher_client.post(reverse("run-launch"), posted(
        form, sweep="trainer.lr: 1e-5, -1\nexplorer.nope: 1", sweep_method="grid", launch_sweep=""))
    assert response.status_code == 200 and not Run.objects.exists()
    form = response.context["form"]
    assert "with trainer.lr=-1" in str(form.errors["trainer.lr"])  # next to its field
    assert "explorer.nope" in str(form.errors["sweep"])  # no field: by the sweep box
    random_without_count = researcher_client.post(reverse("run-launch"), posted(
        LaunchForm.for_config(base()), sweep="trainer.lr: 1e-5 .. 1e-3 log", sweep_method="random", sweep_count="",
        launch_sweep=""))
    assert "count is 1 to 32" in str(random_without_count.context["form"].errors["sweep"])
    # A problem of the space itself, though it names a config key, is the sweep box's: a range in a
    # grid was shown on the valid repeat_times field (and around the whole YAML box).
    for editor in ("form", "yaml"):
        ranged_grid = researcher_client.post(reverse("run-launch"), posted(
            LaunchForm.for_config(base()), sweep="algorithm.repeat_times: 2 .. 8", sweep_method="grid",
            launch_sweep="", **({"editor": "yaml"} if editor == "yaml" else {})))
        errors = ranged_grid.context["form"].errors
        assert "algorithm.repeat_times: a grid takes listed values" in str(errors["sweep"]), editor
        assert set(errors) == {"sweep"}, (editor, errors)


def test_an_annotator_sees_no_sweep(annotator_client, researcher, tasksets, worker_queue):
    sweep = sweeps.launch_sweep(researcher, "s", base(), SPACE[:1], "grid")
    assert annotator_client.get(reverse("sweep-list")).status_code == 403
    assert annotator_client.get(reverse("sweep-detail", args=[sweep.pk])).status_code == 403


# ---- the API -------------------------------------------------------------------------------------


def test_a_script_launches_a_sweep_and_reads_it(client, researcher, tasksets, worker_queue,
                                                 django_capture_on_commit_callbacks):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token_for(researcher)}"}
    body = {"name": "api sweep", "config": base(), "method": "random", "count": 4, "seed": 3,
            "space": [{"key": "trainer.lr", "low": 1e-5, "high": 1e-3, "scale": "log"}]}
    with django_capture_on_commit_callbacks(execute=True):
        made = client.post("/api/sweeps/", json.dumps(body), content_type="application/json", **auth)
    assert made.status_code == 201, made.content
    sweep = made.json()
    assert (sweep["method"], sweep["count"], len(sweep["runs"]), len(worker_queue)) == ("random", 4, 4, 4)
    assert all(1e-5 <= run["swept"]["trainer.lr"] <= 1e-3 for run in sweep["runs"])
    assert client.get(f"/api/sweeps/{sweep['id']}/", **auth).json()["runs"] == sweep["runs"]
    assert client.get("/api/sweeps/", **auth).json()["results"][0]["id"] == sweep["id"]
    bad = client.post("/api/sweeps/", json.dumps({**body, "count": 40}), content_type="application/json", **auth)
    assert bad.status_code == 400 and bad.json()["errors"] == [{"key": "sweep", "message":
                                                                  "a random search's count is 1 to 32 runs"}]
    seed = client.post("/api/sweeps/", json.dumps({**body, "seed": "x"}), content_type="application/json", **auth)
    assert seed.status_code == 400 and seed.json()["errors"][0]["key"] == "seed"
    assert Sweep.objects.count() == 1
    assert client.get("/api/sweeps/999/", **auth).status_code == 404


def test_a_scripts_random_sweep_launches_distinct_runs(client, researcher, tasksets, worker_queue):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token_for(researcher)}"}
    body = {"name": "bs", "config": base(), "method": "random", "count": 2, "seed": 0,
            "space": [{"key": "explorer.batch_size", "low": 1, "high": 8}]}
    made = client.post("/api/sweeps/", json.dumps(body), content_type="application/json", **auth)
    assert made.status_code == 201, made.content
    assert [run["name"] for run in made.json()["runs"]] == ["bs · batch_size=7", "bs · batch_size=1"]
    too_many = client.post("/api/sweeps/", json.dumps({**body, "count": 9}), content_type="application/json", **auth)
    assert too_many.status_code == 400
    assert "the space holds 8 distinct points" in too_many.json()["errors"][0]["message"]
    assert Sweep.objects.count() == 1


def test_a_log_range_of_an_integer_key_launches(researcher, tasksets, worker_queue):
    space = [{"key": "explorer.batch_size", "low": 1, "high": 16, "scale": "log"}]
    sweep = sweeps.launch_sweep(researcher, "bs", base(), space, "random", count=4, seed=0)
    sizes = [run.config["explorer"]["batch_size"] for run in sweep.runs.order_by("pk")]
    assert len(set(sizes)) == 4 and all(type(size) is int for size in sizes)


def test_a_sweep_not_evaluated_ranks_by_final_train_reward_and_says_so(researcher_client, researcher, tasksets,
                                                                          worker_queue):
    sweep = sweeps.launch_sweep(researcher, "lr", base(), SPACE[:1], "grid")
    runs = list(sweep.runs.order_by("pk"))
    page = researcher_client.get(reverse("sweep-detail", args=[sweep.pk])).content.decode()
    # Nothing reported yet: no result to name (it read "Held-out, best, best" and "best held-out, best first").
    assert "Runs, in launch order: none has a result yet" in page and "best, best" not in page
    assert "<th class=\"num\">Held-out (best)</th>" in page
    # No eval_interval: the final train reward ranks them, as the table's docstring says.
    for run, rewards in zip(runs, ((0.2, 0.5), (0.9, 0.3), (0.1, 0.7))):
        for step, reward in enumerate(rewards, start=1):
            services.record_metrics(run, "explorer", step, {"reward_mean": reward})
    table = sweeps.table(sweep)
    assert [row["run"] for row in table["rows"]] == [runs[2], runs[0], runs[1]]
    assert [row["result"] for row in table["rows"]] == [0.7, 0.5, 0.3]
    assert table["result_label"] == "Train reward (final)" and table["held_out_label"] is None
    page = researcher_client.get(reverse("sweep-detail", args=[sweep.pk])).content.decode()
    assert "Runs, ranked by train reward (final)" in page
    # Once one run is evaluated the held-out figure ranks, the others last.
    services.record_metrics(runs[1], "eval", 2, {"exact_match": 0.4})
    table = sweeps.table(sweep)
    assert [row["run"] for row in table["rows"]] == [runs[1], runs[0], runs[2]]
    assert table["result_label"] == "Held-out accuracy (best)" == table["held_out_label"] + " (best)"


def test_the_sweep_page_takes_as_many_queries_for_six_runs_as_for_two(researcher_client, researcher, tasksets,
                                                                      worker_queue, django_assert_max_num_queries):
    """Each run's summary was read on its own: 106 queries and 1.6 s for 6 runs."""
    small = sweeps.launch_sweep(researcher, "two", base(), [{"key": "trainer.lr", "values": [1e-5, 2e-5]}], "grid")
    big = sweeps.launch_sweep(researcher, "six", base(), SPACE, "grid")
    for run in Run.objects.all():
        for step in (1, 2):
            services.record_metrics(run, "explorer", step, {"reward_mean": 0.5, "rollouts": 8, "response_length": 3.0})
            services.record_metrics(run, "trainer", step, {"loss": 0.5})
            services.record_metrics(run, "eval", step, {"exact_match": 0.5})
    with django_assert_max_num_queries(40) as two:
        assert researcher_client.get(reverse("sweep-detail", args=[small.pk])).status_code == 200
    with django_assert_max_num_queries(len(two.captured_queries)):
        assert researcher_client.get(reverse("sweep-detail", args=[big.pk])).status_code == 200
