import uuid
from pathlib import Path

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import F, Q

from apps.core.models import Job

from .fields import PackedArrayField

# The uses a row has before it counts as used as much as an unused row of priority 0 (the sample
# order, workers.rft.sampling.sample_key): what the trainer's sample orders by, and its index.
USES_LEFT = F("use_count") - F("priority")
# The group ids of a run's copies of an imported expert dataset (expert_data.py): its responses,
# and its pairs (chosen at rollout index 0, rejected at 1).
IMPORTED_GROUP = "imported-"
IMPORTED_PAIR_GROUP = f"{IMPORTED_GROUP}pair-"


class ReadyDatasets(models.Manager):
    """Expert datasets but those an import is still filling (ready False): `ExpertDataset.objects`,
    so no page, form, count or run sees (or launches on) a dataset whose rows are still arriving."""

    def get_queryset(self):
        return super().get_queryset().filter(ready=True)


class ExpertDataset(models.Model):
    """Expert data imported from files under one name (the experiences page's *Import expert
    data*): its rows are experiences of source `expert` with no run. A run names it as
    `buffer.expert_dataset` and trains on a copy of its rows, tokenized for its model when its
    trainer starts (apps/buffer/expert_data.py): SFT and MIX imitate an `sft` dataset's
    responses, DPO trains on a `dpo` dataset's pairs.

    An import fills a hidden one (ready False) in committed batches (expert_import.py), which then
    becomes the dataset, or, with `appends`, gives its rows to the ready dataset of its name."""

    class Layout(models.TextChoices):
        SFT = "sft", "SFT: prompt and response"
        DPO = "dpo", "DPO: prompt, chosen and rejected"

    name = models.CharField(max_length=100)  # unique but for imports appending: expert_dataset_name
    layout = models.CharField(max_length=3, choices=Layout.choices)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    ready = models.BooleanField(default=True, editable=False)
    # An import adding to the ready dataset of this name: its rows move there when it is done.
    appends = models.BooleanField(default=False, editable=False)

    objects = ReadyDatasets()  # the default manager: the admin and every query see ready ones only
    all_objects = models.Manager()  # with those being imported: names taken, leftovers to delete

    class Meta:
        ordering = ["name"]
        constraints = [
            # A dataset's name, and a new dataset's import holds its name (another is refused);
            # imports adding to one share its name.
            models.UniqueConstraint(fields=["name"], condition=Q(appends=False), name="expert_dataset_name"),
            # One import at a time fills a dataset of a name: two adding to one at once could cost a
            # run's copy the earlier one's rows (expert_import.being_imported).
            models.UniqueConstraint(fields=["name"], condition=Q(ready=False), name="expert_dataset_import"),
        ]

    def __str__(self):
        return self.name


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

    # No index of its own: experience_sampling and experience_step lead with the run (one index
    # fewer to write, migration 0008).
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, related_name="experiences", on_delete=models.CASCADE, db_index=False
    )
    # Imported expert data: the dataset it came in (its rows have no run). Deleting the dataset
    # deletes them; the runs' copies stay (their parent link is SET_NULL).
    dataset = models.ForeignKey(
        ExpertDataset, null=True, blank=True, related_name="experiences", on_delete=models.CASCADE,
        db_index=False,  # experience_dataset below: a run's copy reads the rows in id order
    )
    task = models.ForeignKey(
        "tasksets.Task", null=True, blank=True, related_name="experiences", on_delete=models.SET_NULL
    )
    explorer_step = models.PositiveIntegerField(default=0)
    group_id = models.CharField(max_length=100, blank=True)  # indexed by experience_group
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
    # The run whose trainer holds it: another run's too, for the human edits of its
    # feedback.source_runs. That run's restart releases what it held, whoever owns the row (a
    # source run's edit, claimed by a trainer that then crashed, was held for ever). Not indexed:
    # read only at a restart, and a claim then changes no indexed value (migration 0006).
    claimed_by = models.PositiveIntegerField(null=True, blank=True)
    # The last trainer step's use: of a consumed row, or of a reused one that stays ready (expert
    # data, an imported pair's chosen copy); lets a resumed run rewind what it lost (store.rewind).
    consumed_at = models.DateTimeField(null=True, blank=True)
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
            # Exact matches only: the LIKE index Django adds beside a db_index CharField served no query.
            models.Index(fields=["group_id"], name="experience_group"),
            # Imported rows only: the run-less few of a table of rollouts.
            models.Index(fields=["dataset", "id"], condition=Q(dataset__isnull=False), name="experience_dataset"),
            # The trainer's sample order (store.sample): a run's ready, unclaimed rows, least used
            # first. Without it, sampling 256 rows at 10^6 scans and sorts them all (~20 s). Not
            # claimed_at in the condition: a claim then changes no indexed value (migration 0006).
            models.Index(
                F("run"), USES_LEFT, F("explorer_step"), F("id"),
                condition=Q(status="ready"),
                name="experience_sample_order",
            ),
        ]

    def __str__(self):
        return f"experience {self.pk} ({self.source}, reward {self.reward})"


