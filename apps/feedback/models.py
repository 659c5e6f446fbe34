from django.conf import settings
from django.db import models
from django.db.models.functions import Greatest, Least


class Feedback(models.Model):
    """A human judgement of an experience, updated in place when judged again: one per (experience,
    user, kind), but a comparison one per (pair, user), the pair either way round, so comparing A
    with B and then A with C keeps both pairs."""

    class Kind(models.TextChoices):
        RATING = "rating"  # value: the rating mapped to [0, 1]; label: the point of the scale chosen
        EDIT = "edit"  # edited_text: a corrected response, becomes a human_edit experience
        # experience was preferred over `other` (value 1: a DPO pair); a tie (value 0.5) or
        # "both bad" (value 0) is recorded for agreement but is no pair to train on.
        PREFERENCE = "preference"
        FLAG = "flag"  # excluded from training; label: why (wrong, harmful, garbled)

    class Review(models.TextChoices):
        NONE = "", "not asked"
        PENDING = "pending"
        ACCEPTED = "accepted"
        REJECTED = "rejected"

    TRAINED = (Review.NONE, Review.ACCEPTED)  # the reviews a judgement may reach training with

    experience = models.ForeignKey("buffer.Experience", related_name="feedback", on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="feedback", on_delete=models.CASCADE)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    value = models.FloatField(null=True, blank=True)
    label = models.CharField(max_length=20, blank=True, help_text="the scale point, comparison verdict or flag reason")
    edited_text = models.TextField(blank=True)
    other = models.ForeignKey(
        "buffer.Experience", null=True, blank=True, related_name="preferred_over_by", on_delete=models.CASCADE
    )
    comment = models.TextField(blank=True)
    # What undo restores: the experience's status before this judgement changed it (a flag rejects
    # it); empty when the judgement changed none (the row was rejected already, by a curator or
    # another flag). Flags saved before this field existed have it empty too: undoing one leaves
    # the row as it is, the safe way round (a curator's rejection is never lifted by a guess).
    status_before = models.CharField(max_length=10, blank=True, db_default="")  # raw inserts (bench/) too
    seconds_spent = models.FloatField(default=0.0)
    # On a run with feedback.require_review (apps/feedback/review.py): pending until a reviewer
    # accepts it (then it reaches training) or rejects it; empty where no review is asked.
    review = models.CharField(max_length=10, choices=Review.choices, blank=True, db_default="", default="",
                              db_index=True)
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, related_name="reviewed",
                                 on_delete=models.SET_NULL)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True, db_default="")  # raw inserts (bench/) too
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Not stored: what saving this judgement replaced ("your earlier rating 3 of experience 7"), set
    # by apps/feedback/services.py for the page to say so; None when it replaced nothing.
    replaced: str | None = None

    def __str__(self):  # the admin's title and breadcrumb ("Feedback object (3)" said nothing)
        return f"{self.get_kind_display()} {self.pk} of experience {self.experience_id}"

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["experience", "user", "kind"], condition=~models.Q(kind="preference"),
                name="feedback_one_per_kind",
            ),
            models.UniqueConstraint(
                Least("experience", "other"), Greatest("experience", "other"), "user",
                condition=models.Q(kind="preference"), name="feedback_one_per_pair",
            ),
            models.CheckConstraint(
                condition=~models.Q(kind="preference") | models.Q(other__isnull=False),
                name="feedback_preference_has_other",
            ),
        ]


class AnnotationLock(models.Model):
    """An annotator is working on an experience until `expires_at`: the queue hands the item to
    nobody else (beyond the judgements per item still wanted), and others cannot judge it."""

    experience = models.ForeignKey("buffer.Experience", related_name="annotation_locks", on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="annotation_locks", on_delete=models.CASCADE)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experience", "user"], name="annotation_lock_one_per_user")]


class SetAside(models.Model):
    """An annotator skipped an experience (never offered to them again) or postponed it (offered
    to them after everything else)."""

    experience = models.ForeignKey("buffer.Experience", related_name="set_aside", on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="set_aside", on_delete=models.CASCADE)
    postponed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experience", "user"], name="set_aside_one_per_user")]


class RunAnnotators(models.Model):
    """Who may annotate a run: every annotator (`open_to_all`, also when a run has no row) or only
    those listed. The run's owner and curators always may."""

    run = models.OneToOneField("runs.Run", primary_key=True, related_name="annotators", on_delete=models.CASCADE)
    open_to_all = models.BooleanField(default=True)
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="annotated_runs")
    updated_at = models.DateTimeField(auto_now=True)


class PairUse(models.Model):
    """How many DPO steps of one run trained on one preference pair (buffer.store.sample_pairs),
    and when the last did. Per run: several runs read one run's comparisons (feedback.source_runs),
    and each run's least-used-first order and algorithm.dpo.max_pair_uses count its own steps
    (counted on the preference, a mode train run reading a mode both run's pairs used them up before
    that run's own trainer saw them). Counted on the chosen experience, a pair's uses had moved that
    run's sampling of its rollouts. `last_used_at`: a resumed run gives back the uses of the steps
    it lost (store.DjangoExperienceBuffer.rewind)."""

    run = models.ForeignKey("runs.Run", related_name="+", on_delete=models.CASCADE)
    preference = models.ForeignKey(Feedback, related_name="pair_uses", on_delete=models.CASCADE)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "preference"], name="one_pair_use_per_run")]
