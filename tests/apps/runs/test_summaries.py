"""Each run's summaries of its metrics (apps/runs/summaries.py): the latest value and step, the
lowest and the highest of each role's keys, true to the run's points after new steps, replayed
steps, a duty's rewritten second, deleted points and runs, and two processes writing one run at
once; on Postgres and SQLite alike."""
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.urls import reverse

from apps.runs import deletion, services, summaries, system
from apps.runs.models import MetricPoint, MetricSummary, Run
from apps.runs.store import DjangoMetricSink
from tests.support import ROOT, service_env

Status = Run.Status


def stored(run) -> dict:
    """{(role, key): (latest, latest step, lowest, highest)} as the summaries hold them."""
    return {(row.role, row.key): (row.latest, row.latest_step, row.min, row.max)
            for row in MetricSummary.objects.filter(run=run)}


def scanned(run) -> dict:
    """The same, read from every point of the run here (nested keys joined with "/")."""
    found = {}
    for point in MetricPoint.objects.filter(run=run).order_by("step"):
        for key, value in _flat(point.values):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                _, _, low, high = found.get((point.role, key), (value, 0, value, value))
                found[point.role, key] = (value, point.step, min(low, value), max(high, value))
    return found


def _flat(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}/")
        else:
            yield prefix + key, value


def test_the_summary_follows_the_points_as_they_are_written(make_run):
    run = make_run(status=Status.RUNNING)
    services.record_metrics(run, "trainer", 1, {"loss": 0.9, "kl": 0, "note": "warm-up", "clipped": True})
    services.record_metrics(run, "trainer", 2, {"loss": 0.2, "kl": 0.5, "reward": {"mean": 0.4, "std": 0.1}})
    services.record_metrics(run, "trainer", 3, {"loss": 0.5, "kl": float("nan")})  # a diverged kl: stored null
    services.record_metrics(run, "explorer", 3, {"reward_mean": 0.7})
    assert stored(run) == {
        ("trainer", "loss"): (0.5, 3, 0.2, 0.9),
        ("trainer", "kl"): (0.5, 2, 0.0, 0.5),  # its latest is the last step that has it as a number
        ("trainer", "reward/mean"): (0.4, 2, 0.4, 0.4),
        ("trainer", "reward/std"): (0.1, 2, 0.1, 0.1),
        ("explorer", "reward_mean"): (0.7, 3, 0.7, 0.7),
    }  # text and booleans are no metric


def test_a_flat_key_comes_before_the_same_key_nested_as_the_table_looked_it_up():
    assert summaries.numbers({"reward": {"mean": 2}, "reward/mean": 1, "a": {"b/c": 3}, "x": [1]}) == {
        "reward/mean": 1.0, "a/b/c": 3.0}
    too_deep = {"a": {"b/c/d/e": 1}}  # past run_columns.SPLIT_SLASHES only the flat and fully nested are read
    assert summaries.numbers(too_deep) == {} and summaries.numbers({"a": {"b": {"c": {"d": {"e": 1}}}}}) == {
        "a/b/c/d/e": 1.0}
    assert summaries.numbers({'say "hi"': 1, "k" * 201: 1, "big": 10**400}) == {}  # what no column can name


def test_replayed_steps_leave_the_summary_true(make_run):
    """A resumed run replays the steps after its checkpoint: their points are rewritten, and the
    points beyond stay (until they are replayed too), so the latest is still the highest step's."""
    run = make_run(status=Status.RUNNING)
    sink = DjangoMetricSink(run)
    for step, loss in enumerate([0.9, 0.5, 0.1, 0.4, 0.3], 1):
        sink.log("trainer", step, {"loss": loss, "seconds": step} | ({"spike": 7} if step == 5 else {}))
    sink.log("trainer", 3, {"loss": 0.6, "seconds": 3})  # the lowest, replaced by a higher one
    assert stored(run)[("trainer", "loss")] == (0.3, 5, 0.3, 0.9) and stored(run) == scanned(run)
    sink.log("trainer", 4, {"loss": 0.05})  # the lowest now, at a step below the latest
    assert stored(run)[("trainer", "loss")] == (0.3, 5, 0.05, 0.9) and stored(run) == scanned(run)
    sink.log("trainer", 5, {"loss": 0.95})  # the latest and highest, without "seconds" or "spike" now
    assert stored(run) == {("trainer", "loss"): (0.95, 5, 0.05, 0.95), ("trainer", "seconds"): (3.0, 3, 1.0, 3.0)}
    assert stored(run) == scanned(run)


