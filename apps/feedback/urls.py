from django.urls import path

from . import api, views, views_bulk, views_review

urlpatterns = [
    path("", views.start, name="annotate-start"),
    path("next/", views.next_item, name="annotate-next"),
    path("runs/<int:run_id>/", views.run_feedback, name="annotate-run-feedback"),
    path("runs/<int:run_id>/feedback.jsonl", views.export, name="annotate-export"),
    path("runs/<int:run_id>/summary.json", views.run_summary, name="annotate-run-summary"),
    path("runs/<int:run_id>/annotators/", views.assign_annotators, name="annotate-assign"),
    path("runs/<int:run_id>/bulk-flag/", views_bulk.bulk_flag, name="annotate-bulk-flag"),
    path("runs/<int:run_id>/bulk-flag/confirm/", views_bulk.bulk_flag_confirmed, name="annotate-bulk-flag-confirm"),
    path("runs/<int:run_id>/bulk-flag/undo/", views_bulk.bulk_flag_undo, name="annotate-bulk-flag-undo"),
    path("experience/<int:pk>/", views.experience, name="annotate-experience"),
    path("review/", views_review.review_start, name="review-start"),
    path("review/runs/<int:run_id>/", views_review.review_next, name="review-next"),
    path("review/runs/<int:run_id>/history/", views_review.review_history_page, name="review-history"),
    path("review/judgement/<int:pk>/change/", views_review.review_change, name="review-change"),
    path("review/judgement/<int:pk>/accept/", views_review.review_decide, {"decision": "accept"},
         name="review-accept"),
    path("review/judgement/<int:pk>/reject/", views_review.review_decide, {"decision": "reject"},
         name="review-reject"),
    path("experience/<int:pk>/skip/", views.set_aside, {"postpone": False}, name="annotate-skip"),
    path("experience/<int:pk>/postpone/", views.set_aside, {"postpone": True}, name="annotate-postpone"),
    # The annotation page's JSON (api.py): items in place, judgements, undo, history.
    path("api/next/", api.next_item, name="annotate-api-next"),
    path("api/experience/<int:pk>/", api.item, name="annotate-api-item"),
    path("api/experience/<int:pk>/<str:action>/", api.judge, name="annotate-api-judge"),
    path("api/undo/", api.undo, name="annotate-api-undo"),
    path("api/progress/", api.progress, name="annotate-api-progress"),
    *(
        path(f"experience/<int:pk>/{action}/", views.judge, {"action": action}, name=f"annotate-{action}")
        for action in views.JUDGEMENTS
    ),
]
