from django.apps import AppConfig


class SavedModelsConfig(AppConfig):
    name = "apps.saved_models"
    verbose_name = "Saved models"
