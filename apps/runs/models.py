import json
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.signals import pre_save
from django.dispatch import receiver


def new_secret() -> str:
    return secrets.token_hex(32)


class ShallowJSONDecoder(json.JSONDecoder):
    """Reads a stored value nested too deep for Python's decoder (a RecursionError: a 5,000-deep
    list written to the database by hand) as None, which readers show as nothing (notes.shown_tags),
    rather than a 500 on every page that loads the run."""

    def decode(self, s, *args, **kwargs):
        try:
            return super().decode(s, *args, **kwargs)
        except RecursionError:
            return None


class Sweep(models.Model):
    """Runs launched as one group over a search of config keys (apps/runs/sweeps.py): the base
    config, the space ([{"key", "values"} or {"key", "low", "high", "scale"}]) and how it was
    searched. Each of its runs keeps the values it was given (Run.swept)."""

    class Method(models.TextChoices):
        GRID = "grid"
        RANDOM = "random"

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="sweeps", on_delete=models.PROTECT)
    method = models.CharField(max_length=10, choices=Method.choices)
    space = models.JSONField()
    count = models.PositiveIntegerField(help_text="its runs")
    seed = models.BigIntegerField(default=0)
    base_config = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="when its last run finished")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.name


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
    ACTIVE = (Status.STARTING, Status.RUNNING, Status.PAUSED, Status.STOPPING)  # not finished
    # What a bench run's config holds that it never reads: it trains nothing (config_rules refuses
    # these keys' changes in mode bench, but the schema's defaults stay in every stored config).
    # Its page leaves them out (saved_models.evaluation.bench_config); the runs list shows none.
    TRAINING_SECTIONS = ("algorithm", "trainer", "feedback")
    # Still to be served: a duty is claimed, waited for and kept only in these. A stopping run's
    # duties leave (the trainer saving its last checkpoint on the way) and its queued ones exit.
    SERVED = (Status.STARTING, Status.RUNNING, Status.PAUSED)

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="runs", on_delete=models.PROTECT)
    config = models.JSONField(help_text="the validated run config (workers.rft.config)")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.BOTH)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    explorer_step = models.PositiveIntegerField(default=0)
    trainer_step = models.PositiveIntegerField(default=0)
    model_version = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # {duty: {"at": iso time, "worker": id, "pid_namespace": its pid's (duties.process_is_gone),
    # "ended": iso time once the worker let go, "broke": why its
    # rank group broke}}: who serves each duty ("loop", or "explorer" and "trainer", and
    # "trainer-node-K" per extra trainer machine: duties.duties_of_run, .holder); the
    # watchdog hands on a duty whose heartbeat expired or whose rank group broke.
    heartbeats = models.JSONField(default=dict, blank=True)
    # {duty: {"task": Celery task id, "queue", "at": iso time sent}}: the serve_duty task sent for a
    # duty that no worker has taken yet (supervision.send). A duty is sent again only once its
    # task came or was withdrawn: toggling 32 explorers had queued 620 tasks, 10 stop/resume 352.
    queued_tasks = models.JSONField(default=dict, blank=True, editable=False)  # workers' bookkeeping
    # Each resume of a failed or stopped run: {"at", "after": the status it left, "error": the
    # error it had (no longer shown as current), "checkpoint": {"version", "step"} or null}.
    resumes = models.JSONField(default=list, blank=True)
    # Where groups of the run's processes meet, by name: "trainer", the ranks of a trainer on
    # several machines (trainer.num_nodes > 1); "weights", the trainer and its explorers
    # (synchronizer.method nccl). Each is {"generation", "host", "port", "world_size"} while rank 0
    # has it open, then {"generation"} alone; each group rank 0 opens gets the next generation.
    rendezvous = models.JSONField(default=dict, blank=True)
    # What the run's process groups (its trainer's ranks, its weight group) prove they know before
    # their ranks trust each other (workers/rft/distributed.handshake). Workers read it from here
    # alone: it is in no form, page or API answer (editable=False keeps it out of the admin's).
    secret = models.CharField(max_length=64, default=new_secret, editable=False)
    live_seq = models.PositiveBigIntegerField(default=0, help_text="number of the last live message sent")
    # What the owner (or a curator) wrote about the run, and its tags: lowercase words the runs
    # list filters by (apps/runs/notes.py checks and saves both).
    notes = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True, decoder=ShallowJSONDecoder)
    # Which save of them the page was opened on: a save from an older one is refused, naming who
    # changed them and when (notes.set_notes_and_tags), where it silently overwrote their text.
    notes_version = models.PositiveIntegerField(default=0, editable=False)
    notes_changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="+", null=True, blank=True,
                                         on_delete=models.SET_NULL, editable=False)
    notes_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The sweep that launched it, and the values it swept ({key: value}). Deleting a sweep keeps its runs.
    sweep = models.ForeignKey(Sweep, related_name="runs", null=True, blank=True, on_delete=models.SET_NULL)
    swept = models.JSONField(default=dict, blank=True)
    # Set once buffer retention (apps/buffer/retention.py) takes the ended run's buffer away:
    # {"action": "archive" or "drop", "job": the BufferJob's id}. Such a run is never resumed again
    # (services.resume_run): its trainer would rewind and replay a buffer that is gone.
    buffer_retired_at = models.DateTimeField(null=True, blank=True)
    buffer_retirement = models.JSONField(default=dict, blank=True)
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


