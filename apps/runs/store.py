"""The engine's storage protocols for one run, over Postgres (see workers/rft/protocols.py)."""
import logging
import math
from pathlib import Path

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from apps.buffer.expert_data import DjangoExpertData
from apps.buffer.store import DjangoExperienceBuffer
from apps.tasksets.models import Taskset
from apps.tasksets.store import DjangoTaskSource
from workers.rft.protocols import Stores

from . import deletion, duties, services
from .live import checkpoints_update
from .models import Checkpoint, ExplorerGroup, ExplorerStep, Run
from .rewind import rewind

log = logging.getLogger(__name__)

PROGRESS_OF_ROLE = {"explorer": "explorer_step", "trainer": "trainer_step"}


class DjangoMetricSink:
    """One MetricPoint per role and step; moves the run's step counters (forward with each step,
    back to the checkpoint a trainer goes on from: rewind)."""

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

    def rewind(self, trainer_step: int, model_version: int, explorer_step: int | None = None) -> None:
        """The run back to where its trainer goes on from (rewind.rewind)."""
        rewind(self.run, trainer_step, model_version, explorer_step)

    def replayed(self, role: str, step: int, model_version: int | None = None) -> None:
        """A step done again from what is stored (a single loop's explorer after a rewind): no
        point, its own stays; the run's step and model version move on as they did the first
        time (the version stayed at the rewind's v0 until the replay got past the old steps)."""
        version = {} if model_version is None else {"model_version": int(model_version)}
        services.set_progress(self.run, **{PROGRESS_OF_ROLE[role]: step}, **version)


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
            services.broadcast(self.run.pk, checkpoints_update(self.run.pk))  # the run page's table

    def forget(self, checkpoints) -> list[int]:
        """All but those another run may still load a model from (deletion.loaders, as the admin's
        delete refuses them): keep_checkpoints' rotation deleted one, and that run's Resume failed
        with "no model directory at runs/3-.../checkpoints/step_3". Decided under the rows' locks,
        which a launch naming one takes too (checkpoints.lock_loaded), and the rows deleted in the
        same transaction: a launch between a check outside it and the delete was not seen, and its
        run was left naming a deleted directory."""
        may_go = []
        with transaction.atomic():
            list(self.run.checkpoints.select_for_update().filter(step__in=list(checkpoints)).values_list("pk"))
            for step, path in checkpoints.items():
                if held := deletion.loaders([(Path(path).resolve(), f"its checkpoint at step {step}")],
                                            exclude={self.run.pk}):
                    log.warning("run %s: checkpoint at step %s kept past trainer.keep_checkpoints: %s", self.run.pk,
                                step, "; ".join(held))
                else:
                    may_go.append(step)
            self.run.checkpoints.filter(step__in=may_go).delete()
            services.broadcast(self.run.pk, checkpoints_update(self.run.pk))
        return may_go

    def latest(self) -> Checkpoint | None:
        return self.run.checkpoints.order_by("-step").first()


