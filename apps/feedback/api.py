"""The annotation page's JSON endpoints (session auth, CSRF): the page judges, fetches the next item
ahead, undoes and lists its history without reloading. Items come as the same HTML fragment the
page itself is rendered from (templates/feedback/_item.html), so one template draws an item.

A judgement answers the session count and history, and a "message" when it replaced an earlier
one of the user's (null otherwise). Errors answer {"error": why} with the status that says what
kind: 400 a bad request (and nothing changed), 403 not an annotator of the run, 404 no such item
or judgement, 409 a judgement to confirm ({"confirm": the question}: send it again with
"confirm": true).
"""
import time

from django.http import JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.roles import ANNOTATOR, role_required
from apps.buffer.models import Experience
from apps.core.files import parse_json
from apps.core.numbers import whole_number, whole_numbers
from apps.runs.models import Run

from . import history, queue, views
from .page_queue import PageQueue
from .queue_filter import FIELDS as FILTER_FIELDS
from .queue_filter import QueueFilter
from .services import FeedbackError, NeedsConfirmation, NotAnnotator, check_may_annotate

MAX_BODY_CHARS = 64_000  # an edit (20,000 characters) and a comment, with room for JSON escapes
ACTIONS = {**views.JUDGEMENTS, **{name: None for name in ("skip", "postpone")}}


class BadRequest(Exception):
    pass


