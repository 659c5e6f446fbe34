from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    # Pages link the icon themselves; browsers still ask for /favicon.ico (the admin's pages, a
    # bookmark), before anyone logs in.
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
        name="favicon",
    ),
    path("admin/", admin.site.urls),
    path("accounts/", include("apps.accounts.urls")),
    path("tasksets/", include("apps.tasksets.urls")),
    path("jobs/", include("apps.core.urls")),
    path("annotate/", include("apps.feedback.urls")),
    path("alerts/", include("apps.alerts.urls")),
    path("models/", include("apps.saved_models.urls")),
    path("", include("apps.runs.urls")),
]

# JSON under /api/, Django's pages elsewhere (rftweb/errors.py).
handler400 = "rftweb.errors.bad_request"
handler403 = "rftweb.errors.permission_denied"
handler404 = "rftweb.errors.page_not_found"
handler500 = "rftweb.errors.server_error"
