from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.views.decorators.http import require_GET

from . import jobs


@require_GET
def job_progress(request, label, pk):
    """A job's state (jobs.snapshot), for whoever may see the job: what its page polls while it
    has no websocket."""
    job = jobs.find_job(label, pk)
    if job is None:
        raise Http404("no such job")
    if not job.may_view(request.user):
        raise PermissionDenied("this job belongs to another user")
    return JsonResponse(jobs.snapshot(job))