class DjangoStepClaims:
    """workers.rft.protocols.StepClaims over Postgres, for the explorer duty `name` that `worker`
    holds. A claim's owner is "<duty>@<worker>": embedded, every explorer is a thread of one worker
    process (one worker id), and owned by the worker alone, each took the other's claims for its
    own and rolled out every group. Who is alive is who holds an explorer duty
    (duties.workers_holding): a dead explorer's claims are free again as soon as the watchdog
    would hand its duty on."""

    def __init__(self, run: Run, worker: str, name: str = "explorer"):
        self.run, self.name = run, name
        self.owner = f"{name}@{worker}"

    def open(self, step, select):
        with transaction.atomic():
            Run.objects.select_for_update(no_key=True).only("pk").get(pk=self.run.pk)  # one opener at a time
            opened = ExplorerStep.objects.filter(run=self.run, step=step).first()
            if opened is None:
                opened = ExplorerStep.objects.create(run=self.run, step=step, task_ids=list(select()))
                ExplorerGroup.objects.bulk_create(
                    ExplorerGroup(explorer_step=opened, task_id=task_id) for task_id in opened.task_ids
                )
        return opened.task_ids

    def claim(self, step):
        run = Run.objects.only("heartbeats").get(pk=self.run.pk)
        alive = {f"{duty}@{worker}" for duty, worker in duties.workers_holding(run).items()
                 if duties.is_explorer(duty)}
        groups = ExplorerGroup.objects.filter(explorer_step__run=self.run, explorer_step__step=step)
        # The explorers serving the run now, not when this one started: one that joined takes its share.
        share = math.ceil(groups.count() / len(alive | {self.owner}))
        with transaction.atomic():
            free = (
                groups.select_for_update(skip_locked=True, of=("self",))
                .filter(done_at=None)
                .filter(Q(worker="") | Q(worker=self.owner) | ~Q(worker__in=alive))
            )
            mine = list(free[:share])
            ExplorerGroup.objects.filter(pk__in=[g.pk for g in mine]).update(worker=self.owner,
                                                                               claimed_at=timezone.now())
        return [g.task_id for g in mine]

    def done(self, step, task_ids, part):
        with transaction.atomic():
            opened = ExplorerStep.objects.select_for_update().get(run=self.run, step=step)
            opened.groups.filter(task_id__in=list(task_ids)).update(done_at=timezone.now())
            opened.parts = [*opened.parts, {**part, "worker": self.owner, "explorer": self.name}]
            opened.save(update_fields=["parts"])

    def finish(self, step, then):
        with transaction.atomic():
            opened = ExplorerStep.objects.select_for_update().get(run=self.run, step=step)
            if opened.finished_at is not None:
                return True
            if opened.groups.filter(done_at=None).exists():
                return False
            then(opened.parts)
            opened.finished_at = timezone.now()
            opened.save(update_fields=["finished_at"])
        return True


class DjangoWeightGroup:
    """workers.rft.protocols.WeightGroup on the run's record (Run.rendezvous["weights"]), for the
    trainer (duty "trainer": rank 0) or an explorer (duty explorer: rank 1, explorer-K: rank K+1)."""

    def __init__(self, run: Run, duty: str):
        self.run = run
        self.rank = 0 if duty == "trainer" else 1 + (0 if duty == "explorer" else int(duty.rpartition("-")[2]))
        self.secret = run.secret  # what the group's sides prove they know (weight_broadcast._Group)

    def open(self, port):
        host, explorers = settings.RFTWEB_NODE_ADDRESS, self.run.config["explorer"]["engine_num"]
        return services.open_rendezvous(self.run, "weights", host, port, explorers), host, port, explorers

    def current(self):
        """Called from the explorer's receiving thread, every half second while no group is open:
        it closes that thread's connection each time rather than hold one for the run."""
        try:
            group = Run.objects.filter(pk=self.run.pk).values_list("rendezvous", flat=True).get().get("weights", {})
        finally:
            connection.close()
        return (group["generation"], group["host"], group["port"], group["world_size"]) if "host" in group else None

    def close(self, generation):
        services.close_rendezvous(self.run, "weights", generation)


def taskset_source(name: str | None, run: Run | None = None) -> DjangoTaskSource | None:
    return DjangoTaskSource(Taskset.objects.get(name=name), run.pk if run else None) if name else None


def run_stores(run: Run, config, duty: str = "loop", worker: str = "") -> Stores:
    """The run's stores for the duty `worker` holds: an explorer that is a worker of its own gets
    the claims its run's explorers share steps by, however many there are (explorers may be added
    while the run trains); with synchronizer.method nccl, trainer and explorers get the weight group."""
    buffer = config.buffer
    expert = Taskset.objects.filter(name=buffer.expert_taskset).first() if buffer.expert_taskset else None
    return Stores(
        task_source=taskset_source(buffer.taskset, run),
        buffer=DjangoExperienceBuffer(run.pk, explorer=duty if duties.is_explorer(duty) else None),
        metrics=DjangoMetricSink(run),
        eval_source=taskset_source(buffer.eval_taskset),
        expert_source=DjangoTaskSource(expert) if expert else None,
        expert_data=DjangoExpertData(run.pk, buffer.expert_dataset) if buffer.expert_dataset else None,
        checkpoints=DjangoCheckpointStore(run),
        claims=DjangoStepClaims(run, worker, duty) if duties.is_explorer(duty) else None,
        weight_group=DjangoWeightGroup(run, duty) if config.synchronizer.method == "nccl" and duty != "loop" else None,
        thread_finished=connections.close_all,  # the connections Django opened for that thread
    )
