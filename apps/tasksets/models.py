import uuid
from pathlib import Path

from django.conf import settings
from django.db import models
from django.urls import reverse

from apps.accounts.roles import CURATOR, RESEARCHER, has_role
from apps.core.models import Job


class ReadyTasksets(models.Manager):
    """Tasksets but those still being imported: `Taskset.objects`, so no list, form, API or run
    sees (or launches on) a taskset whose tasks are still arriving."""

    def get_queryset(self):
        return super().get_queryset().filter(ready=True)


class Taskset(models.Model):
    """A named collection of tasks. `field_mapping` records which source columns became which task fields."""

    # A paragraph on its page and in the API: the built-ins' longest is under 130 characters; with no
    # limit, a 100 KB description was taken from the API and shown whole.
    MAX_DESCRIPTION = 2000

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(max_length=MAX_DESCRIPTION, blank=True)
    field_mapping = models.JSONField(default=dict, blank=True)
    default_workflow = models.CharField(max_length=100, default="single_turn")
    default_reward_fn = models.CharField(max_length=100, default="exact_match")
    source = models.CharField(max_length=300, blank=True, help_text="file name or generator it came from")
    task_count = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    # False while an import writes its tasks, in committed chunks (services.import_taskset): one
    # transaction for a 200k-row file held embedded SQLite's only write lock for 20-45 s, and a
    # training run's writes gave up after the 30 s busy timeout. Deleted if the import fails.
    ready = models.BooleanField(default=True, editable=False)

    objects = ReadyTasksets()  # the default manager: the admin and every query see ready ones only
    all_objects = models.Manager()  # with those being imported: names taken, leftovers to delete

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def own_tasks(self):
        """Its tasks without those runs made (Task.run)."""
        return self.tasks.filter(run=None)


class Task(models.Model):
    taskset = models.ForeignKey(Taskset, related_name="tasks", on_delete=models.CASCADE)
    index = models.PositiveIntegerField()
    # A plain string, or a list of chat messages [{"role": ..., "content": ...}].
    prompt = models.JSONField()
    answer = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    difficulty = models.FloatField(default=0.0)
    priority = models.FloatField(default=0.0)
    # A task a run's task pipeline made (synthesize_harder) is that run's alone and goes with it;
    # the taskset's own tasks have none. It was added to the taskset: every run on it drew it, and
    # the taskset grew under its curator (2,000 -> 2,020 tasks after one run).
    run = models.ForeignKey("runs.Run", null=True, blank=True, related_name="+", on_delete=models.CASCADE)

    class Meta:
        ordering = ["taskset", "index"]
        constraints = [models.UniqueConstraint(fields=["taskset", "index"], name="task_unique_index")]

    def __str__(self):
        return f"{self.taskset.name}#{self.index}"

    @property
    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in self.prompt)


class TaskDraw(models.Model):
    """How many times one run drew one task (the explorer draws least-drawn first; the priority
    pipeline's use_count reads it). Per run: it was a count on the task, so every run on a taskset
    moved the others' picks, and two runs of a sweep that differ in one key drew different tasks.

    With a task selector that learns (buffer.task_selector difficulty_based), also what the run
    learned of the task from its groups (workers.rft.experience.TaskStats), written with the count
    when a step finishes: the selection of the next step reads both."""

    run = models.ForeignKey("runs.Run", related_name="+", on_delete=models.CASCADE)
    task = models.ForeignKey(Task, related_name="draws", on_delete=models.CASCADE)
    count = models.PositiveIntegerField(default=0)
    # Passes and fails of its groups, discounted by the steps since, as of seen_step (None: no
    # group recorded); solved_streak: its latest groups in a row whose every rollout passed.
    successes = models.FloatField(default=0.0)
    failures = models.FloatField(default=0.0)
    seen_step = models.PositiveIntegerField(null=True, blank=True)
    solved_streak = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task"], name="task_draw_unique")]


def _upload_path(job, filename):
    # A random name: two uploads of "train.jsonl" must not collide, and the user's file name
    # (kept in original_filename) never becomes a path on the server.
    return f"uploads/{uuid.uuid4().hex}{Path(filename).suffix.lower()}"


class TasksetImport(Job):
    """One upload being imported into a new taskset: the job the upload page shows progress for."""

    upload = models.FileField(upload_to=_upload_path, blank=True, help_text="deleted once the import has finished")
    original_filename = models.CharField(max_length=255)
    name = models.SlugField(max_length=100, help_text="name of the taskset to create")
    format = models.CharField(max_length=10)
    field_mapping = models.JSONField(default=dict)
    description = models.TextField(max_length=Taskset.MAX_DESCRIPTION, blank=True)
    default_workflow = models.CharField(max_length=100)
    default_reward_fn = models.CharField(max_length=100)
    taskset = models.ForeignKey(Taskset, null=True, blank=True, related_name="imports", on_delete=models.SET_NULL)

    job_type = "tasksets.import"

    def __str__(self):
        return f"import of {self.original_filename} as {self.name} ({self.status})"

    def may_view(self, user) -> bool:
        """The researcher who uploaded the file, and curators."""
        return has_role(user, RESEARCHER) and (self.created_by_id == user.pk or has_role(user, CURATOR))

    def may_cancel(self, user) -> bool:
        """The researcher who uploaded the file (from the import's page), and whoever may delete
        imports in the admin: a pending or running one is cancelled instead (services.run_import
        stops after its next batch and deletes what it wrote)."""
        if self.created_by_id == user.pk and has_role(user, RESEARCHER):
            return True
        return user.is_active and user.is_staff and user.has_perm("tasksets.delete_tasksetimport")

    def keep_result(self, taskset) -> None:
        self.taskset = taskset

    def clean_up(self, failed: bool) -> None:
        self.upload.delete(save=False)

    def result_url(self) -> str | None:
        return reverse("taskset-detail", args=[self.taskset.name]) if self.taskset else None
