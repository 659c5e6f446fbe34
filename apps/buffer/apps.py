from django.apps import AppConfig


class BufferConfig(AppConfig):
    name = "apps.buffer"
    label = "buffer"

    def ready(self):
        # Job types register where they are defined (apps.core.jobs.register); CoreConfig imports
        # every app's services module, and retention's job type lives in a module of its own.
        from . import retention  # noqa: F401