class Report(models.Model):
    """A comparison saved with a name and a note (apps/runs/views_reports.py): its runs in their
    order, the charts' filter and smoothing, and the samples panel's task and step. Every
    researcher opens it by its link, as every researcher reads every run."""

    name = models.CharField(max_length=200)
    note = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="reports", on_delete=models.PROTECT)
    run_ids = models.JSONField(help_text="the compared runs, in order")
    chart_filter = models.CharField(max_length=200, blank=True, help_text="the charts shown: those matching this")
    chart_smoothing = models.FloatField(null=True, blank=True, help_text="the charts' smoothing; none: the default",
                                        validators=[MinValueValidator(0), MaxValueValidator(0.99)])
    sample_task = models.BigIntegerField(null=True, blank=True, help_text="the samples panel's task id")
    sample_step = models.PositiveIntegerField(null=True, blank=True)
    # Which save its edit form was opened on, and who made the last: an edit from an older one is
    # refused naming them (views_reports.report_edit), where it silently overwrote their name and note.
    version = models.PositiveIntegerField(default=0, editable=False)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="+", null=True, blank=True,
                                   on_delete=models.SET_NULL, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self):
        return self.name


class RunListColumns(models.Model):
    """The columns a researcher last picked for the runs list (apps/runs/run_table.py), by their
    ids: the list shows them when its address names none (?cols=), on whichever machine the
    researcher logs in from. Kept here rather than in the browser's storage so that the page's
    own links and its CSV, made on the server, have them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE,
                                related_name="run_list_columns")
    columns = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)


class RunListView(models.Model):
    """A view of the runs list a researcher saved under a name, as W&B's saved views: its columns,
    grouping, sort and filters, kept as the list's query (apps/runs/saved_views.py), which opens it.
    Their own: a name once per researcher."""

    MAX_NAME = 100

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_list_views")
    name = models.CharField(max_length=MAX_NAME)
    query = models.TextField()  # cols=...&group=...&sort=...&where=...: what the list reads
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="run_list_view_unique")]

    def __str__(self):
        return f"{self.name} ({self.user})"


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
    time = models.DateTimeField(auto_now_add=True)  # when it was recorded: the charts' wall-time axis

    class Meta:
        ordering = ["run", "role", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "role", "step"], name="metric_unique_step")]


class MetricSummary(models.Model):
    """A run's summary of one metric of a role, as W&B keeps a run's summary: its latest value and
    that value's step, its lowest and its highest, folded in as the run's points are written
    (apps/runs/summaries.py). The runs table sorts, filters and shows these instead of reading
    every point."""

    MAX_KEY_CHARS = 200  # what a column may name (run_columns.METRIC_KEY)

    run = models.ForeignKey(Run, related_name="metric_summaries", on_delete=models.CASCADE)
    role = models.CharField(max_length=10, choices=MetricPoint.Role.choices)
    key = models.CharField(max_length=MAX_KEY_CHARS)  # after "role/", as the charts name it: "reward/mean" if nested
    latest = models.FloatField()
    latest_step = models.PositiveIntegerField()
    min = models.FloatField()
    max = models.FloatField()

    class Meta:
        # (role, key) first: "does any run record it" (run_table.unrecorded) reads the index alone.
        constraints = [models.UniqueConstraint(fields=["role", "key", "run"], name="metric_summary_unique")]

    def __str__(self):
        return f"{self.role}/{self.key} of run {self.run_id}"


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, related_name="checkpoints", on_delete=models.CASCADE)
    version = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "version"]
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="checkpoint_unique_version")]


class ExplorerStep(models.Model):
    """One explorer step of a run served by several explorers (explorer.engine_num > 1): the tasks
    its batch holds, picked once by the first explorer to open it, and what each explorer measured
    on its share (`parts`), merged into the step's explorer metrics by the one that finishes it."""

    run = models.ForeignKey(Run, related_name="explorer_steps", on_delete=models.CASCADE)
    step = models.PositiveIntegerField()
    task_ids = models.JSONField()
    parts = models.JSONField(default=list)
    opened_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="explorer_step_unique")]


