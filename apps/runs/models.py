from django.conf import settings
from django.db import models


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPING = "stopping"
        STOPPED = "stopped"
        COMPLETED = "completed"
        FAILED = "failed"

    class Mode(models.TextChoices):
        BOTH = "both"
        EXPLORE = "explore"
        TRAIN = "train"
        BENCH = "bench"

    FINISHED = (Status.STOPPED, Status.COMPLETED, Status.FAILED)
    ACTIVE = (Status.STARTING, Status.RUNNING, Status.PAUSED, Status.STOPPING)  # a worker's to serve

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="runs", on_delete=models.PROTECT)
    config = models.JSONField(help_text="the validated run config (workers.rft.config)")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.BOTH)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    explorer_step = models.PositiveIntegerField(default=0)
    trainer_step = models.PositiveIntegerField(default=0)
    model_version = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # {role: {"at": iso time, "worker": id, "ended": iso time once the worker let go}}: who serves
    # each role (services.holder); the watchdog hands on a role whose heartbeat expired.
    heartbeats = models.JSONField(default=dict, blank=True)
    # Each resume of a failed or stopped run: {"at", "after": the status it left, "error": the
    # error it had (no longer shown as current), "checkpoint": {"version", "step"} or null}.
    resumes = models.JSONField(default=list, blank=True)
    live_seq = models.PositiveBigIntegerField(default=0, help_text="number of the last live message sent")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class MetricPoint(models.Model):
    """All scalars of one role at one step, in one row."""

    class Role(models.TextChoices):
        EXPLORER = "explorer"
        TRAINER = "trainer"
        EVAL = "eval"
        SYSTEM = "system"

    run = models.ForeignKey(Run, related_name="metrics", on_delete=models.CASCADE)
    role = models.CharField(max_length=10, choices=Role.choices)
    step = models.PositiveIntegerField()
    values = models.JSONField()
    time = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "role", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "role", "step"], name="metric_unique_step")]


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, related_name="checkpoints", on_delete=models.CASCADE)
    version = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "version"]
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="checkpoint_unique_version")]
