"""Narrowing an annotation queue (Argilla's filters): which of a run's open items `queue.next_item`
may hand out. A filter is read from a URL's query (the start page's form, a shared link, the JSON
API) and written back to one, so a link shares it. Every value is checked before anything is
applied: a bad one is refused with a message naming its field, and the queue stays as it was.
"""
import math
import re
from dataclasses import asdict, dataclass, fields

from django.contrib.postgres.search import SearchQuery
from django.db import connection
from django.db.models import Q, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from apps.buffer import search
from apps.buffer.models import Experience
from apps.core.numbers import whole_number
from apps.tasksets.models import Task

from .services import FeedbackError

MAX_TEXT_CHARS = 200  # a search, not a document: longer is a paste gone wrong
MAX_TASK_CHARS = 200
MAX_STEP = 2**31 - 1  # the explorer_step column's largest
TEXT_CATCH_UP_SECONDS = 0.5  # Postgres: documents of what was written since the indexer's last round
SOURCES = {Experience.Source.ROLLOUT: "rollouts", Experience.Source.SYNTHETIC: "synthetic"}
_METADATA_KEY = re.compile(r"[\w.-]{1,100}")


class FilterError(FeedbackError):
    """A filter value refused; the message names the field."""


@dataclass(frozen=True)
class QueueFilter:
    reward_min: float | None = None
    reward_max: float | None = None
    unscored: bool = False  # only items with no reward yet: a choice of its own, not a range
    text: str = ""  # in the prompt or the response: the buffer search's syntax (words, "a phrase", -word)
    task: str = ""  # a task's id, or key=value of its metadata
    source: str = ""
    step_min: int | None = None
    step_max: int | None = None

    def __bool__(self) -> bool:
        return self != QueueFilter()

    # -- reading and writing a query --------------------------------------------------------------

    @classmethod
    def from_query(cls, query) -> "QueueFilter":
        """The filter a query (a QueryDict or a dict of strings) asks for; FilterError names the
        first bad field. Empty fields are no filter."""
        def text(name) -> str:
            value = query.get(name, "")
            return value.strip() if isinstance(value, str) else str(value)

        values = {
            "reward_min": _number(text("reward_min"), "reward_min"),
            "reward_max": _number(text("reward_max"), "reward_max"),
            "unscored": _yes(text("unscored"), "unscored"),
            "text": text("text"),
            "task": text("task"),
            "source": text("source"),
            "step_min": _step(text("step_min"), "step_min"),
            "step_max": _step(text("step_max"), "step_max"),
        }
        chosen = cls(**values)
        chosen.check()
        return chosen

    def check(self) -> None:
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise FilterError(f"reward_min ({self.reward_min:g}) is above reward_max ({self.reward_max:g})")
        if self.unscored and (self.reward_min is not None or self.reward_max is not None):
            raise FilterError("unscored: choose unscored items or a reward range, not both")
        if self.step_min is not None and self.step_max is not None and self.step_min > self.step_max:
            raise FilterError(f"step_min ({self.step_min}) is above step_max ({self.step_max})")
        if len(self.text) > MAX_TEXT_CHARS:
            raise FilterError(f"text is {len(self.text)} characters long; a search has at most {MAX_TEXT_CHARS}")
        if "\x00" in self.text or "\x00" in self.task:
            raise FilterError("text and task may not hold a NUL character")
        if len(self.task) > MAX_TASK_CHARS:
            raise FilterError(f"task is {len(self.task)} characters long; at most {MAX_TASK_CHARS}")
        if self.task and whole_number(self.task) is None:
            key, equals, _ = self.task.partition("=")
            if not equals or not _METADATA_KEY.fullmatch(key.strip()):
                raise FilterError(
                    f"task must be a task's id or key=value of its metadata (a key of letters, digits, "
                    f"'_', '.', '-'), not {self.task[:40]!r}"
                )
        if self.source and self.source not in SOURCES:
            raise FilterError(f"source must be one of {', '.join(SOURCES)}, not {self.source[:40]!r}")

    def as_query(self) -> dict[str, str]:
        """The filter as a URL's query: only what is set (for links, the form, the session)."""
        query = {}
        for name, value in asdict(self).items():
            if value is None or value == "" or value is False:
                continue
            query[name] = "1" if value is True else (f"{value:g}" if isinstance(value, float) else str(value))
        return query

    # -- applying ---------------------------------------------------------------------------------

    def q(self) -> Q:
        """The items the filter keeps, as a condition on experiences."""
        wanted = Q()
        if self.unscored:
            wanted &= Q(reward__isnull=True)
        if self.reward_min is not None:
            wanted &= Q(reward__gte=self.reward_min)
        if self.reward_max is not None:
            wanted &= Q(reward__lte=self.reward_max)
        if self.step_min is not None:
            wanted &= Q(explorer_step__gte=self.step_min)
        if self.step_max is not None:
            wanted &= Q(explorer_step__lte=self.step_max)
        if self.source:
            wanted &= Q(source=self.source)
        if self.task:
            wanted &= self._task_q()
        if self.text:
            wanted &= _text_q(self.text)
        return wanted

    def _task_q(self) -> Q:
        task_id = whole_number(self.task)
        if task_id is not None:
            return Q(task_id=task_id)
        key, _, value = self.task.partition("=")
        # Compared as text, so "level=3" finds 3 and "3" alike (a JSON number or string in the metadata).
        tasks = Task.objects.alias(meta=Cast(KT(f"metadata__{key.strip()}"), TextField()))
        return Q(task__in=tasks.filter(meta=value.strip()).values("pk"))

    def describe(self) -> str:
        """The filter in words, for the pages: 'reward 0.2 to 0.8 · source synthetic'."""
        parts = []
        if self.unscored:
            parts.append("unscored")
        if self.reward_min is not None or self.reward_max is not None:
            parts.append(_range("reward", self.reward_min, self.reward_max))
        if self.step_min is not None or self.step_max is not None:
            parts.append(_range("step", self.step_min, self.step_max))
        if self.source:
            parts.append(f"{SOURCES[self.source]} only")
        if self.task:
            parts.append(f"task {self.task}")
        if self.text:
            parts.append(f"text “{self.text}”")
        return " · ".join(parts)


