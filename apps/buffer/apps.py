from django.apps import AppConfig


class BufferConfig(AppConfig):
    name = "apps.buffer"
    label = "buffer"

    def ready(self):
        # Job types register where they are defined (apps.core.jobs.register); CoreConfig imports
        # every app's services module; retention's and curation's job types live in modules of their own.
        from . import curation, retention  # noqa: F401
