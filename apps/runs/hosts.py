"""The machines a run's processes would run on, and what each has: memory, cores, GPUs.

A Celery worker reports its machine's when it registers (capacity.register); a launch checks a
run's estimated footprint and trainer ranks against the live workers of the queues its duties go
to (config_fit.fit_issues). Embedded (no Celery), this process's machine serves every duty.

Memory and cores are what this process may use: a container's cgroup limit where it is below the
machine's (a worker in a 4 GB container on a 64 GB host is killed at 4 GB).
"""
import math
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.utils import timezone

from .duties import process_is_gone
from .models import Worker

GB = 2**30
CGROUP = Path("/sys/fs/cgroup")
THIS_MACHINE = f"this machine ({socket.gethostname()})"


@dataclass(frozen=True)
class Host:
    name: str  # the worker's Celery name, or THIS_MACHINE
    memory: int | None  # bytes; None: not reported (a worker started before workers reported it)
    cpus: int | None
    gpus: tuple[int, ...] = field(default=())  # each GPU's memory, bytes


def memory_bytes() -> int:
    """This process's memory: the machine's, or its cgroup's limit where lower (v2, then v1)."""
    total = psutil.virtual_memory().total
    for limit in (CGROUP / "memory.max", CGROUP / "memory" / "memory.limit_in_bytes"):
        value = _read(limit)
        if value is not None and value.isdigit():
            total = min(total, int(value))
    return total


class ProcessUsage:
    """What this process and its children use (a Celery worker: its pool processes), measured at
    each call: {"rss_gb", "cpu_percent"} (percent of one core, as top; over the time since the last
    call, None at the first). The Workers page showed what a worker may use, not what it does."""

    def __init__(self):
        self.me = psutil.Process()
        self.last: tuple[float, float] | None = None  # (cpu seconds, wall time)

    def __call__(self) -> dict:
        rss, cpu = 0, 0.0
        for process in [self.me, *self.me.children(recursive=True)]:
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    # a process's reaped children's time stays counted in it: the sum only grows
                    cpu += times.user + times.system + (times.children_user + times.children_system
                                                        if process is self.me else 0.0)
            except psutil.Error:  # it exited while being read
                continue
        now = time.monotonic()
        percent = None
        if self.last is not None and now > self.last[1]:
            percent = round(max(0.0, cpu - self.last[0]) / (now - self.last[1]) * 100)
        self.last = (cpu, now)
        return {"rss_gb": round(rss / GB, 2), "cpu_percent": percent}


class GpuUsage:
    """What each GPU this process may use is doing, device-wide as W&B's system charts show it (every
    process's use of it), from NVML: nvidia-ml-py's pynvml, what torch.cuda.utilization reads, and
    not CUDA, which the main process of a prefork worker must not initialise. Each call returns
    {"gpu<i>_utilization_percent", "gpu<i>_memory_used_gb", "gpu<i>_power_w"} for each such GPU, i
    its index as nvidia-smi numbers the machine's (two duties on one GPU name it alike); a figure
    the device does not report (power, on some boards) is left out. {} without NVML (no package, no
    driver: a CPU machine), found out once. The GPUs: those CUDA_VISIBLE_DEVICES lists (indices, or
    GPU-<uuid>), else all; an index there is taken as NVML's, which CUDA's is unless
    CUDA_DEVICE_ORDER is left FASTEST_FIRST on a machine of unlike GPUs."""

    def __init__(self):
        self.lock = threading.Lock()  # one instance serves every duty's heartbeat thread of a process
        self.nvml = None
        self.devices: list[tuple[int, object]] | None = None  # (index, NVML handle); None: not looked yet

    def __call__(self) -> dict:
        with self.lock:
            if self.devices is None:
                self.devices = self._devices()
        figures = {}
        for index, handle in self.devices:
            for name, read in GPU_FIGURES:
                try:
                    figures[f"gpu{index}_{name}"] = read(self.nvml, handle)
                except self.nvml.NVMLError:  # not supported by this board, or the GPU is lost
                    continue
        return figures

    def _devices(self) -> list:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:  # the package without a driver (libnvidia-ml.so)
            return []
        self.nvml = pynvml
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        wanted = range(pynvml.nvmlDeviceGetCount()) if listed is None else listed.split(",")
        devices = []
        for entry in wanted:
            entry = str(entry).strip()
            try:
                handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                          else pynvml.nvmlDeviceGetHandleByUUID(entry))
                devices.append((pynvml.nvmlDeviceGetIndex(handle), handle))
            except pynvml.NVMLError:  # no such GPU (or a MIG slice, which NVML names otherwise)
                continue
        return devices


# Each GPU figure: its name and how NVML reads it, in the units the other figures use.
GPU_FIGURES = (
    ("utilization_percent", lambda nvml, handle: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
    ("memory_used_gb", lambda nvml, handle: round(nvml.nvmlDeviceGetMemoryInfo(handle).used / GB, 2)),
    ("power_w", lambda nvml, handle: round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)),  # NVML: milliwatts
)


def cpu_count() -> int:
    """The cores this process may run on (its affinity), or its cgroup's CPU quota where lower."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _read(CGROUP / "cpu.max")  # v2: "<quota> <period>" or "max <period>"
    parts = quota.split() if quota else [_read(CGROUP / "cpu" / "cpu.cfs_quota_us"),
                                        _read(CGROUP / "cpu" / "cpu.cfs_period_us")]
    if len(parts) == 2 and all(part and part.isdigit() for part in parts) and int(parts[1]) > 0:
        cores = min(cores, max(1, math.ceil(int(parts[0]) / int(parts[1]))))
    return cores


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def gpus() -> list[dict]:
    """The GPUs this machine has, from nvidia-smi: the main process of a prefork worker must not
    initialise CUDA (a pool process forked after that could not use it)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        name, total, used = (part.strip() for part in line.rsplit(",", 2))
        try:
            found.append({"name": name, "memory_gb": round(float(total) / 1024, 1),
                          "used_gb": round(float(used) / 1024, 1)})
        except ValueError:
            continue
    return found


def this_machine() -> Host:
    return Host(THIS_MACHINE, memory_bytes(), cpu_count(), _gpu_bytes(gpus()))


def serving(queue: str) -> list[Host]:
    """The live workers that take `queue` (embedded: this machine takes every queue). Live: not
    stopped, and seen within RFTWEB_HEARTBEAT_TIMEOUT, as the Workers page counts them."""
    if settings.RFTWEB_EMBEDDED:
        return [this_machine()]
    seen = timezone.now() - timedelta(seconds=settings.RFTWEB_HEARTBEAT_TIMEOUT)
    live = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=seen).order_by("name")
    return [
        Host(worker.name, worker.memory_gb and int(worker.memory_gb * GB), worker.cpus, _gpu_bytes(worker.gpus))
        for worker in live if queue in worker.queues and not gone(worker)
    ]


def gone(worker: Worker) -> bool:
    """A worker of this machine whose main process has exited (kill -9: no orderly stop marked it).
    Its last beat stays fresh for up to RFTWEB_HEARTBEAT_TIMEOUT: the Workers page showed a dead
    worker's 2 slots free for 2 minutes, and runs waited for it. Elsewhere, or in another pid
    namespace under this host name: False (its beat tells)."""
    return worker.pid is not None and process_is_gone(f"{worker.host}:{worker.pid}", worker.pid_namespace)


def _gpu_bytes(found: list) -> tuple[int, ...]:
    return tuple(int(gpu["memory_gb"] * GB) for gpu in found if isinstance(gpu, dict)
                 and isinstance(gpu.get("memory_gb"), (int, float)))
