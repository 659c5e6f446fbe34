"""The annotation queue's pages: pick a run and a strategy, then judge one item after another."""
import time

from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER, REVIEWER, has_role, role_required
from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.core.numbers import whole_number
from apps.core.streaming import streaming
from apps.runs.api import token_or_session
from apps.runs.models import Run
from rftweb.errors import form_checks_nul

from . import edit_rows, queue, review, services, stats
from .history import describe
from .models import RunAnnotators
from .page_queue import PageQueue
from .queue_filter import FIELDS as FILTER_FIELDS
from .queue_filter import MAX_TEXT_CHARS as MAX_FILTER_TEXT_CHARS
from .queue_filter import NO_FILTER, FilterError, QueueFilter
from .queue_filter import SOURCES as FILTER_SOURCES
from .services import FeedbackError, NeedsConfirmation, NotAnnotator

RUN_CHOICES = 50
SESSION_RUN, SESSION_STRATEGY = "annotate_run", "annotate_strategy"
SESSION_SINCE = "annotate_since"  # when this login session's count of judgements began (api.py)
SESSION_FILTER = "annotate_filter"  # the queue's filter, as its URL query (queue_filter.py)


def session_filter(request) -> QueueFilter:
    """The filter the session's queue was started with (checked then: read back as it was)."""
    try:
        return QueueFilter.from_query(request.session.get(SESSION_FILTER) or {})
    except FilterError:  # written by an older version: no filter rather than a broken queue
        return NO_FILTER


def session_queue(request) -> PageQueue | None:
    """The queue the session started last (start): another tab's, perhaps. None before any."""
    run_id = request.session.get(SESSION_RUN)
    if run_id is None:
        return None
    return PageQueue(run_id, request.session.get(SESSION_STRATEGY, queue.NEWEST), session_filter(request))


def own_queue(request, run_id=None) -> PageQueue | None:
    """The queue the request's address names (page_queue.py: an item page's, the forms it posts,
    the next item they lead to), so a tab goes on with its queue whatever another tab starts;
    None for the session's: none named, another run's than `run_id`, or a bad one (said)."""
    try:
        named = PageQueue.from_query(request.GET)
    except FilterError as exc:
        messages.error(request, f"Filter not applied: {exc}.")
        return None
    if named is None or (run_id is not None and named.run_id != run_id):
        return None
    return named


def with_queue(url: str, chosen: PageQueue | None) -> str:
    """`url` naming the queue `chosen` (None: the session's, named by nothing)."""
    return f"{url}?{chosen.as_query()}" if chosen is not None else url


def queue_link(run_id, strategy: str, queue_filter: QueueFilter) -> str:
    """The start page's URL that starts this queue: what a person shares to hand theirs on."""
    return with_queue(reverse("annotate-start"), PageQueue(run_id, strategy, queue_filter))


def filter_context(request, run_id, strategy: str | None = None, queue_filter: QueueFilter | None = None) -> dict:
    """The active filter for a queue page: in words, the link that shares it, the one that clears
    it, and the queue as a query. The session's queue unless the page has its own (api.next_item)."""
    queue_filter = session_filter(request) if queue_filter is None else queue_filter
    strategy = strategy or request.session.get(SESSION_STRATEGY, queue.NEWEST)
    return {
        "queue_filter": queue_filter.describe(), "share_link": queue_link(run_id, strategy, queue_filter),
        "clear_link": queue_link(run_id, strategy, NO_FILTER),
        "queue_query": PageQueue(run_id, strategy, queue_filter).as_query(),
    }


