"""Flagging the items of a run a filter matches, in one confirmed action (bulk.py): the page lists
what the filter matches and how many; the flag posts that count back, so it flags what was seen."""
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, role_required
from apps.core.numbers import whole_number
from apps.runs.models import Run

from . import bulk, services
from .queue_filter import FIELDS as FILTER_FIELDS
from .queue_filter import MAX_TEXT_CHARS, NO_FILTER, SOURCES, FilterError, QueueFilter
from .views import queue_link

SESSION_LAST = "bulk_flag_last"  # {"run": id, "feedback": [ids]}: the session's last bulk flag, to undo


def _run_for(request, run_id) -> Run:
    run = get_object_or_404(Run, pk=run_id)
    try:
        bulk.check_may_bulk_flag(run, request.user)
    except bulk.NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    return run


@role_required(RESEARCHER)  # curators are researchers too; an annotator never gets this far
def bulk_flag(request, run_id):
    run = _run_for(request, run_id)
    try:
        chosen = QueueFilter.from_query(request.GET)
        error = None
    except FilterError as exc:
        chosen, error = NO_FILTER, f"Filter not applied: {exc}."
    items = bulk.matching(run, chosen, request.user) if chosen else None
    ids = bulk.matching_ids(run, chosen, request.user) if chosen else []
    count = len(ids)
    last = request.session.get(SESSION_LAST) or {}
    return render(request, "feedback/bulk_flag.html", {
        "run": run, "error": error, "filter": {n: request.GET.get(n, "") for n in FILTER_FIELDS},
        "chosen": chosen.as_query(), "described": chosen.describe(), "count": count,
        "too_many": count > bulk.MAX_ITEMS, "max_items": bulk.MAX_ITEMS, "seen": bulk.seen(ids),
        "shown": list(items[: bulk.SHOWN_ITEMS]) if items is not None else [],
        "reasons": services.FLAG_REASONS, "sources": SOURCES, "max_text_chars": MAX_TEXT_CHARS,
        "undoable": len(last.get("feedback", [])) if last.get("run") == run.pk else 0,
        "queue_link": queue_link(run.pk, "newest", chosen),
    })


@require_POST
@role_required(RESEARCHER)
def bulk_flag_confirmed(request, run_id):
    run = _run_for(request, run_id)
    chosen = NO_FILTER
    try:
        chosen = QueueFilter.from_query(request.POST)
        sent = request.POST.get("count", "")
        count = whole_number(sent)
        if count is None:
            raise FilterError("count: the number of items confirmed is missing: look at the list and confirm"
                              if not sent.strip() else f"count: {sent[:40]!r} is not a number of items (a whole "
                              "number): look at the list and confirm")
        flagged = bulk.flag_all(run, request.user, chosen, request.POST.get("reason", ""), confirmed_count=count,
                                confirmed=request.POST.get("seen", ""))
    except services.FeedbackError as exc:
        messages.error(request, f"Nothing flagged: {exc}.")
    else:
        request.session[SESSION_LAST] = {"run": run.pk, "feedback": flagged.feedback_ids}
        messages.success(request, flagged.message)
    return redirect(_page(run, chosen))


@require_POST
@role_required(RESEARCHER)
def bulk_flag_undo(request, run_id):
    run = _run_for(request, run_id)
    last = request.session.get(SESSION_LAST) or {}
    if last.get("run") != run.pk or not last.get("feedback"):
        messages.error(request, "No bulk flag of this run to undo in this session.")
    else:
        undone = bulk.undo_all(last["feedback"], request.user)
        del request.session[SESSION_LAST]
        messages.success(request, f"Undid {undone} flag{'s' if undone != 1 else ''} of your last bulk flag.")
    return redirect(_page(run, NO_FILTER))


def _page(run, chosen: QueueFilter) -> str:
    query = urlencode(chosen.as_query())
    return reverse("annotate-bulk-flag", args=[run.pk]) + (f"?{query}" if query else "")
