from django.urls import include, path

from . import api, views, views_compare, views_distributions, views_list, views_logs, views_reports, views_sweeps

urlpatterns = [
    path("", views_list.home, name="home"),
    path("runs/", views_list.run_list, name="run-list"),
    path("runs/new/", views.run_launch, name="run-launch"),
    path("runs/stop/", views_list.run_bulk_stop, name="run-bulk-stop"),
    path("runs/list.csv", views_list.run_list_csv, name="run-list-csv"),
    path("runs/columns/", views_list.run_list_columns, name="run-list-columns"),
    path("runs/views/", views_list.run_list_views, name="run-list-views"),
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
    path("workers/runs/<int:pk>/<str:duty>/<str:action>/", views.worker_duty, name="worker-duty"),
    # Any name a worker was started with (`celery worker -n`), "/" too: after the actions above and
    # its own (a name ending in "/drain" has no page: no Celery hostname does).
    path("workers/<path:name>/drain/", views.worker_drain, {"drain": True}, name="worker-drain"),
    path("workers/<path:name>/undrain/", views.worker_drain, {"drain": False}, name="worker-undrain"),
    path("workers/<path:name>/", views.worker_page, name="worker-detail"),
    path("sweeps/", views_sweeps.sweep_list, name="sweep-list"),
    path("sweeps/<int:pk>/", views_sweeps.sweep_detail, name="sweep-detail"),
    # [runs-compare helper: compare, downloads, tags]
    path("runs/compare/", views_compare.run_compare, name="run-compare"),
    path("runs/compare/metrics.csv", views_compare.compare_metrics_csv, name="compare-metrics-csv"),
    path("runs/compare/metrics.json", views_compare.compare_metrics_json, name="compare-metrics-json"),
    path("runs/<int:pk>/metrics.csv", views_compare.run_metrics_csv, name="run-metrics-csv"),
    path("runs/<int:pk>/metrics.json", views_compare.run_metrics_json, name="run-metrics-json"),
    path("runs/<int:pk>/notes/", views_compare.run_notes, name="run-notes"),
    path("reports/", views_reports.report_list, name="report-list"),
    path("reports/new/", views_reports.report_save, name="report-save"),
    path("reports/<int:pk>/", views_reports.report_detail, name="report-detail"),
    path("reports/<int:pk>/edit/", views_reports.report_edit, name="report-edit"),
    # [run-page helper: logs]
    path("runs/<int:pk>/logs.json", views_logs.run_logs, name="run-logs"),
    path("runs/<int:pk>/distributions.json", views_distributions.run_distributions_json, name="run-distributions"),
    # The JSON API (docs/api.md). The token page is HTML, for a logged-in researcher.
    path("api/", include(api.urlpatterns)),  # ninja's routes (apps/runs/api/), each with its api-... name
    path("api/token/", views.api_token, name="api-token"),
    path("api/docs/", api.docs_page, name="api-docs"),
]
