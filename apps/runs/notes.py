"""A run's notes and tags: what its owner (or a curator) writes about it, and the words the runs
list filters it by. Every researcher reads them; only those who may control the run change them."""

import json
import re

from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F
from django.utils import timezone

from apps.core.files import parse_json
from workers.rft.json_values import text_problem

from .controls import may_control
from .models import Run

MAX_NOTES = 10_000
MAX_TAGS = 10
MAX_TAG_LENGTH = 32
# Lowercase, so "Baseline" and "baseline" are one tag; no spaces, commas or quotes (they separate
# tags when typed, and with_tag relies on a tag never holding a quote).
TAG = re.compile(r"[a-z0-9][a-z0-9._:-]*")
TAG_RULE = f"letters a-z, digits and . _ : - (starting with a letter or digit), at most {MAX_TAG_LENGTH} characters"
# The admin writes the tags as a JSON list: ten tags of 32 characters, quoted and separated, are
# 362 characters, so text over this is refused before it is parsed (a 5,000-deep list was a 500).
MAX_TAGS_JSON_CHARS = 1000
DRAFT_KEY = "run-notes-draft-{}"  # in the session, by run id
MAX_DRAFT_CHARS = 100_000  # ten times the notes' limit: what was pasted, to cut down, not a document store
SHOWN_BAD_TAG_CHARS = 40  # a refused tag is quoted back this far: it may be a whole paste


def parse_tags(text: str) -> list[str]:
    """Tags typed as "a, b c": separated by commas or spaces, lowercased, repeats dropped, in the
    order typed. ValidationError naming each bad tag, or the count."""
    return checked_tags(word for word in re.split(r"[,\s]+", text) if word)


def tags_from_json(text: str) -> list[str]:
    """Tags written as a JSON list of strings (the admin's field), by the rule parse_tags applies.
    ValidationError naming the problem for anything else: not JSON, null, a number, a mapping, a
    list of other things, or text too long to be ten tags."""
    text = text.strip()
    if len(text) > MAX_TAGS_JSON_CHARS:
        raise ValidationError(f"tags of {len(text):,} characters: a list of at most {MAX_TAGS} tags is far shorter")
    try:
        value = parse_json(text or "[]")
    except ValueError:  # not JSON, or nested too deep
        value = None
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise ValidationError(f'tags are a JSON list of words, e.g. ["baseline", "lr-sweep"]; each has {TAG_RULE}')
    return checked_tags(value)


def checked_tags(words) -> list[str]:
    """`words` lowercased, repeats dropped, in order; ValidationError naming each bad tag, or the count."""
    tags = list(dict.fromkeys(word.lower() for word in words))
    bad = [tag for tag in tags if not is_tag(tag)]
    if bad:
        quoted = ", ".join(repr(tag[:SHOWN_BAD_TAG_CHARS] + ("..." if len(tag) > SHOWN_BAD_TAG_CHARS else ""))
                           for tag in bad[:MAX_TAGS])
        raise ValidationError(f"tag{'s' * (len(bad) > 1)} {quoted}: a tag has {TAG_RULE}")
    if len(tags) > MAX_TAGS:
        raise ValidationError(f"{len(tags)} tags: a run has at most {MAX_TAGS}")
    return tags


def is_tag(tag) -> bool:
    return isinstance(tag, str) and len(tag) <= MAX_TAG_LENGTH and TAG.fullmatch(tag) is not None


def shown_tags(value) -> list[str]:
    """A run's tags as every reader shows them (pages, the API): the stored value when it is a
    list of at most MAX_TAGS tags, else none. The forms store only that, but the column is JSON and
    a value written some other way ("baseline", [1, 2], 5, null) made every runs page a 500."""
    if isinstance(value, list) and len(value) <= MAX_TAGS and all(is_tag(tag) for tag in value):
        return value
    return []


class NotesChanged(ValidationError):
    """Another save of the notes and tags came first since the form was opened (its version)."""


def keep_draft(session, run: Run, *, notes: str, tags: str, version: int) -> None:
    """Keep what was typed into a refused form for the run page to show once (taken_draft), with
    the version of the notes it goes on from: a refusal used to come back with the form closed and
    empty, the notes typed lost."""
    session[DRAFT_KEY.format(run.pk)] = {"notes": notes[:MAX_DRAFT_CHARS], "tags": tags[:MAX_DRAFT_CHARS],
                                         "version": version}


def taken_draft(session, run: Run) -> dict | None:
    """What keep_draft kept for this run, once: the page after the refusal shows it, later ones the run's own."""
    return session.pop(DRAFT_KEY.format(run.pk), None)


def set_notes_and_tags(run: Run, user, *, notes: str, tags: str, version: int | None) -> Run:
    """Save the run's notes and its tags (as typed: parse_tags) over `version` of them, the one the
    form was opened on. PermissionDenied unless `user` owns the run or is a curator; ValidationError
    naming the problem, saving nothing, for notes too long or holding a NUL, or a bad tag;
    NotesChanged, saving nothing, where another save came since `version` (checked in the UPDATE
    itself, so of two saves from the same page one is refused: the second used to wipe the first's
    text without a word)."""
    if not may_control(user, run):
        raise PermissionDenied(
            f"only the owner of run {run.name!r} ({run.owner}) or a curator may edit its notes and tags"
        )
    if version is None:  # a form from before versions, or a script's post: what it replaces is unknown
        raise NotesChanged("the form did not say which version of them it edits")
    notes = notes.strip()
    if problem := text_problem(notes):  # a NUL typed or pasted: Postgres text cannot hold one
        raise ValidationError(f"the notes {problem}")
    if len(notes) > MAX_NOTES:
        raise ValidationError(f"notes of {len(notes):,} characters: at most {MAX_NOTES:,}")
    tags, now = parse_tags(tags), timezone.now()
    saved = Run.objects.filter(pk=run.pk, notes_version=version).update(
        notes=notes, tags=tags, notes_version=F("notes_version") + 1, notes_changed_by=user, notes_changed_at=now,
        updated_at=now)
    run.refresh_from_db(fields=["notes", "tags", "notes_version", "notes_changed_by", "notes_changed_at",
                                "updated_at"])
    if not saved:
        raise NotesChanged(f"{changed_by(run)} since you opened the page")
    return run


def changed_by(run: Run) -> str:
    """"changed by r1 at 2026-12-07 12:03 UTC": the last save of the run's notes and tags."""
    who = run.notes_changed_by.get_username() if run.notes_changed_by else "someone"
    when = f" at {run.notes_changed_at:%Y-%m-%d %H:%M} UTC" if run.notes_changed_at else ""
    return f"they were changed by {who}{when}"


def with_tag(runs, tag: str):
    """The runs tagged `tag`. The tags are a JSON list and a tag holds no quote, so its quoted form
    appears in the list's text only as a whole element; unlike a JSON `contains` this also works
    on the embedded SQLite. A value that is no list of words (shown_tags: none) does not match."""
    return runs.filter(tags__startswith='["', tags__icontains=json.dumps(tag))