class ExperienceSearch(models.Model):
    """The full-text search document of an experience (Postgres only): the tsvector of its prompt
    and response that the admin's search matches (apps/buffer/search.py).

    Kept out of the experience's own row and out of its write: computed in the write's trigger,
    the tsvector of an 800-character response was 14.5 of a 128-row COPY's 22.9 ms (bench/README,
    issue #29). An insert now notes the range of ids it wrote (a statement trigger, migration
    0008) and `search.index_pending` makes the documents later, on a worker (beat) and before each
    admin search; an edit of either text rewrites its document at once (a row trigger). SQLite,
    the embedded default, leaves the table empty: its search reads an FTS5 index kept by triggers
    (migration 0014)."""

    experience = models.OneToOneField(
        Experience, primary_key=True, related_name="search", on_delete=models.CASCADE,
        db_constraint=False,  # the indexer may race a delete; an orphan document matches no experience
    )
    document = SearchVectorField()

    class Meta:
        indexes = [GinIndex(fields=["document"], name="experience_search_document")]


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
    # An import's dataset, hidden while its batches arrive: a redelivered job (its worker killed)
    # deletes the half it finds here before it starts again.
    dataset = models.ForeignKey(
        ExpertDataset, null=True, blank=True, related_name="+", on_delete=models.SET_NULL, editable=False
    )

    heavy_fields = ("selection",)  # read as packed bytes (services._selection), not as a list

    def __str__(self):
        return f"{self.get_kind_display()} job {self.pk} ({self.status})"

    @property
    def job_type(self) -> str:
        return f"buffer.{self.kind}"

    def may_view(self, user) -> bool:
        """Whoever may look at the job in the admin."""
        return user.is_active and user.is_staff and user.has_perm("buffer.view_bufferjob")

    def may_cancel(self, user) -> bool:
        """Whoever may delete jobs in the admin: a pending or running job is cancelled instead."""
        return user.is_active and user.is_staff and user.has_perm("buffer.delete_bufferjob")

    @property
    def rows_text(self) -> str:
        # An archiving retention job goes through its rows twice (rows_total counts both passes):
        # written to the archive, then deleted. Counted as one pass, its 14 rows read "28 of 28".
        if self.kind != self.Kind.RETENTION or self.params.get("action") != "archive" or not self.rows_total:
            return super().rows_text
        selected = self.rows_total // 2
        if self.rows_done < selected:
            return f"{self.rows_done:,} of {selected:,} archived"
        return f"{selected:,} archived, {self.rows_done - selected:,} of {selected:,} deleted"

    def keep_result(self, result: dict) -> None:
        self.result = result

    @property
    def archive_holds_deleted_rows(self) -> bool:
        """A retention job's archive of rows it has deleted: their only copy, kept when the job is."""
        return self.kind == self.Kind.RETENTION and bool(self.output) and self.result.get("deleted", 0) > 0

    def clean_up(self, failed: bool) -> None:
        if self.upload:
            self.upload.delete(save=False)
        # A failed or cancelled export's partial file is already deleted; a retention job's
        # complete, checked archive stays: rows it holds may have been deleted since.
        if failed and not (self.kind == self.Kind.RETENTION and "archived" in self.result):
            self.output.name = ""


def expert_copies(run):
    """The run's copy of its expert dataset (expert_data.py: made when its trainer starts); `run` a
    run, its id, or OuterRef("pk"). A run that has one trains on it, its dataset deleted or not."""
    return Experience.objects.filter(run=run, group_id__startswith=IMPORTED_GROUP)

