"""A run's system series: what each of its duties' processes uses, recorded on the duty's
heartbeat (supervision.Heartbeat), as W&B's system charts show each process.

One point a second (its step is Unix seconds), holding each duty that beat in that second under
its own name: {"trainer": {"cpu_percent", "memory_gb", "gpu_memory_gb", "gpu0_utilization_percent",
"gpu0_memory_used_gb", "gpu0_power_w", ...}, "explorer-1": {...}}; the gpu<i>_ figures are each GPU's
own (hosts.GpuUsage), where NVML is installed, gpu_memory_gb what this process's torch holds.
A run's duties beat at the same interval from nearly the same start, so two often beat in the same
second: each merges its part into the point rather than replacing it. The run page draws a chart a
figure with a line a duty (static/js/run_page.js).

Each duty is measured in its own process and that process's children (ProcessUsage: a Celery pool
process, with the ranks or vLLM processes it starts), CPU as a percent of one core as top says it.
Embedded (make demo), every duty is a thread of the server: its figures are the server's, under
"server", recorded by one duty of the run. Before this, the series held the machine's CPU share
and the process's memory, from the loop or trainer duty only."""
import json

from django.db import IntegrityError, transaction
from django.db.models import F, Func, JSONField
from django.utils import timezone

from . import summaries
from .hosts import GpuUsage, ProcessUsage
from .models import MetricPoint, Run
from .queries import unix_time
from .services import broadcast, finite_or_none

SERVER = "server"  # embedded: the one process every duty of every run runs in
_gpus = GpuUsage()  # the process's GPUs: NVML opened once, at the first measure


class WithKey(Func):
    """The JSON object in `field` with `key` set to `value`, its other keys as they were."""

    output_field = JSONField()

    def __init__(self, field: str, key: str, value: dict):
        super().__init__(F(field))
        self.key, self.value = key, json.dumps(value)

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"({sql} || jsonb_build_object(%s::text, %s::jsonb))", (*params, self.key, self.value)

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"json_set({sql}, %s, json(%s))", (*params, f'$."{self.key}"', self.value)


def measure(usage: ProcessUsage, gpus: GpuUsage = _gpus) -> dict:
    """This process's figures now, and its GPUs' where NVML is present (none on a CPU machine);
    cpu_percent is None at the first call (it is over the time since the last)."""
    import torch  # here: torch loads only in workers, not in every web process that imports this module

    process = usage()
    values = {"cpu_percent": process["cpu_percent"], "memory_gb": process["rss_gb"]}
    if torch.cuda.is_available():
        values["gpu_memory_gb"] = torch.cuda.memory_allocated() / 2**30
    return values | gpus()


def record(run: Run, source: str, values: dict, at: float) -> None:
    """Merge `source`'s figures (a duty's name, or SERVER) into the run's system point of second
    `at`, with the run's summaries of them, and send them live. A figure that is None or not finite
    is left out."""
    figures = {key: value for key, value in values.items() if finite_or_none(value) is not None}
    part, step, now = {source: figures}, int(at), timezone.now()
    point = MetricPoint.objects.filter(run=run, role=MetricPoint.Role.SYSTEM, step=step)
    # The point locked before it is read (its row alone: services._write_point says why), so that
    # the summaries take out the part of this source it replaces.
    locked = point.select_for_update(of=("self",)).order_by("pk").values_list("values", flat=True)
    with transaction.atomic():
        held = locked.first()
        if held is None:
            try:
                with transaction.atomic():
                    MetricPoint.objects.create(run=run, role=MetricPoint.Role.SYSTEM, step=step, values=part, time=now)
            except IntegrityError:  # another duty's part of this second came first: merge into it
                held = locked.get()
        if held is not None:
            point.update(values=WithKey("values", source, figures), time=now)
        replaced = {source: held[source]} if held and isinstance(held.get(source), dict) else None
        summaries.record(run.pk, MetricPoint.Role.SYSTEM, step, part, replaced)
    broadcast(run.pk, {"type": "metrics", "role": MetricPoint.Role.SYSTEM, "step": step, "time": unix_time(now),
                       "values": part})
