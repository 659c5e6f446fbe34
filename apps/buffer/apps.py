from django.apps import AppConfig


class BufferConfig(AppConfig):
    name = "apps.buffer"
    label = "buffer"

    def ready(self):
        # Job types register where they are defined (apps.core.jobs.register); CoreConfig imports
        # every app's services module; retention's, curation's and the expert data import's job types
        # live in modules of their own.
        from . import curation, expert_import, retention  # noqa: F401
