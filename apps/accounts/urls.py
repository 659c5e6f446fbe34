from django.contrib.auth import views as auth_views
from django.urls import path

from . import views_people
from .forms import LoginForm
from .views import ThrottledPasswordChangeView

# The password change views require a login (LoginRequiredMiddleware, and the views themselves).
# A new password also revokes the user's API token (it deletes the secret the token is a MAC of) and
# closes the user's open websockets (apps.accounts.revocation). Logins and the old password of a
# password change are throttled (.throttle).
urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="accounts/login.html", authentication_form=LoginForm),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password_change/",
        ThrottledPasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html"),
        name="password_change_done",
    ),
    path("people/", views_people.people, name="people"),
    path("people/<int:pk>/", views_people.person_detail, name="person-detail"),
    path("people/<int:pk>/roles/", views_people.person_roles, name="person-roles"),
    path("people/<int:pk>/runs/", views_people.person_assign, name="person-assign"),
    path("people/<int:pk>/unlock/", views_people.person_unlock, name="person-unlock"),
]
