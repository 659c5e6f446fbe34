from django.conf import settings
from django.db import models


class Job(models.Model):
    """Work too long for a request, run by a Celery worker on the `default` queue (apps.core.jobs):
    its state and progress, which its page shows as they change (static/js/job_progress.js).

    Abstract: each kind of job keeps its own table, with the fields of what it does. A subclass
    names the registered job type that runs it (`job_type`), who may watch it (`may_view`) and
    cancel it (`may_cancel`), what to keep of what the type returned (`keep_result`) and which
    files to drop once it has finished (`clean_up`).

    A pending or running job is never deleted (its worker would go on without its row and its
    files: #41); it is cancelled instead (apps.core.jobs.cancel_job): a pending one at once, a
    running one at its type's next safe point, where it sees `cancel_requested_at`."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE = (Status.PENDING, Status.RUNNING)  # not finished: may not be deleted, may be cancelled

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    rows_done = models.PositiveBigIntegerField(default=0)
    rows_total = models.PositiveBigIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set by cancel_job on a running job; the job stops when its type next checks it.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    # Fields the runner and the progress endpoint leave unloaded (a BufferJob's selection: 8 bytes
    # a selected row).
    heavy_fields: tuple[str, ...] = ()

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    @property
    def is_finished(self) -> bool:
        return self.status not in self.ACTIVE

    @property
    def status_text(self) -> str:
        """The status in words, as its page shows it: a cancel not yet honoured says so."""
        if self.cancel_requested_at and not self.is_finished:
            return f"{self.status}, cancelling (stops at its next safe point)"
        return self.status

    @property
    def percent(self) -> int:
        if self.status == self.Status.SUCCEEDED:
            return 100
        # An import knows how far it is through its file; the others, through their rows.
        done, total = (self.bytes_done, self.bytes_total) if self.bytes_total else (self.rows_done, self.rows_total)
        return min(99, 100 * done // total) if total else 0

    @property
    def rows_text(self) -> str:
        """How far it is through its rows, in words ("1,200 of 5,000"): what its page shows."""
        return f"{self.rows_done:,} of {self.rows_total:,}" if self.rows_total else f"{self.rows_done:,}"

    @property
    def job_type(self) -> str:
        """The name of the registered type that runs this job (apps.core.jobs.register)."""
        raise NotImplementedError

    def may_view(self, user) -> bool:
        """Whether `user` may watch this job's progress."""
        raise NotImplementedError

    def may_cancel(self, user) -> bool:
        """Whether `user` may cancel this job (nobody, unless its model says who)."""
        return False

    def keep_result(self, result) -> None:
        """Record what the job type's run returned (not saved yet)."""

    def clean_up(self, failed: bool) -> None:
        """Drop the files the finished job no longer needs (not saved yet); `failed`: it did not
        succeed (failed or was cancelled)."""

    def result_url(self) -> str | None:
        """Where to see what a succeeded job made, if anywhere."""
        return None


class JobOwner(models.Model):
    """The process running a job (apps.core.job_owners): written when a process claims the job
    (jobs.run_job), deleted when the job ends, read to tell a job whose process was killed (an
    embedded server's kill -9, a Celery worker's) from one that runs, so that only the first is
    re-run or ended at once.

    One table for every job model (a job is named by its model's label and its id): the job tables
    keep only what their users see. A process is its host, its pid and when it started, so a pid
    the system gave to a new process after a reboot or a wrap-around is not taken for the owner; and
    its pid namespace, since a host name can be shared by processes that do not share pids."""

    job_label = models.CharField(max_length=100)  # "app_label.model_name", as jobs.label
    job_id = models.PositiveBigIntegerField()
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    process_started = models.FloatField()  # seconds since the epoch, as psutil's create_time
    pid_namespace = models.CharField(max_length=100, blank=True)  # job_owners.pid_namespace()
    worker = models.CharField(max_length=255, blank=True)  # capacity.this_node(): its Celery worker ("" outside a task)
    since = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job_label", "job_id"], name="one_owner_per_job")]

    def __str__(self):
        where = f"{self.worker}, " if self.worker else ""
        return f"{where}process {self.pid} on {self.host}"
