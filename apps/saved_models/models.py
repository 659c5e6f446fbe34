from django.conf import settings
from django.db import models

MAX_NOTE = 2000  # characters; the save form's box and the API refuse a longer note (services.save_model)


class SavedModel(models.Model):
    """A run's checkpoint kept as a model of its own under <data dir>/models/<name>/: a plain Hugging
    Face directory (weights and tokenizer, no optimizer state) that a new run names as
    `model.path: models/<name>` (an SFT warm-up, then GRPO from it), that the source run's
    keep_checkpoints and a curator's deletion of that run leave alone (services.save_model)."""

    name = models.CharField(max_length=100, unique=True)
    # Where it came from (MLflow's lineage): the run may be deleted later, its name and the
    # checkpoint's version and step stay.
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="saved_models")
    run_name = models.CharField(max_length=200)
    checkpoint_version = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    size_bytes = models.PositiveBigIntegerField(default=0)
    note = models.TextField(blank=True, max_length=MAX_NOTE)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return self.name

    @property
    def model_path(self) -> str:
        """What a run's config names it by (relative paths are taken from the data dir)."""
        return f"models/{self.name}"
