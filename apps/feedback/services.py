"""State changes from human judgements."""
from django.db import transaction

from .models import Feedback


@transaction.atomic
def give_feedback(experience, user, kind: str, **fields) -> Feedback:
    """One feedback per (experience, user, kind): giving it again updates it."""
    if kind == Feedback.Kind.RATING and not (0.0 <= float(fields.get("value", -1)) <= 1.0):
        raise ValueError("a rating's value must be between 0 and 1")
    feedback, _ = Feedback.objects.update_or_create(experience=experience, user=user, kind=kind, defaults=fields)
    return feedback
