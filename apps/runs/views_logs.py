"""The run page's Logs panel: what the run's workers logged while serving it (apps/runs/logs.py)."""
from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import never_cache

from apps.accounts.roles import RESEARCHER, role_required
from apps.core.numbers import whole_number

from . import logs, supervision
from .api import token_or_session
from .models import Run

MAX_LIMIT = 2000


@never_cache  # polled while the run is active: always the newest lines
@token_or_session  # scripts read it with their API token
@role_required(RESEARCHER)
def run_logs(request, pk):
    """JSON: the run's log lines at ?level= (debug, info, warning, error; info by default) or above,
    errors and warnings first, then the newest; at most ?limit= of them."""
    run = get_object_or_404(Run.objects.only("pk", "created_at", "status"), pk=pk)
    limit = whole_number(request.GET.get("limit", str(logs.DEFAULT_LIMIT)))
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        return JsonResponse({"error": f"limit must be a whole number from 1 to {MAX_LIMIT}"}, status=400)
    try:
        found = logs.read(supervision.run_dir(run), request.GET.get("level", "info"), limit)
    except ValueError as err:
        return JsonResponse({"error": str(err)}, status=400)
    return JsonResponse({**found, "status": run.status, "active": run.status not in Run.FINISHED})
