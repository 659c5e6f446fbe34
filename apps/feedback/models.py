from django.conf import settings
from django.db import models


class Feedback(models.Model):
    """A human judgement of an experience; one per (experience, user, kind), updated in place."""

    class Kind(models.TextChoices):
        RATING = "rating"  # value: the reward override in [0, 1]
        EDIT = "edit"  # edited_text: a corrected response, becomes a human_edit experience
        PREFERENCE = "preference"  # other: the experience this one was preferred over (a DPO pair)
        FLAG = "flag"  # excluded from training

    experience = models.ForeignKey("buffer.Experience", related_name="feedback", on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="feedback", on_delete=models.CASCADE)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    value = models.FloatField(null=True, blank=True)
    edited_text = models.TextField(blank=True)
    other = models.ForeignKey(
        "buffer.Experience", null=True, blank=True, related_name="preferred_over_by", on_delete=models.CASCADE
    )
    comment = models.TextField(blank=True)
    seconds_spent = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(fields=["experience", "user", "kind"], name="feedback_one_per_kind"),
            models.CheckConstraint(
                condition=~models.Q(kind="preference") | models.Q(other__isnull=False),
                name="feedback_preference_has_other",
            ),
        ]
