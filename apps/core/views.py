from django.http import Http404, JsonResponse
from django.views.decorators.http import require_GET

from apps.runs.api import token_or_session

from . import jobs


@token_or_session  # scripts follow a job with their API token
@require_GET
def job_progress(request, label, pk):
    """A job's state (jobs.snapshot), for whoever may see the job: what its page polls (every 5 s
    with a websocket, which carries no word of a process that died). Another user's job is a 404,
    as a missing one."""
    job = jobs.visible_job(label, pk, request.user)
    if job is None:
        raise Http404("no such job")
    return JsonResponse(jobs.snapshot(job, jobs.orphaned(job)))
