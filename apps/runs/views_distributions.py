"""The run page's Distributions panel: how its rollouts' rewards and lengths spread at each
explorer step (apps/runs/distributions.py)."""
from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import never_cache

from apps.accounts.roles import RESEARCHER, role_required
from rftweb.errors import bad_request_response

from .api import token_or_session
from .distributions import run_distributions
from .models import Run


@never_cache  # fetched again while the run trains
@token_or_session  # scripts read it with their API token
@role_required(RESEARCHER)
def run_distributions_json(request, pk):
    if request.GET:  # it takes none: `?step=5` answered every step, as if it filtered
        return bad_request_response(request, f"{request.path} takes no query parameters: "
                                             f"{', '.join(repr(name[:60]) for name in list(request.GET)[:5])}")
    run = get_object_or_404(Run.objects.only("pk", "status"), pk=pk)
    return JsonResponse({**run_distributions(run), "active": run.status not in Run.FINISHED})
