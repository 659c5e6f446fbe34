from django.urls import path

from . import api, views

urlpatterns = [
    path("", views.home, name="home"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/new/", views.run_launch, name="run-launch"),
    path("runs/stop/", views.run_bulk_stop, name="run-bulk-stop"),
    path("runs/compare/", views.run_compare, name="run-compare"),
    path("runs/plotly.min.js", views.plotly_js, name="plotly-js"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/live.json", views.run_live, name="run-live"),
    path("runs/<int:pk>/pause/", views.run_control, {"action": "pause"}, name="run-pause"),
    path("runs/<int:pk>/resume/", views.run_control, {"action": "resume"}, name="run-resume"),
    path("runs/<int:pk>/stop/", views.run_control, {"action": "stop"}, name="run-stop"),
    path("runs/<int:pk>/explorers/", views.run_explorers, name="run-explorers"),
    path("runs/<int:pk>/rollouts/", views.run_rollouts, name="run-rollouts"),
    path("runs/<int:pk>/checkpoints/<int:version>/download/", views.checkpoint_download, name="checkpoint-download"),
    path("workers/", views.worker_list, name="worker-list"),
    # The JSON API (docs/api.md). The token page is HTML, for a logged-in researcher.
    path("api/", api.index, name="api-index"),
    path("api/token/", views.api_token, name="api-token"),
    path("api/runs/", api.runs, name="api-runs"),
    path("api/runs/<int:pk>/", api.run_detail, name="api-run"),
    path("api/runs/<int:pk>/duties/", api.run_duties, name="api-run-duties"),
    path("api/runs/<int:pk>/metrics/", api.run_metrics, name="api-run-metrics"),
    path("api/runs/<int:pk>/experiences/", api.run_experiences, name="api-run-experiences"),
    path("api/runs/<int:pk>/pause/", api.run_action, {"action": "pause"}, name="api-run-pause"),
    path("api/runs/<int:pk>/resume/", api.run_action, {"action": "resume"}, name="api-run-resume"),
    path("api/runs/<int:pk>/stop/", api.run_action, {"action": "stop"}, name="api-run-stop"),
    path("api/workers/", api.workers, name="api-workers"),
]