@role_required(ANNOTATOR)
def start(request):
    """Choose the run, the strategy and a filter; the queue remembers them for the session. The
    page's URL with them in it (a link shared) starts that queue at once."""
    chosen_filter = session_filter(request)
    if "run" in request.GET:
        run_id = whole_number(request.GET["run"])
        # a link to a deleted run (a bookmark, a shared queue) is said here, not a bare 404
        run = Run.objects.filter(pk=run_id).first() if run_id is not None else None
        strategy = request.GET.get("strategy", queue.NEWEST)
        try:
            chosen_filter = QueueFilter.from_query(request.GET)
        except FilterError as exc:  # nothing applied: the form comes back with what was sent
            messages.error(request, f"Filter not applied: {exc}.")
            chosen_filter = None
        else:
            if run is None:
                messages.error(request, f"There is no run {request.GET['run'][:40]!r}: choose one."
                               if request.GET["run"].strip() else "Choose a run.")
            elif strategy not in queue.STRATEGIES:
                messages.error(request, f"Unknown strategy {strategy[:40]!r}: choose one of "
                                        f"{', '.join(queue.STRATEGIES)}.")
            elif not services.may_annotate(run, request.user):
                messages.error(request, f"You are not an annotator of run {isolate(run.name)}: "
                                        "its owner assigns who annotates it.")
            else:
                request.session[SESSION_RUN], request.session[SESSION_STRATEGY] = run.pk, strategy
                request.session[SESSION_FILTER] = chosen_filter.as_query()
                return redirect(with_queue(reverse("annotate-next"), session_queue(request)))
    runs = services.annotatable_runs(Run.objects.filter(experiences__isnull=False), request.user)
    choices = []  # (run, items left to the user, how many that reads as)
    for run in runs.distinct().order_by("-created_at")[:RUN_CHOICES]:
        left = queue.items_left(run, request.user)
        choices.append((run, left, queue.items_left_label(left)))
    sent = {name: request.GET.get(name, "") for name in FILTER_FIELDS} if chosen_filter is None else None
    return render(
        request, "feedback/start.html",
        {"runs": choices, "strategies": queue.STRATEGIES,
         "chosen_run": whole_number(request.GET.get("run", "")) or request.session.get(SESSION_RUN),
         "chosen_strategy": request.GET.get("strategy") or request.session.get(SESSION_STRATEGY, queue.NEWEST),
         "filter": sent if sent is not None else chosen_filter.as_query(),
         "sources": FILTER_SOURCES, "max_text_chars": MAX_FILTER_TEXT_CHARS},
    )


@role_required(ANNOTATOR)
def next_item(request):
    """The next item of the queue the address names (a tab's own, kept by its forms), else of the
    session's; its page's address names that queue, so that tab goes on with it."""
    chosen = own_queue(request) or session_queue(request)
    run = Run.objects.filter(pk=chosen.run_id).first() if chosen is not None else None
    if run is None:
        if chosen is not None:  # deleted since, or never was
            messages.error(request, f"There is no run {chosen.run_id}: choose one.")
        return redirect("annotate-start")
    queue_filter = chosen.queue_filter
    try:
        item = queue.next_item(run, request.user, chosen.strategy, queue_filter=queue_filter)
    except FeedbackError as exc:
        messages.error(request, str(exc))
        return redirect("annotate-start")
    if item is None:
        # While the run goes on, the page waits on its channel and comes back here when new
        # experiences arrive; a finished run writes none, and the page says so. When the filter
        # is what leaves nothing, the page says that, and how many are left without it.
        unfiltered = queue.items_left(run, request.user) if queue_filter else 0
        return render(request, "feedback/empty.html", {
            "run": run, "reasons": queue.why_empty(run, request.user),
            "left_unfiltered": queue.items_left_label(unfiltered) if unfiltered else None,
            **filter_context(request, run.pk, chosen.strategy, queue_filter),
        })
    return redirect(with_queue(reverse("annotate-experience", args=[item.pk]), chosen))


def page_queue(request, item) -> dict:
    """The item's page's queue as item_context takes it: the one its address names (annotate.js
    keeps it there as items change in place; the forms post it), so a reloaded tab, or one
    without JavaScript, goes on with its own queue; {} for the session's."""
    chosen = own_queue(request, item.run_id) if item.run_id else None
    return {"strategy": chosen.strategy, "queue_filter": chosen.queue_filter} if chosen else {}


def _refused(request, exc: NotAnnotator):
    """The answer to someone who may not annotate the item's run: why, and nothing of the item."""
    return render(request, "feedback/refused.html", {"reason": str(exc)}, status=403)


