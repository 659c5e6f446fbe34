import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

app = Celery("rftweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # apps/*/tasks.py
app.autodiscover_tasks(["workers"])  # workers/tasks.py
