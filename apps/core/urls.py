from django.urls import path

from . import views

urlpatterns = [path("<str:label>/<int:pk>/progress.json", views.job_progress, name="job-progress")]
