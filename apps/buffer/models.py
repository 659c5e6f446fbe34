from django.db import models
from django.db.models import Q

from .fields import PackedArrayField


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
    task = models.ForeignKey("tasksets.Task", null=True, blank=True, related_name="experiences", on_delete=models.SET_NULL)
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
        ]

    def __str__(self):
        return f"experience {self.pk} ({self.source}, reward {self.reward})"
