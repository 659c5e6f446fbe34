from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    name = "apps.feedback"
    label = "feedback"

    def ready(self):
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed, post_save

        from . import signals

        # A person who loses access lets go of the items they held (services.release_lost_locks).
        user_model = get_user_model()
        post_save.connect(signals.user_saved, sender=user_model, dispatch_uid="rftweb-feedback-user-saved")
        m2m_changed.connect(signals.groups_changed, sender=user_model.groups.through,
                            dispatch_uid="rftweb-feedback-groups")
