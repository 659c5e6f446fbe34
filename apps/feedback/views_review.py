"""The reviewer's pages (apps/feedback/review.py): the runs with judgements waiting, and a run's
review queue, one judgement at a time, accepted or rejected by key (a, x) as annotators judge; the
run's decisions (review_history.py), where a reviewer changes their own."""
from urllib.parse import urlencode

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts.roles import REVIEWER, role_required
from apps.core.bidi import isolate
from apps.core.numbers import whole_number
from apps.runs.models import Run

from . import review, review_history, services
from .models import Feedback


@role_required(REVIEWER)
def review_start(request):
    return render(request, "feedback/review_start.html", {"runs": review.waiting_runs(request.user)})


@role_required(REVIEWER)
def review_next(request, run_id):
    run = get_object_or_404(Run, pk=run_id)
    judgement = review.next_for(run, request.user)
    context = {"run": run, "judgement": judgement, "waiting": review.pending(run).count(),
               "own_waiting": review.pending(run).filter(user=request.user).count()}
    if judgement is not None:
        item = judgement.experience
        context |= {
            "item": item, "seen": review.seen(judgement), "prompt_turns": services.split_conversation(item.messages)[0],
            "rating_label": dict(services.scale_labels(run)).get(judgement.label, ""),
            "verdict": services.VERDICTS.get(judgement.label, judgement.label),
            # What the annotator saw beside the response, to check the judgement against.
            "answer": item.task.answer if item.task_id else "", "rubric": services.feedback_settings(run).rubric,
            # What the others said of the same item: context, as a reviewer in Label Studio sees.
            "others": Feedback.objects.filter(experience=item).exclude(pk=judgement.pk).select_related("user"),
        }
    return render(request, "feedback/review.html", context)


@require_POST
@role_required(REVIEWER)
def review_decide(request, pk, decision):
    judgement = get_object_or_404(Feedback.objects.select_related("experience"), pk=pk)
    run_id = judgement.experience.run_id
    try:
        review.decide(pk, request.user, accept=decision == "accept", note=request.POST.get("note", ""),
                      seen_as=request.POST.get("seen"))
    except services.FeedbackError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{'Accepted' if decision == 'accept' else 'Rejected'} "
                                  f"{isolate(judgement.user)}'s {judgement.get_kind_display().lower()} "
                                  f"of experience {judgement.experience_id}.")
    return redirect("review-next", run_id=run_id) if run_id else redirect("review-start")


@role_required(REVIEWER)
def review_history_page(request, run_id):
    run = get_object_or_404(Run, pk=run_id)
    try:
        chosen, error = review_history.DecisionFilter.from_query(run, request.GET), None
    except review.ReviewError as exc:
        chosen, error = review_history.DecisionFilter(), f"Filter not applied: {exc}."
    shown, rows = review_history.page(run, request.user, chosen, request.GET.get("page"))
    for row in rows:
        row["seen"] = review.seen(row["judgement"])
    return render(request, "feedback/review_history.html", {
        "run": run, "page": shown, "rows": rows, "chosen": chosen, "error": error,
        "reviewers": review_history.reviewers(run), "decisions": review.DECIDED,
        "filter_query": urlencode(chosen.as_query()),
    })


@require_POST
@role_required(REVIEWER)
def review_change(request, pk):
    """Turn the reviewer's own decision round; back to the history page as it was filtered."""
    judgement = get_object_or_404(Feedback.objects.select_related("experience", "user"), pk=pk)
    # `to`, not `decision`: the form carries the history's filter back, whose `decision` is accepted or rejected.
    accept = request.POST.get("to") == "accept"
    page = whole_number(request.POST.get("page", ""))  # the page it was on: the reviewer goes on there
    try:
        if request.POST.get("to") not in ("accept", "reject"):
            raise review.ReviewError("to must be accept or reject")
        review.change(pk, request.user, accept=accept, note=request.POST.get("note", ""),
                      seen_as=request.POST.get("seen"))
    except services.FeedbackError as exc:
        messages.error(request, f"Nothing changed: {exc}.")
    else:
        # The row is the newest decision now: it left a later page for the top of the first.
        moved = " It is the newest decision now: at the top of page 1." if page and page > 1 else ""
        messages.success(request, f"{'Accepted' if accept else 'Rejected'} {isolate(judgement.user)}'s "
                                  f"{judgement.get_kind_display().lower()} of experience {judgement.experience_id} "
                                  f"instead.{moved}")
    run_id = judgement.experience.run_id
    if run_id is None:
        return redirect("review-start")
    try:
        chosen = review_history.DecisionFilter.from_query(judgement.experience.run, request.POST)
    except review.ReviewError:
        chosen = review_history.DecisionFilter()
    query = urlencode({**chosen.as_query(), **({"page": page} if page and page > 1 else {})})
    return redirect(reverse("review-history", args=[run_id]) + (f"?{query}" if query else ""))
