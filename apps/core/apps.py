from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class CoreConfig(AppConfig):
    """What the other apps share: the job framework, the file readers, the websocket base, the
    admin's paginator."""

    name = "apps.core"
    label = "core"

    def ready(self):
        # Job types register themselves in their app's services module (jobs.register); import
        # them all, as the admin autodiscovers admin.py, so a worker knows every type it may be sent.
        autodiscover_modules("services")