def test_a_trainer_going_back_to_its_checkpoint_takes_its_lost_steps_out(make_run):
    """DjangoMetricSink.rewind (a resume or hand-over): the trainer's points after the checkpoint,
    and a single loop's eval points after its explorer's step, go; the explorer's stay."""
    run = make_run(status=Status.RUNNING)
    sink = DjangoMetricSink(run)
    for step, loss in enumerate([0.9, 0.5, 0.4, 0.1, 0.3], 1):
        sink.log("trainer", step, {"loss": loss} | ({"late": 1.0} if step == 5 else {}))
        sink.log("eval", step, {"accuracy": step / 10})
        sink.log("explorer", step, {"reward_mean": step / 10})
    sink.rewind(trainer_step=3, model_version=3, explorer_step=4)
    assert stored(run) == {("trainer", "loss"): (0.4, 3, 0.4, 0.9), ("eval", "accuracy"): (0.4, 4, 0.1, 0.4),
                           ("explorer", "reward_mean"): (0.5, 5, 0.1, 0.5)} == scanned(run)
    sink.log("trainer", 4, {"loss": 0.2})  # replayed
    assert stored(run)[("trainer", "loss")] == (0.2, 4, 0.2, 0.9)


def test_any_order_of_writes_and_rewrites_keeps_it_true(make_run):
    """Seeded: steps written, rewritten and skipped at random, keys coming and going, nested or not."""
    run = make_run(status=Status.RUNNING)
    chance = random.Random(7)
    for write in range(200):
        values = {key: round(chance.uniform(-1, 1), 2) for key in ("a", "b", "c") if chance.random() < 0.7}
        if chance.random() < 0.3:
            values["n"] = {"x": chance.choice([0.5, 1, -2])}
        services.record_metrics(run, chance.choice(["trainer", "eval"]), chance.randrange(12), values)
        if write % 10 == 9:
            assert stored(run) == scanned(run), write
    assert stored(run) == scanned(run)


def test_a_duty_rewriting_its_part_of_a_second_leaves_the_system_summary_true(make_run):
    run = make_run(status=Status.RUNNING)
    system.record(run, "trainer", {"cpu_percent": 190, "memory_gb": 3.5}, 1_700_000_000.1)
    system.record(run, "explorer", {"cpu_percent": 20}, 1_700_000_000.4)
    system.record(run, "trainer", {"cpu_percent": 40}, 1_700_000_000.9)  # the same second, again
    assert stored(run) == {("system", "trainer/cpu_percent"): (40.0, 1_700_000_000, 40.0, 40.0),
                           ("system", "explorer/cpu_percent"): (20.0, 1_700_000_000, 20.0, 20.0)}
    system.record(run, "trainer", {"cpu_percent": 50, "memory_gb": 3.0}, 1_700_000_001.2)
    assert stored(run) == scanned(run)


def test_points_deleted_in_the_admin_are_taken_out_of_the_summary(client, curator, make_run):
    run = make_run(status=Status.COMPLETED)
    for step, loss in enumerate([0.5, 0.1, 0.3], 1):
        services.record_metrics(run, "trainer", step, {"loss": loss})
    services.record_metrics(run, "explorer", 1, {"reward_mean": 0.5})
    lowest = MetricPoint.objects.get(run=run, role="trainer", step=2)
    client.force_login(curator)
    deleted = client.post(reverse("admin:runs_metricpoint_delete", args=[lowest.pk]), {"post": "yes"})
    assert deleted.status_code == 302
    assert stored(run) == {("trainer", "loss"): (0.3, 3, 0.3, 0.5), ("explorer", "reward_mean"): (0.5, 1, 0.5, 0.5)}
    rest = MetricPoint.objects.filter(run=run, role="trainer").values_list("pk", flat=True)
    client.post(reverse("admin:runs_metricpoint_changelist"),
                {"action": "delete_selected", "_selected_action": list(rest), "post": "yes"})
    assert stored(run) == {("explorer", "reward_mean"): (0.5, 1, 0.5, 0.5)} == scanned(run)


