from django.urls import path

from . import views

urlpatterns = [
    path("", views.taskset_list, name="taskset-list"),
    # Two path segments, so no taskset name (one slug) can shadow them.
    path("imports/new/", views.taskset_upload, name="taskset-upload"),
    path("imports/<int:pk>/", views.taskset_import, name="taskset-import"),
    path("imports/<int:pk>/cancel/", views.taskset_import_cancel, name="taskset-import-cancel"),
    path("<slug:name>/", views.taskset_detail, name="taskset-detail"),
]
