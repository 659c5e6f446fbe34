"""The reviewer's pages (apps/feedback/review.py): the runs with judgements waiting, and a run's
review queue, one judgement at a time, accepted or rejected by key (a, x) as annotators judge."""
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.roles import REVIEWER, role_required
from apps.core.bidi import isolate
from apps.runs.models import Run

from . import review, services
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
            "item": item, "seen": review.seen(judgement),
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
