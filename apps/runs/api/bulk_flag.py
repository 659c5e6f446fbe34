"""The bulk flag through the API (the page /annotate/runs/<id>/bulk-flag/, apps/feedback/bulk.py):
a GET counts and lists the unflagged items a filter matches; a POST flags them, naming the items
that GET answered, so it flags what was seen (items gone or come since: 409, nothing flagged).
The run's owner or a curator, as on the page (403 for another researcher); the same services."""
from django.shortcuts import get_object_or_404
from ninja import Field, Query, Router, Schema

from apps.core.numbers import MAX_ID
from apps.feedback import bulk, services
from apps.feedback.queue_filter import FIELDS as FILTER_FIELDS
from apps.feedback.queue_filter import FilterError, QueueFilter

from ..models import Run
from .auth import ApiError
from .bodies import json_body, known_fields, refuse_unknown
from .schemas import ErrorOut, Id

router = Router(tags=["annotation"])
REFUSED = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}


class FilterQuery(Schema):
    reward_min: str | None = Field(None, description="items with a reward of at least this")
    reward_max: str | None = Field(None, description="items with a reward of at most this")
    unscored: str | None = Field(None, description="1: items with no reward yet (not with a reward range)")
    text: str | None = Field(None, description="in the prompt or response: words, \"a phrase\", -excluded")
    task: str | None = Field(None, description="a task's id, or key=value of its metadata")
    source: str | None = Field(None, description="rollout or synthetic")
    step_min: str | None = Field(None, description="from this explorer step")
    step_max: str | None = Field(None, description="up to this explorer step")


class MatchingOut(Schema):
    run: int
    filter: dict[str, str] = Field(description="the filter as applied (what to send back in the POST)")
    described: str
    count: int | None = Field(description="the unflagged items a flag would change; null when more than max_items")
    max_items: int
    items: list[int] = Field(description="their ids, newest first: what the POST names (empty when too many)")
    reasons: dict[str, str] = Field(description="the flag reasons a POST may give")


class FlagIn(Schema):
    filter: dict[str, str | float | bool] = Field(description="the filter, as the GET's query (or its `filter`)")
    reason: str = Field(description="wrong, harmful or garbled")
    items: list[int] = Field(description="the ids the GET answered: the items confirmed")


class FlaggedOut(Schema):
    flagged: int
    feedback: list[int] = Field(description="the flags made, one per item: what undo takes")
    refused: dict[str, int] = Field(description="items left as they were, by why (the one-item flag's refusal)")
    message: str


class UndoIn(Schema):
    feedback: list[int] = Field(description="the flags to undo: a bulk flag's `feedback`")


class UndoneOut(Schema):
    undone: int
    skipped: int = Field(description="ids named that undid nothing: not the caller's flag of this run's items, or "
                                     "undone already")
    message: str


def _run(request, pk) -> Run:
    run = get_object_or_404(Run, pk=pk)
    try:
        bulk.check_may_bulk_flag(run, request.user)
    except bulk.NotAllowed as exc:
        raise ApiError(403, str(exc)) from None
    return run


def _filter(values) -> QueueFilter:
    try:
        chosen = QueueFilter.from_query(values)
    except FilterError as exc:
        raise ApiError(400, f"filter: {exc}") from None
    if not chosen:
        raise ApiError(400, "choose a filter: a bulk flag without one would flag the whole run")
    return chosen


def _ids(body: dict, key: str) -> list[int]:
    ids = body.get(key)
    if not isinstance(ids, list) or not all(isinstance(pk, int) and not isinstance(pk, bool) and 0 < pk <= MAX_ID
                                            for pk in ids):
        # past a bigint, SQLite's driver raised OverflowError (a 500) where Postgres matched nothing
        problem = f"must be a list of ids (whole numbers from 1 to {MAX_ID})"
        raise ApiError(400, f"{key} {problem}", errors=[{"key": key, "message": problem}])
    return ids


@router.get("/{pk}/bulk-flag/", response={200: MatchingOut, **REFUSED}, url_name="api-run-bulk-flag",
            summary="Count what a bulk flag would flag")
def matching(request, pk: Id, filters: Query[FilterQuery]):
    """The unflagged items of the run the filter matches, that a flag would change; changes nothing."""
    run = _run(request, pk)
    chosen = _filter(filters.dict(exclude_none=True))
    ids = bulk.matching_ids(run, chosen, request.user)
    too_many = len(ids) > bulk.MAX_ITEMS
    return {"run": run.pk, "filter": chosen.as_query(), "described": chosen.describe(),
            "count": None if too_many else len(ids), "max_items": bulk.MAX_ITEMS,
            "items": [] if too_many else ids, "reasons": services.FLAG_REASONS}


@router.post(
    "/{pk}/bulk-flag/", response={200: FlaggedOut, 409: ErrorOut, **REFUSED}, url_name="api-run-bulk-flag",
    summary="Flag the items a count showed",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": FlagIn.model_json_schema()}}}},
)
def flag(request, pk: Id):
    """Flags the items the filter matches, if they are still those named in `items`; 409 and
    nothing flagged when some went or came since (count again)."""
    run = _run(request, pk)
    body = json_body(request)
    known_fields(body, FlagIn.model_fields)
    given = body.get("filter")
    if not isinstance(given, dict):
        raise ApiError(400, "filter must be an object: the GET's `filter`",
                       errors=[{"key": "filter", "message": "an object"}])
    refuse_unknown(given, FILTER_FIELDS, "filter field")
    # JSON's true/false and numbers read as the query's text (unscored=true, reward_max=0.3); a
    # null as the field left out, as the GET's query leaves it (it read as the text "None").
    chosen = _filter({name: str(value).lower() if isinstance(value, bool) else value
                      for name, value in given.items() if value is not None})
    items = _ids(body, "items")
    if not isinstance(body.get("reason"), str):
        raise ApiError(400, f"reason must be one of {', '.join(services.FLAG_REASONS)}")
    try:
        flagged = bulk.flag_all(run, request.user, chosen, body["reason"], confirmed_count=len(items),
                                confirmed=bulk.seen(items))
    except bulk.Changed as exc:
        if bulk.flagged_already(run, request.user, items):  # sent twice: the first did it
            return {"flagged": 0, "feedback": [], "refused": {},
                    "message": f"The {len(set(items))} items carry your flag already (sent twice?): nothing changed."}
        raise ApiError(409, str(exc)) from None
    except services.FeedbackError as exc:
        raise ApiError(400, str(exc)) from None
    return {"flagged": len(flagged.feedback_ids), "feedback": flagged.feedback_ids, "refused": dict(flagged.refused),
            "message": flagged.message}


@router.post(
    "/{pk}/bulk-flag/undo/", response={200: UndoneOut, **REFUSED}, url_name="api-run-bulk-flag-undo",
    summary="Undo a bulk flag",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": UndoIn.model_json_schema()}}}},
)
def undo(request, pk: Id):
    """Undoes the caller's flags named, of this run's items, each as the one-item undo does."""
    run = _run(request, pk)
    body = json_body(request)
    known_fields(body, UndoIn.model_fields)
    named = set(_ids(body, "feedback"))
    undone = bulk.undo_flags(run, list(named), request.user)
    skipped = len(named) - undone
    message = f"Undid {undone} flag{'s' * (undone != 1)}." + (
        f" {skipped} id{'s' * (skipped != 1)} undid nothing: not your flag of run {run.pk}'s items, or undone already."
        if skipped else "")
    return {"undone": undone, "skipped": skipped, "message": message}
