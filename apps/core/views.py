from django.http import Http404, JsonResponse
from django.views.decorators.http import require_GET

from . import jobs


@require_GET
def job_progress(request, label, pk):
    """A job's state (jobs.snapshot), for whoever may see the job: what its page polls while it
    has no websocket. Another user's job is a 404, as a missing one."""
    job = jobs.visible_job(label, pk, request.user)
    if job is None:
        raise Http404("no such job")
    return JsonResponse(jobs.snapshot(job))
