"""A run's notes and tags: what its owner (or a curator) writes about it, and the words the runs
list filters it by. Every researcher reads them; only those who may control the run change them."""

import json
import re

from django.core.exceptions import PermissionDenied, ValidationError

from .controls import may_control
from .models import Run

MAX_NOTES = 10_000
MAX_TAGS = 10
MAX_TAG_LENGTH = 32
# Lowercase, so "Baseline" and "baseline" are one tag; no spaces, commas or quotes (they separate
# tags when typed, and matching_tag relies on a tag never holding a quote).
TAG = re.compile(r"[a-z0-9][a-z0-9._:-]*")
TAG_RULE = f"letters, digits and . _ : - (starting with a letter or digit), at most {MAX_TAG_LENGTH} characters"


def parse_tags(text: str) -> list[str]:
    """Tags typed as "a, b c": separated by commas or spaces, lowercased, repeats dropped, in the
    order typed. ValidationError naming each bad tag, or the count."""
    tags = list(dict.fromkeys(word.lower() for word in re.split(r"[,\s]+", text) if word))
    bad = [tag for tag in tags if not TAG.fullmatch(tag) or len(tag) > MAX_TAG_LENGTH]
    if bad:
        raise ValidationError(f"tag{'s' * (len(bad) > 1)} {', '.join(map(repr, bad))}: a tag has {TAG_RULE}")
    if len(tags) > MAX_TAGS:
        raise ValidationError(f"{len(tags)} tags: a run has at most {MAX_TAGS}")
    return tags


def set_notes_and_tags(run: Run, user, *, notes: str, tags: str) -> Run:
    """Save the run's notes and its tags (as typed: parse_tags). PermissionDenied unless `user`
    owns the run or is a curator; ValidationError naming the problem, saving nothing, for notes
    too long or a bad tag."""
    if not may_control(user, run):
        raise PermissionDenied(
            f"only the owner of run {run.name!r} ({run.owner}) or a curator may edit its notes and tags"
        )
    notes = notes.strip()
    if len(notes) > MAX_NOTES:
        raise ValidationError(f"notes of {len(notes):,} characters: at most {MAX_NOTES:,}")
    run.tags = parse_tags(tags)
    run.notes = notes
    run.save(update_fields=["notes", "tags", "updated_at"])
    return run


def with_tag(runs, tag: str):
    """The runs tagged `tag`. The tags are a JSON list and a tag holds no quote, so its quoted form
    appears in the list's text only as a whole element; unlike a JSON `contains` this also works
    on the embedded SQLite."""
    return runs.filter(tags__icontains=json.dumps(tag))
