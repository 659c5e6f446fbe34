"""A run's system series: each duty's process figures, merged into one point a second
(apps/runs/system.py), on SQLite (embedded) and Postgres alike."""
import threading
import time

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.runs import services, system
from apps.runs.hosts import ProcessUsage
from apps.runs.models import MetricPoint, Run
from apps.runs.supervision import Heartbeat

AT = 1_700_000_000.4


@pytest.fixture
def heard(monkeypatch):
    """What the run's live channel is sent (after commit)."""
    updates = []
    monkeypatch.setattr(services.publisher, "publish", lambda run_id, update: updates.append(update))
    return updates


def points(run):
    return {point.step: point.values for point in run.metrics.filter(role=MetricPoint.Role.SYSTEM)}


@pytest.mark.django_db(transaction=True)
def test_duties_beating_in_the_same_second_each_keep_their_figures(make_run, heard):
    run = make_run(status=Run.Status.RUNNING)
    system.record(run, "trainer", {"cpu_percent": 190, "memory_gb": 3.5}, AT)
    system.record(run, "explorer", {"cpu_percent": 95, "memory_gb": 2.25, "gpu_memory_gb": 1.0}, AT + 0.5)
    system.record(run, "explorer-1", {"cpu_percent": None, "memory_gb": float("nan")}, AT + 0.1)
    # The old code replaced the point: the last duty's figures alone were left.
    assert points(run) == {1_700_000_000: {"trainer": {"cpu_percent": 190, "memory_gb": 3.5},
                                           "explorer": {"cpu_percent": 95, "memory_gb": 2.25, "gpu_memory_gb": 1.0},
                                           "explorer-1": {}}}
    # The next second is a point of its own, and a duty's next beat replaces only its own part.
    system.record(run, "trainer", {"cpu_percent": 40, "memory_gb": 3.6}, AT + 1)
    system.record(run, "trainer", {"memory_gb": 3.7}, AT + 1)
    system.record(run, "explorer", {"cpu_percent": 80, "memory_gb": 2.0}, AT + 1)
    assert points(run)[1_700_000_001] == {"trainer": {"memory_gb": 3.7},
                                          "explorer": {"cpu_percent": 80, "memory_gb": 2.0}}
    # Live, each beat sends its own part: the page draws it as that duty's line.
    assert heard[1] == {"type": "metrics", "role": "system", "step": 1_700_000_000, "time": heard[1]["time"],
                        "values": {"explorer": {"cpu_percent": 95, "memory_gb": 2.25, "gpu_memory_gb": 1.0}}}


@pytest.mark.django_db(transaction=True)
def test_duties_racing_for_a_new_second_lose_nothing(make_run, heard):
    """Eight threads (a run's duties) write the same new second at once: whichever creates the
    point, the others merge into it."""
    run = make_run(status=Run.Status.RUNNING)
    start = threading.Barrier(8)

    def beat(k):
        start.wait()
        system.record(run, f"explorer-{k}", {"cpu_percent": k}, AT)

    threads = [threading.Thread(target=beat, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert points(run) == {1_700_000_000: {f"explorer-{k}": {"cpu_percent": k} for k in range(8)}}


def test_a_duty_is_measured_in_its_own_process():
    """Its memory and, from the second beat, its CPU as a percent of one core; not the machine's."""
    usage = ProcessUsage()
    system.measure(usage)  # torch imported first: its import's time is not in what follows
    first = system.measure(ProcessUsage())
    assert first["cpu_percent"] is None and first["memory_gb"] > 0
    usage = ProcessUsage()
    system.measure(usage)
    cpu, wall = time.process_time(), time.monotonic()
    while time.process_time() < cpu + 0.3:  # this process busy on one core (the machine may be busier)
        pass
    second = system.measure(usage)
    busy = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
    assert busy * 0.8 <= second["cpu_percent"] <= busy * 1.25 + 5


def beats(run, duty, embedded):
    """Two beats of a real Heartbeat of `duty`, as a worker holds it."""
    with override_settings(RFTWEB_EMBEDDED=embedded):
        beat = Heartbeat(run, duty, "test-worker", interval=0.05)
    beat.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([p for p in points(run).values() if beat.source in p]) < 2:
        time.sleep(0.05)
    beat.stop()


@pytest.mark.django_db(transaction=True)
def test_each_duty_on_workers_beats_its_own_figures(make_run, heard):
    now = timezone.now().isoformat()
    run = make_run(status=Run.Status.RUNNING, heartbeats={duty: {"at": now, "worker": "test-worker"}
                                                          for duty in ("explorer", "trainer")})
    for duty in ("explorer", "trainer"):
        beats(run, duty, embedded=False)
    parts = {duty for values in points(run).values() for duty in values}
    assert parts == {"explorer", "trainer"}
    assert any(values.get("trainer", {}).get("cpu_percent") is not None for values in points(run).values())


@pytest.mark.django_db(transaction=True)
def test_embedded_one_duty_records_the_servers_figures(make_run, heard):
    """Every duty is a thread of the server: one set of figures, named as the server's."""
    now = timezone.now().isoformat()
    run = make_run(status=Run.Status.RUNNING, heartbeats={duty: {"at": now, "worker": "test-worker"}
                                                          for duty in ("explorer", "trainer")})
    with override_settings(RFTWEB_EMBEDDED=True):
        assert Heartbeat(run, "explorer", "test-worker", 1).source is None
    beats(run, "trainer", embedded=True)
    assert {duty for values in points(run).values() for duty in values} == {system.SERVER}
