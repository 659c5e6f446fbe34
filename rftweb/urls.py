from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("apps.accounts.urls")),
    path("tasksets/", include("apps.tasksets.urls")),
    path("annotate/", include("apps.feedback.urls")),
    path("", include("apps.runs.urls")),
]