@role_required(ANNOTATOR)
def experience(request, pk):
    item = get_object_or_404(Experience.objects.select_related("run", "task"), pk=pk)
    try:
        queue.take(item.pk, request.user)
        error = None
    except NotAnnotator as exc:
        return _refused(request, exc)
    except FeedbackError as exc:  # this item is not open to them now: the page shows it, read only
        error = str(exc)
    request.session.setdefault(SESSION_SINCE, timezone.now().isoformat())  # the session count starts here
    if item.run_id:
        request.session[SESSION_RUN] = item.run_id  # after this item the queue goes on with its run
        if error is None:
            edit_rows.prepare_edits(item.run)
    return _item_page(request, item, error=error, **page_queue(request, item))


def _item_page(request, item, *, error=None, confirm=None, status=200, strategy=None, queue_filter=None):
    # Checked here too, as the last word before any text of the item is shown: a form refused
    # before its service ran (no other response named, say) must not show an outsider the item.
    try:
        services.check_may_annotate(item.run, request.user)
    except NotAnnotator as exc:
        return _refused(request, exc)
    context = item_context(
        request, item, error=error, confirm=confirm, edited_text=request.POST.get("text") if error else None,
        strategy=strategy, queue_filter=queue_filter,
    )
    return render(request, "feedback/experience.html", context, status=status)


def item_context(request, item, *, error=None, confirm=None, edited_text=None, strategy=None,
                 queue_filter=None, leaving=()) -> dict:
    """What templates/feedback/_item.html draws an item from: the page and its JSON fragments
    (api.py) alike; `strategy` and `queue_filter`: the page's queue, where not the session's;
    `leaving`: what the page is done with (queue.left_note). The caller has checked that the user
    may annotate the item's run."""
    queue_filter = session_filter(request) if queue_filter is None else queue_filter
    refusal = services.refusal(item, request.user)
    prompt_turns, response_turns = services.split_conversation(item.messages)
    mine = list(item.feedback.filter(user=request.user).order_by("-updated_at")) if item.pk else []
    return {
        "item": item, "error": error if error != refusal else None, "refusal": refusal, "shown_at": time.time(),
        "confirm": confirm,  # an edit to confirm (it contradicts the reference answer): the question
        "other": queue.choose_comparison(item) if refusal is None else None,
        "prompt_turns": prompt_turns, "response_turns": response_turns,
        "answer": item.task.answer if item.task_id else "", "rubric": services.feedback_settings(item.run).rubric,
        "scale": services.scale_labels(item.run), "verdicts": services.VERDICTS,
        "flag_reasons": services.FLAG_REASONS, "holders": queue.holders(item, request.user),
        "left_note": queue.left_note(item.run, request.user, queue_filter, leaving) if item.run_id else None,
        **(filter_context(request, item.run_id, strategy, queue_filter) if item.run_id else {}),
        "mine": [describe(f) for f in mine],  # what the user already said of it (a reopened item)
        "max_edit_chars": services.MAX_EDIT_CHARS, "max_comment_chars": services.MAX_COMMENT_CHARS,
        "answer_tokens": edit_rows.answer_tokens(item.run),
        "edited_text": edited_text,
        "not_editable": services.EPISODE_EDIT if item.pk and services.has_environment_turns(item) else None,
    }


def _seconds_spent(request) -> float:
    try:
        return time.time() - float(request.POST.get("shown_at", ""))
    except ValueError:
        return 0.0


# Each judgement: what the form (or the page's JSON, api.py) sends, and the service that records it.
JUDGEMENTS = {
    "rate": lambda data, user, pk, **kw: services.rate(pk, user, data.get("point", ""), **kw),
    "edit": lambda data, user, pk, **kw: services.edit(
        pk, user, data.get("text", ""), confirmed=_yes(data.get("confirm", False)), **kw
    ),
    "compare": lambda data, user, pk, **kw: services.compare(
        pk, _int(data.get("other")), user, data.get("verdict", ""), **kw
    ),
    "flag": lambda data, user, pk, **kw: services.flag(pk, user, data.get("reason", ""), **kw),
}


JUDGEMENT_NAMES = {"rate": "rating", "edit": "edit", "compare": "comparison", "flag": "flag"}


YES, NO = (True, "1", "true", "on"), (False, "", "0", "false", "off")


def _yes(value) -> bool:
    """A yes/no field: the form's checkbox ("1") or the JSON API's true/false. Any other value is
    refused: "false" counted as yes while any non-empty string did."""
    if value in YES or value in NO:
        return value in YES
    raise FeedbackError(f"'confirm' must be true or false, not {value!r}")


