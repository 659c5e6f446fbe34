from django.urls import path

from . import views

urlpatterns = [
    path("", views.model_list, name="model-list"),
    path("save/<int:run>/<int:version>/", views.model_save, name="model-save"),
    path("<str:name>/", views.model_detail, name="model-detail"),
    path("<str:name>/rename/", views.model_rename, name="model-rename"),
    path("<str:name>/alias/", views.model_alias, name="model-alias"),
    path("<str:name>/download/", views.model_download, name="model-download"),
    path("<str:name>/delete/", views.model_delete, name="model-delete"),
]
