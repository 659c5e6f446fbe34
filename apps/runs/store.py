"""The engine's storage protocols for one run, over Postgres (see workers/rft/protocols.py)."""
from django.db import connections, transaction
from django.utils import timezone

from apps.buffer.store import DjangoExperienceBuffer
from apps.tasksets.models import Taskset
from apps.tasksets.store import DjangoTaskSource
from workers.rft.loop import Stores

from . import services
from .models import Checkpoint, Run

PROGRESS_OF_ROLE = {"explorer": "explorer_step", "trainer": "trainer_step"}


class DjangoMetricSink:
    """One MetricPoint per role and step; moves the run's step counters."""

    def __init__(self, run: Run):
        self.run = run

    def log(self, role: str, step: int, values: dict) -> None:
        with transaction.atomic():
            services.record_metrics(self.run, role, step, values)
            if role in PROGRESS_OF_ROLE:
                progress = {PROGRESS_OF_ROLE[role]: step}
                if role == "explorer" and "model_version" in values:
                    progress["model_version"] = int(values["model_version"])
                services.set_progress(self.run, **progress)


class DjangoCheckpointStore:
    def __init__(self, run: Run):
        self.run = run

    def record(self, version: int, step: int, path: str) -> None:
        # created_at is when this version was last saved: the buffer rewinds what was consumed after it.
        with transaction.atomic():
            Checkpoint.objects.update_or_create(
                run=self.run, version=version, defaults={"step": step, "path": path, "created_at": timezone.now()}
            )
            services.set_progress(self.run, model_version=version)

    def forget(self, steps) -> None:
        self.run.checkpoints.filter(step__in=list(steps)).delete()

    def latest(self) -> Checkpoint | None:
        return self.run.checkpoints.order_by("-step").first()


def taskset_source(name: str | None) -> DjangoTaskSource | None:
    return DjangoTaskSource(Taskset.objects.get(name=name)) if name else None


def run_stores(run: Run, config) -> Stores:
    buffer = config.buffer
    expert = Taskset.objects.filter(name=buffer.expert_taskset).first() if buffer.expert_taskset else None
    return Stores(
        task_source=taskset_source(buffer.taskset),
        buffer=DjangoExperienceBuffer(run.pk),
        metrics=DjangoMetricSink(run),
        eval_source=taskset_source(buffer.eval_taskset),
        expert_source=DjangoTaskSource(expert) if expert else None,
        checkpoints=DjangoCheckpointStore(run),
        thread_finished=connections.close_all,  # the connections Django opened for that thread
    )