def _error(message: str, status: int = 400, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _body(request) -> dict:
    """The request's JSON object, its values strings (numbers read as their text) or booleans."""
    if request.content_type != "application/json":  # a form's body is read (and gone) before any view
        raise BadRequest(f"send the body as JSON (Content-Type: application/json), not {request.content_type}")
    if len(request.body) > MAX_BODY_CHARS:
        raise BadRequest(f"the request body is {len(request.body)} bytes; at most {MAX_BODY_CHARS} are read")
    try:
        body = parse_json(request.body.decode("utf-8") or "{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    fields = {}
    for name, value in body.items():
        if isinstance(value, bool) or isinstance(value, str):
            fields[name] = value
        elif isinstance(value, (int, float)):
            fields[name] = str(value)
        else:
            raise BadRequest(f"the field {name!r} must be a string, a number or true/false, not {type(value).__name__}")
    return fields


def _run(request) -> Run | None:
    return Run.objects.filter(pk=request.session.get(views.SESSION_RUN)).first()


def _since(request):
    """The start of this session's count: the first item page (views.experience) or judgement of the session."""
    since = parse_datetime(request.session.get(views.SESSION_SINCE, "") or "")
    if since is None:
        since = timezone.now()
        request.session[views.SESSION_SINCE] = since.isoformat()
    return since


def _item(request, item: Experience, *, error=None, confirm=None, text=None, **queue) -> dict:
    context = views.item_context(request, item, error=error, confirm=confirm, edited_text=text, **queue)
    return {"id": item.pk, "judgeable": context["refusal"] is None,
            "html": render_to_string("feedback/_item.html", context, request=request)}


def _progress(request, run: Run | None) -> dict:
    """The session count and the history panel of `run` (the page's: a judgement's item's, an
    undo's), as every answer that changes them carries. Each tab keeps its own queue: the session's
    run is the one another tab opened last, and a `u` in one tab undid a judgement made in another,
    on another run, and showed that tab's history."""
    if run is None:
        return {"session_count": 0, "history": []}
    return {"session_count": history.session_count(run, request.user, _since(request)),
            "history": history.history(run, request.user)}


def _experience(pk) -> Experience | None:
    return Experience.objects.select_related("run", "task").filter(pk=pk).first()


@require_GET
@role_required(ANNOTATOR)
def item(request, pk):
    """One item, taken for the user where it is open to them (a history entry reopened)."""
    experience = _experience(pk)
    if experience is None:
        return _error(f"experience {pk} does not exist", 404)
    error = None
    try:
        queue.take(experience.pk, request.user)
    except NotAnnotator as exc:
        return _error(str(exc), 403)
    except FeedbackError as exc:
        error = str(exc)
    if experience.run_id:
        request.session[views.SESSION_RUN] = experience.run_id
    return JsonResponse({"item": _item(request, experience, error=error)})


@require_GET
@role_required(ANNOTATOR)
def next_item(request):
    """The next item of the session's run, taken for the user, leaving out those the page has
    (`exclude`: comma-separated ids), of those the filter keeps (`_queue_filter`); null when the
    queue has nothing more (the page then shows the queue's empty page, which says why). With it,
    the filter applied and how many items are left ("37 of 412 left match").
    A query naming the `run` is the whole queue (run, `strategy`, filter: page_queue.py, the rules
    the item page and its forms read it by): the item page's own, so that a tab goes on with its
    queue while another tab starts another; a bad one is refused."""
    try:
        own = PageQueue.from_query(request.GET)
    except FeedbackError as exc:
        return _error(str(exc), 400)
    run = Run.objects.filter(pk=own.run_id).first() if own else _run(request)
    if run is None:
        return _error(f"there is no run {own.run_id}: choose one on the annotation page" if own else
                      "no run chosen: choose one on the annotation page", 400)
    ids = [pk for pk in request.GET.get("exclude", "").split(",") if pk.strip()]
    exclude = whole_numbers(ids)
    if len(exclude) != len(ids):  # 10^22 was a 500 on SQLite (an integer too large for it)
        return _error("exclude must be experience ids separated by commas", 400)
    strategy = own.strategy if own else request.session.get(views.SESSION_STRATEGY, queue.NEWEST)
    try:
        queue_filter = own.queue_filter if own else _queue_filter(request)
        experience = queue.next_item(run, request.user, strategy, exclude=exclude, queue_filter=queue_filter)
    except NotAnnotator as exc:
        return _error(str(exc), 403)
    except FeedbackError as exc:
        return _error(str(exc), 400)
    shown = {"strategy": strategy, "queue_filter": queue_filter, "leaving": exclude}
    return JsonResponse({
        "item": _item(request, _experience(experience.pk), **shown) if experience else None,
        "filter": queue_filter.as_query(), "left": queue.left_note(run, request.user, queue_filter, exclude),
    })


def _queue_filter(request) -> QueueFilter:
    """The filter the query names (a script's own: reward_min=0.2&source=synthetic ...), else the
    one the session's queue was started with; a bad value raises FilterError naming its field."""
    if any(name in request.GET for name in FILTER_FIELDS):
        return QueueFilter.from_query(request.GET)
    return views.session_filter(request)


def _seconds(fields) -> float:
    try:
        return float(fields.get("seconds", "0"))
    except ValueError:
        raise BadRequest(f"seconds must be a number, not {fields['seconds']!r}") from None


@require_POST
@role_required(ANNOTATOR)
def judge(request, pk, action):
    """Rate, edit, compare, flag, skip or postpone the item; answers the new count and history."""
    if action not in ACTIONS:
        return _error(f"unknown action {action!r}: one of {', '.join(ACTIONS)}", 404)
    experience = _experience(pk)
    if experience is None:
        return _error(f"experience {pk} does not exist", 404)
    _since(request)  # a session's count starts at the page, or at the latest with its first judgement
    replaced = None
    try:
        fields = _body(request)
        if ACTIONS[action] is None:
            queue.set_aside(experience.pk, request.user, postpone=action == "postpone")
        else:
            replaced = ACTIONS[action](
                fields, request.user, experience.pk, seconds_spent=_seconds(fields), comment=fields.get("comment", "")
            ).replaced
    except BadRequest as exc:
        return _error(str(exc))
    except NotAnnotator as exc:
        return _error(str(exc), 403)
    except NeedsConfirmation as exc:
        return _error(str(exc), 409, confirm=str(exc))
    except FeedbackError as exc:
        # The item as it is now (say, the run finished meanwhile): the page shows why, and what is left to do.
        experience.refresh_from_db()
        return _error(str(exc), item=_item(request, experience, error=str(exc), text=fields.get("text")))
    return JsonResponse({
        "saved": {"item": experience.pk, "action": action}, "at": time.time(),
        # The page says when a judgement replaced one (comparing a pair again): no change goes unsaid.
        "message": views.saved_message(action, experience.pk, replaced) if replaced else None,
        **_progress(request, experience.run),
    })


@require_POST
@role_required(ANNOTATOR)
def undo(request):
    """Undo a judgement of the user's ({"feedback": id}; none: their newest on the session's run).
    Answers what was undone, whether training had used it, and the item reopened."""
    try:
        fields = _body(request)
        if "feedback" in fields:
            feedback = whole_number(fields["feedback"])
            if feedback is None:
                raise BadRequest(f"feedback must be the id of a judgement, not {fields['feedback']!r}")
            undone = history.undo(feedback, request.user)
        else:
            run = _page_run(fields.get("run"), request)
            if run is None:
                raise BadRequest("no run chosen: choose one on the annotation page")
            undone = history.undo_last(run, request.user)
    except BadRequest as exc:
        return _error(str(exc))
    except NotAnnotator as exc:
        return _error(str(exc), 403)
    except history.TooLateToUndo as exc:
        return _error(str(exc), 409)
    except history.NothingToUndo as exc:
        return _error(str(exc), 404)
    return JsonResponse({
        "message": undone.message, "trained_on_step": undone.trained_on_step,
        "item": _item(request, _experience(undone.experience.pk)), **_progress(request, undone.experience.run),
    })


@require_GET
@role_required(ANNOTATOR)
def progress(request):
    """This session's count and the user's newest judgements on the page's run (`run`), else the
    session's."""
    try:
        run = _page_run(request.GET.get("run"), request)
    except BadRequest as exc:
        return _error(str(exc))
    except NotAnnotator as exc:
        return _error(str(exc), 403)
    return JsonResponse(_progress(request, run))


def _page_run(value, request) -> Run | None:
    """The run a page names (its queue's), else the session's. NotAnnotator for a run the user may
    not annotate (no longer: its owner took them off it), as its items' services refuse it."""
    if value is None:
        run = _run(request)
    else:
        pk = whole_number(value)
        if pk is None:
            raise BadRequest(f"run must be the id of a run, not {value!r}")
        if (run := Run.objects.filter(pk=pk).first()) is None:
            raise BadRequest(f"no run with id {pk}: it was deleted")
    if run is not None:  # the session's too: chosen before its owner took the user off it
        check_may_annotate(run, request.user)
    return run
