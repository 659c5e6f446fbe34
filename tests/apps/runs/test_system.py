"""A run's system series: each duty's process figures, merged into one point a second
(apps/runs/system.py), on SQLite (embedded) and Postgres alike."""
import re
import sys
import threading
import time
import types

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.runs import system
from apps.runs.hosts import GpuUsage, ProcessUsage
from apps.runs.live import publisher
from apps.runs.models import MetricPoint, Run
from apps.runs.supervision import Heartbeat

AT = 1_700_000_000.4


@pytest.fixture
def heard(monkeypatch):
    """What the run's live channel is sent (after commit)."""
    updates = []
    monkeypatch.setattr(publisher, "publish", lambda run_id, update: updates.append(update))
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


# ---- GPUs (NVML) ---------------------------------------------------------------------------------


def fake_nvml(gpus: list[dict], init_error: bool = False) -> types.ModuleType:
    """pynvml as nvidia-ml-py has it, over `gpus` ({"uuid", "busy" %, "used" bytes, "mw" or None});
    a handle is the GPU's index. `inits` counts nvmlInit's calls."""
    nvml = types.ModuleType("pynvml")
    nvml.inits = 0

    class NVMLError(Exception):
        pass

    def init():
        nvml.inits += 1
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def by_index(index):
        if not 0 <= index < len(gpus):
            raise NVMLError("Invalid Argument")
        return index

    def power(handle):
        if gpus[handle]["mw"] is None:
            raise NVMLError("Not Supported")
        return gpus[handle]["mw"]

    nvml.NVMLError, nvml.nvmlInit, nvml.nvmlDeviceGetHandleByIndex = NVMLError, init, by_index
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: by_index(next((i for i, g in enumerate(gpus) if g["uuid"] == uuid),
                                                                 -1))
    nvml.nvmlDeviceGetIndex = lambda handle: handle
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=gpus[handle]["busy"], memory=0)
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=gpus[handle]["used"], total=80 * 2**30)
    nvml.nvmlDeviceGetPowerUsage = power
    return nvml


TWO_GPUS = [{"uuid": "GPU-aaa", "busy": 87, "used": int(3.5 * 2**30), "mw": 251_340},
            {"uuid": "GPU-bbb", "busy": 0, "used": 0, "mw": None}]  # a board that reports no power


def gpu_keys(values: dict) -> set:
    return {key for key in values if re.match(r"gpu\d", key)}


def test_a_machine_without_nvml_records_no_gpu_figure_and_asks_once(monkeypatch):
    """This machine (no pynvml), and a machine with the package but no driver: CPU and memory alone."""
    assert GpuUsage()() == {}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: its import fails
    values = system.measure(ProcessUsage(), GpuUsage())
    assert {"cpu_percent", "memory_gb"} <= set(values) and not gpu_keys(values)
    nvml = fake_nvml(TWO_GPUS, init_error=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = GpuUsage()
    assert gpus() == gpus() == {} and nvml.inits == 1


def test_each_gpu_reports_its_utilization_memory_and_power(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(TWO_GPUS))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    values = system.measure(ProcessUsage(), GpuUsage())
    assert {key: values[key] for key in gpu_keys(values)} == {
        "gpu0_utilization_percent": 87, "gpu0_memory_used_gb": 3.5, "gpu0_power_w": 251.3,  # %, GiB, W (NVML: mW)
        "gpu1_utilization_percent": 0, "gpu1_memory_used_gb": 0.0,  # no power: left out, not 0
    }


@pytest.mark.parametrize(("visible", "keys"), [
    ("1", {"gpu1_utilization_percent", "gpu1_memory_used_gb"}),
    ("GPU-aaa", {"gpu0_utilization_percent", "gpu0_memory_used_gb", "gpu0_power_w"}),
    ("", set()), ("7", set()),
])
def test_only_the_gpus_the_process_may_use_and_by_the_machines_numbers(monkeypatch, visible, keys):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(TWO_GPUS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert set(GpuUsage()()) == keys


@pytest.mark.django_db(transaction=True)
def test_a_duties_gpu_figures_join_its_part_of_the_point(make_run, heard, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(TWO_GPUS[:1]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = make_run(status=Run.Status.RUNNING)
    system.record(run, "trainer", system.measure(ProcessUsage(), GpuUsage()), AT)
    trainer = points(run)[1_700_000_000]["trainer"]
    assert trainer["gpu0_power_w"] == 251.3 and trainer["gpu0_utilization_percent"] == 87 and "memory_gb" in trainer
