"""A queue as an address names it: run, strategy and filter (`?run=<id>&strategy=newest&reward_min=0.5`).

A tab keeps its own queue in its addresses, so another tab starting another queue (which changes
the session's) changes nothing of it: the item page's address and its JSON (annotate.js), and
without JavaScript every form the page posts and the next item it is sent to. Every one of them
reads the queue here, by the same rules; a bad value raises FilterError naming it, and the caller
either refuses the request (the JSON) or says so and goes on with the session's queue (the pages).
"""
from dataclasses import dataclass
from urllib.parse import urlencode

from apps.core.numbers import SHOWN_CHARS, whole_number

from . import queue
from .queue_filter import NO_FILTER, FilterError, QueueFilter


@dataclass(frozen=True)
class PageQueue:
    run_id: int
    strategy: str = queue.NEWEST
    queue_filter: QueueFilter = NO_FILTER

    @classmethod
    def from_query(cls, query) -> "PageQueue | None":
        """The queue a query (a QueryDict) names; None when it names no run (the session's queue).
        A strategy left out is the start page's default."""
        if "run" not in query:
            return None
        run_id = whole_number(query["run"])
        if run_id is None:
            raise FilterError(f"run must be a run id, not {query['run'][:SHOWN_CHARS]!r}")
        strategy = query.get("strategy") or queue.NEWEST
        if strategy not in queue.STRATEGIES:
            raise FilterError(f"strategy must be one of {', '.join(queue.STRATEGIES)}, "
                              f"not {strategy[:SHOWN_CHARS]!r}")
        return cls(run_id, strategy, QueueFilter.from_query(query))

    def as_query(self) -> str:
        """The queue as a query string, which from_query reads back as it is."""
        return urlencode({"run": self.run_id, "strategy": self.strategy, **self.queue_filter.as_query()})