def test_a_deleted_run_takes_its_summaries_with_it(make_run):
    run = make_run(status=Status.COMPLETED)
    services.record_metrics(run, "trainer", 1, {"loss": 0.5})
    deletion.delete_runs([run])
    assert not MetricSummary.objects.exists()


def test_the_summaries_of_points_written_otherwise_are_made_again_from_them(make_run):
    """rebuild (the data migration's, and bench/runs_table.py's after it generates points in SQL)."""
    run, other = make_run("r"), make_run("other")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, role="trainer", step=step, values={"loss": 1 / step})
                                     for step in (3, 1, 2)])
    services.record_metrics(other, "trainer", 1, {"loss": 0.5})
    MetricSummary.objects.filter(run=run).update(min=-1)  # stale
    assert summaries.rebuild(MetricPoint, MetricSummary, [run.pk]) == 1
    assert stored(run) == {("trainer", "loss"): (1 / 3, 3, 1 / 3, 1.0)}
    assert stored(other) == {("trainer", "loss"): (0.5, 1, 0.5, 0.5)}  # not among the runs asked for


# ---- two processes writing one run ------------------------------------------------------------------

STEPS = 60
KEYS = 30


def write_steps(run_id: int, role: str, seed: int, go: str) -> None:
    """A duty (`python -c`, or a thread with a database connection of its own): STEPS points of
    `role` through the metric sink, each followed by the eval point of that step, which the other
    duty writes too, at once."""
    from django.db import connection

    from apps.runs.live import publisher

    sink, chance = DjangoMetricSink(Run.objects.get(pk=run_id)), random.Random(seed)
    while not Path(go).exists():
        time.sleep(0.01)
    for step in range(1, STEPS + 1):
        sink.log(role, step, {f"k{index}": chance.random() for index in range(KEYS)})
        sink.log("eval", step, {"accuracy": chance.random(), f"only_{role}": chance.random()})
    publisher.flush()
    connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("apart", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_an_explorer_and_a_trainer_writing_one_run_at_once_leave_it_true(make_run, tmp_path, apart):
    """Two duties, as an explorer and a trainer on two workers (processes: each starts Django, ~6 s
    of CPU), or threads of one: each writes its own role's keys, and both the same eval steps,
    rewriting each other's points; the summaries keep only the values the points kept."""
    run = make_run(status=Status.RUNNING)
    go = tmp_path / "go"
    duties = [(run.pk, role, seed, str(go)) for seed, role in enumerate(("explorer", "trainer"))]
    if apart == "threads":
        failed = []

        def write(*duty):
            try:
                write_steps(*duty)
            except Exception as err:  # noqa: BLE001 - the test says it
                failed.append(err)

        writers = [threading.Thread(target=write, args=duty) for duty in duties]
        for writer in writers:
            writer.start()
        go.touch()
        for writer in writers:
            writer.join(timeout=120)
        assert not failed, "\n".join(map(str, failed))
    else:
        script = ("import django, sys; django.setup(); from tests.apps.runs.test_summaries import write_steps; "
                  "write_steps(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4])")
        writers = [subprocess.Popen([sys.executable, "-c", script, *map(str, duty)], cwd=ROOT, env=service_env(),
                                    stderr=subprocess.PIPE, text=True) for duty in duties]
        go.touch()
        for writer in writers:
            assert writer.wait(timeout=300) == 0, writer.stderr.read()
    assert MetricPoint.objects.filter(run=run).count() == 3 * STEPS
    found = stored(run)
    assert found == scanned(run)
    own = {(role, f"k{index}") for role in ("explorer", "trainer") for index in range(KEYS)}
    assert own | {("eval", "accuracy")} < set(found)
    run.refresh_from_db()
    assert (run.explorer_step, run.trainer_step) == (STEPS, STEPS)
