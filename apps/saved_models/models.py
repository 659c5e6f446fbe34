from django.conf import settings
from django.db import models
from django.db.models.functions import Lower

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
    # The names it had before a rename (services.rename_model), oldest first: a run stores the
    # directory it loaded (<data dir>/models/<name>), so a finished run that loaded it under one
    # is still its run ("Trained from it", its scores), and no other model may take one.
    former_names = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # "Warm" beside "warm" reads as one model, and is one directory on a case-insensitive
            # filesystem: services.name_problem refuses it, and this refuses a save or rename that
            # checked before another's committed (services.taken_problem says which took it).
            models.UniqueConstraint(Lower("name"), name="saved_model_name_unique_any_case"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def model_path(self) -> str:
        """What a run's config names it by (relative paths are taken from the data dir)."""
        return f"models/{self.name}"


class ModelAlias(models.Model):
    """A label such as "champion" or "challenger" that one of an owner's saved models carries (as
    MLflow's model registry aliases a version): unique among that owner's models, so setting it on
    one moves it from another (services.set_alias). The owner is the model's saver, whoever sets it.
    Deleting the owner deletes their aliases (their labels, CASCADE); their models stay, unowned.
    SET_NULL would keep them, but two deleted owners' "champion"s would then collide in the
    unowned-unique constraint, and the second deletion fail."""

    MAX_NAME = 32

    name = models.CharField(max_length=MAX_NAME)
    model = models.ForeignKey(SavedModel, on_delete=models.CASCADE, related_name="aliases")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="model_aliases")
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    set_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="model_alias_unique_per_owner"),
            # A model no one owns (its saver deleted: created_by is SET_NULL) may be aliased anew,
            # each alias once among those; NULL owners are distinct to Postgres.
            models.UniqueConstraint(fields=["name"], condition=models.Q(owner=None), name="model_alias_unique_unowned"),
        ]

    def __str__(self) -> str:
        return self.name
