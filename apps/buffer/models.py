import uuid
from pathlib import Path

from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import Expression, Q

from apps.core.models import Job

from .fields import PackedArrayField

# Full-text search reads this many characters of the prompt and of the response: a tsvector is
# capped at 1 MB, and an uncapped column would make the insert of one huge text fail.
SEARCH_CHARS = 100_000


class SearchDocument(Expression):
    """The experience's `search_document` column: the tsvector of its prompt and response that the
    admin's full-text search matches, indexed by the GIN index `experience_text_search`.

    Postgres computes and stores it (a trigger on insert and on an update of either text, migration
    0006), so matching a row costs no text parsing; Django does not know the column, so no query
    ever reads it by accident (the engine loads whole rows). SQLite, the embedded default, has
    neither the column nor full-text search: the admin falls back to a substring search there."""

    output_field = SearchVectorField()

    def as_sql(self, compiler, connection):
        table = compiler.quote_name_unless_alias(compiler.query.get_initial_alias())
        return f"{table}.search_document", []


class Experience(models.Model):
    """One response of the model (or an expert / a human) to one task, with everything training needs."""

    class Source(models.TextChoices):
        ROLLOUT = "rollout"
        EXPERT = "expert"
        HUMAN_EDIT = "human_edit"
        SYNTHETIC = "synthetic"

    class Status(models.TextChoices):
        RAW = "raw"  # written by the explorer, not yet through the experience pipeline
        READY = "ready"  # may be sampled by the trainer
        CONSUMED = "consumed"  # trained on
        REJECTED = "rejected"  # filtered out by a pipeline, a curator or a flag

    run = models.ForeignKey("runs.Run", null=True, blank=True, related_name="experiences", on_delete=models.CASCADE)
    task = models.ForeignKey(
        "tasksets.Task", null=True, blank=True, related_name="experiences", on_delete=models.SET_NULL
    )
    explorer_step = models.PositiveIntegerField(default=0)
    group_id = models.CharField(max_length=100, blank=True, db_index=True)
    rollout_index = models.PositiveIntegerField(default=0)
    source = models.CharField(max_length=12, choices=Source.choices, default=Source.ROLLOUT)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.READY)

    prompt_text = models.TextField(blank=True)
    response_text = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True, help_text="chat messages of a multi-turn episode")
    prompt_ids = PackedArrayField(dtype="<i4")
    response_ids = PackedArrayField(dtype="<i4")
    action_mask = PackedArrayField(dtype="<u1", help_text="1 where the model produced the token")
    logprobs = PackedArrayField(dtype="<f4", help_text="generation logprobs of the response tokens")

    reward = models.FloatField(null=True, blank=True)
    reward_components = models.JSONField(default=dict, blank=True)
    advantage = models.FloatField(null=True, blank=True)
    model_version = models.PositiveIntegerField(default=0)
    priority = models.FloatField(default=0.0)
    use_count = models.PositiveIntegerField(default=0)
    parent = models.ForeignKey("self", null=True, blank=True, related_name="children", on_delete=models.SET_NULL)
    metadata = models.JSONField(default=dict, blank=True)
    # Set while a trainer holds the row for its current step, so a second trainer skips it;
    # cleared when the step is done (or by the trainer's restart, for a step that never finished).
    claimed_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)  # lets a resumed run rewind what it lost
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # A replayed explorer step (worker killed after writing) must not duplicate its rollouts.
            models.UniqueConstraint(
                fields=["run", "explorer_step", "task", "rollout_index"],
                condition=Q(source="rollout"),
                name="experience_natural_key",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "status", "source", "model_version"], name="experience_sampling"),
            models.Index(fields=["run", "explorer_step"], name="experience_step"),
            # The trainer's sample order (store.sample): a run's ready, unclaimed rows, least used
            # first. Without it, sampling 256 rows at 10^6 scans and sorts them all (~20 s). Not
            # claimed_at in the condition: a claim then changes no indexed value (migration 0006).
            models.Index(
                fields=["run", "use_count", "explorer_step", "id"],
                condition=Q(status="ready"),
                name="experience_sample_order",
            ),
        ]

    def __str__(self):
        return f"experience {self.pk} ({self.source}, reward {self.reward})"


def _job_file_path(job, filename):
    # A random name, as for taskset uploads: the user's file name never becomes a server path.
    return f"buffer-jobs/{uuid.uuid4().hex}{Path(filename).suffix.lower()}"


class BufferJob(Job):
    """A curation job too long for a request (import, export, re-score, promote, pipeline op,
    retention), run by a Celery worker on the `default` queue; the admin shows its progress and result."""

    class Kind(models.TextChoices):
        IMPORT = "import"  # expert data from `upload`
        EXPORT = "export"  # the selected experiences or feedback into `output`
        RESCORE = "rescore"  # the selected experiences with a reward fn
        PROMOTE = "promote"  # expert copies of the selected experiences
        PIPELINE = "pipeline"  # an experience pipeline operator over the selected experiences
        RETENTION = "retention"  # ended runs' experiences archived into `output` and deleted, or dropped

    kind = models.CharField(max_length=10, choices=Kind.choices)
    params = models.JSONField(default=dict, blank=True, help_text="what the job does: format, reward fn, operator")
    # Fixed when the curator confirmed: the job acts on exactly these rows, whatever changes later.
    selection = PackedArrayField(dtype="<i8", help_text="ids of the selected rows, in the order they are processed")
    upload = models.FileField(upload_to=_job_file_path, blank=True, help_text="deleted once the import has finished")
    original_filename = models.CharField(max_length=255, blank=True)
    output = models.FileField(upload_to=_job_file_path, blank=True, help_text="the export or archive file")
    result = models.JSONField(default=dict, blank=True, help_text="what the job did: rows changed, added, rejected")

    heavy_fields = ("selection",)  # read as packed bytes (services._selection), not as a list

    def __str__(self):
        return f"{self.get_kind_display()} job {self.pk} ({self.status})"

    @property
    def job_type(self) -> str:
        return f"buffer.{self.kind}"

    def may_view(self, user) -> bool:
        """Whoever may look at the job in the admin."""
        return user.is_active and user.is_staff and user.has_perm("buffer.view_bufferjob")

    def keep_result(self, result: dict) -> None:
        self.result = result

    def clean_up(self, failed: bool) -> None:
        if self.upload:
            self.upload.delete(save=False)
        # A failed export's partial file is already deleted; a retention job's complete archive
        # stays: rows it holds may have been deleted since.
        if failed and not (self.kind == self.Kind.RETENTION and "archived" in self.result):
            self.output.name = ""