def _int(value) -> int:
    number = whole_number(value)
    if number is None:
        raise FeedbackError("the form names no other response to compare with")
    return number


@form_checks_nul  # the services name a NUL in the edit or the comment; the page keeps them
@require_POST
@role_required(ANNOTATOR)
def judge(request, pk, action):
    item = get_object_or_404(Experience.objects.select_related("run", "task"), pk=pk)
    try:
        feedback = JUDGEMENTS[action](
            request.POST, request.user, item.pk,
            seconds_spent=_seconds_spent(request), comment=request.POST.get("comment", ""),
        )
    except NotAnnotator as exc:
        return _refused(request, exc)
    except NeedsConfirmation as exc:  # asked once: the form comes back with the question and `confirm` set
        return _item_page(request, item, confirm=str(exc), error=str(exc), status=400, **page_queue(request, item))
    except FeedbackError as exc:
        item.refresh_from_db()
        return _item_page(request, item, error=str(exc), status=400, **page_queue(request, item))
    messages.success(request, saved_message(action, item.pk, feedback.replaced))
    return _next_of_page(request, item)


def _next_of_page(request, item):
    """Without JavaScript a form posts to its page's queue (in the form's address): the next item
    is that queue's, not the session's, which another tab may have changed since."""
    return redirect(with_queue(reverse("annotate-next"), own_queue(request, item.run_id) if item.run_id else None))


def saved_message(action: str, pk: int, replaced: str | None) -> str:
    """What the page says of a saved judgement: also what it replaced, if it replaced one."""
    message = f"Saved your {JUDGEMENT_NAMES[action]} of experience {pk}."
    return f"{message} It replaces {replaced}." if replaced else message


@require_POST
@role_required(ANNOTATOR)
def set_aside(request, pk, postpone):
    item = get_object_or_404(Experience, pk=pk)
    try:
        queue.set_aside(item.pk, request.user, postpone=postpone)
    except NotAnnotator as exc:
        return _refused(request, exc)
    return _next_of_page(request, item)


@role_required(RESEARCHER, REVIEWER)
def run_feedback(request, run_id):
    """Progress and quality of a run's feedback: per-annotator counts and time, agreement; and
    who may annotate the run (its owner and curators change that). Reviewers read it too."""
    run = get_object_or_404(Run, pk=run_id)
    access = RunAnnotators.objects.filter(run=run).first()
    return render(
        request, "feedback/stats.html",
        {"run": run, "annotators": stats.per_annotator(run), "reviewers": stats.per_reviewer(run),
         "agreement": stats.agreement(run),
         "pairwise": stats.pairwise_agreement(run), "require_review": services.needs_review(run),
         "waiting": review.pending(run).count(),
         "open_to_all": access is None or access.open_to_all,
         "may_assign": run.owner_id == request.user.pk or has_role(request.user, CURATOR),
         "assigned": sorted(access.users.values_list("username", flat=True)) if access else []},
    )


@require_POST
@role_required(RESEARCHER)
def assign_annotators(request, run_id):
    run = get_object_or_404(Run, pk=run_id)
    usernames = request.POST.get("usernames", "").replace(",", "\n").splitlines()
    try:
        services.set_annotators(
            run, request.user, open_to_all=request.POST.get("open_to_all") == "on", usernames=usernames
        )
    except FeedbackError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Saved who annotates {isolate(run.name)}.")
    return redirect("annotate-run-feedback", run_id=run.pk)


@token_or_session  # scripts download it with their API token
@role_required(RESEARCHER)
def run_summary(request, run_id):
    """Human-feedback counts and the human-reward metric of a run, for its run page."""
    return JsonResponse(stats.summary(get_object_or_404(Run, pk=run_id)))


@token_or_session  # scripts download it with their API token
@role_required(RESEARCHER)
def export(request, run_id):
    run = get_object_or_404(Run, pk=run_id)
    response = streaming(stats.export_jsonl(run), content_type="application/jsonl")
    response["Content-Disposition"] = f'attachment; filename="feedback-run-{run.pk}.jsonl"'
    return response
