from django.urls import path

from . import views

urlpatterns = [
    path("", views.alert_settings, name="alert-settings"),
    path("test/", views.test_alert, name="alert-test"),
    path("secret/", views.new_webhook_secret, name="alert-secret"),
]