def _range(name, low, high) -> str:
    shown = [f"{v:g}" if isinstance(v, float) else str(v) for v in (low, high)]
    if low is None:
        return f"{name} ≤ {shown[1]}"
    if high is None:
        return f"{name} ≥ {shown[0]}"
    return f"{name} {shown[0]} to {shown[1]}"


def _text_q(term: str) -> Q:
    """Items whose prompt or response the buffer's search finds the term in (apps/buffer/search.py):
    SQLite's FTS5 index, or Postgres' documents, made first for what was written since the indexer's
    last round (an item written a moment ago would be missed otherwise)."""
    if connection.vendor != "postgresql":
        return search.websearch_q(term)
    search.catch_up(TEXT_CATCH_UP_SECONDS)
    return Q(search__document=SearchQuery(term, config="simple", search_type="websearch"))


def _number(value: str, name: str) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise FilterError(f"{name} must be a number, not {value[:40]!r}") from None
    if not math.isfinite(number):
        raise FilterError(f"{name} must be a finite number, not {value[:40]!r}")
    return number


def _step(value: str, name: str) -> int | None:
    if not value:
        return None
    number = whole_number(value)
    if number is None:
        raise FilterError(f"{name} must be a whole number of explorer steps, not {value[:40]!r}")
    if number > MAX_STEP:
        raise FilterError(f"{name} is past the largest explorer step ({MAX_STEP})")
    return number


def _yes(value: str, name: str) -> bool:
    if value in ("", "0", "false", "off"):
        return False
    if value in ("1", "true", "on"):
        return True
    raise FilterError(f"{name} must be on or off, not {value[:40]!r}")


FIELDS = tuple(f.name for f in fields(QueueFilter))
NO_FILTER = QueueFilter()