class ExplorerGroup(models.Model):
    """A task's group of rollouts in an ExplorerStep: the unit explorers claim. `worker` is the
    claiming explorer as "<duty>@<worker id>" (store.DjangoStepClaims). A claim by an explorer
    whose duty no live worker holds any more is free to take again."""

    explorer_step = models.ForeignKey(ExplorerStep, related_name="groups", on_delete=models.CASCADE)
    task_id = models.BigIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["explorer_step", "task_id"], name="explorer_group_unique")]


class Worker(models.Model):
    """A Celery worker as it reports itself (apps/runs/capacity.py): registered when it is ready,
    seen again every heartbeat, marked stopped on an orderly shutdown. A worker whose heartbeat
    stopped without that is lost. Named by its Celery hostname (`runs@gpu-3`)."""

    name = models.CharField(max_length=255, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    pid_namespace = models.CharField(max_length=100, blank=True)  # duties.pid_namespace(): where pid is one
    queues = models.JSONField(default=list)
    slots = models.PositiveIntegerField(default=1, help_text="pool processes: duties it can hold at once")
    gpus = models.JSONField(default=list, blank=True)  # [{"name", "memory_gb", "used_gb"}], from nvidia-smi
    memory_gb = models.FloatField(null=True, blank=True, help_text="the memory its processes may use")
    cpus = models.PositiveIntegerField(null=True, blank=True, help_text="the cores its processes may use")
    version = models.CharField(max_length=64, blank=True)  # the code it runs (git commit)
    # What its processes used at its last beat (hosts.ProcessUsage): {"rss_gb", "cpu_percent"}.
    usage = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Its earlier lives under this name, newest last (capacity.register: a restart reuses the
    # row): {"host", "pid", "version", "started_at", "last_seen", "stopped_at": null if lost}. The
    # Workers page's Stopped and Lost lists had lost every worker restarted since (#42, finding 8).
    earlier = models.JSONField(default=list, blank=True)
    # A curator drained it (capacity.drain): {"by", "at"}; {} when it takes duties. It finishes what
    # it holds and consumes no queue meanwhile; a restart (a new life) takes duties again.
    drain = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class TaskRun(models.Model):
    """A Celery task a worker ran, as the Workers page lists them (Celery Flower's task list):
    written by the worker at the task's start and end (apps/runs/task_log.py), kept for a day and
    at most task_log.KEPT rows."""

    task_id = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=100)  # workers.tasks.serve_duty ...
    args = models.CharField(max_length=200, blank=True)  # repr, cut
    worker = models.CharField(max_length=255, blank=True)  # its Celery hostname
    started_at = models.DateTimeField(db_index=True)
    runtime_s = models.FloatField(null=True, blank=True)  # None while it runs
    outcome = models.CharField(max_length=16, default="running")  # running | success | failure | lost ...
    result = models.CharField(max_length=500, blank=True)  # its return value or error, cut

    class Meta:
        ordering = ["-started_at"]


class ApiTokenSecret(models.Model):
    """The random secret a user's API tokens are an HMAC of (apps/runs/api/tokens.py), made on first
    use. A password change deletes it, revoking the tokens (the next is made with a new one); a
    rewrite of the password's hash does not. Tokens were an HMAC of the hash itself, which Django
    rewrites at a login whenever its hasher's iterations change (each Django upgrade): every
    script's token died then, unannounced."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE,
                                related_name="api_token_secret")
    secret = models.CharField(max_length=64, default=new_secret, editable=False)


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def _revoke_api_tokens_on_password_change(sender, instance, **kwargs):
    """Django sets `_password` only in set_password, and clears it again before a hash upgrade's
    save ("Password hash upgrades shouldn't be considered password changes", check_password)."""
    if instance.pk is not None and getattr(instance, "_password", None) is not None:
        ApiTokenSecret.objects.filter(user_id=instance.pk).delete()
