from django.urls import path

from .consumers import AnnotateConsumer

websocket_urlpatterns = [path("ws/annotate/<int:run_id>/", AnnotateConsumer.as_asgi())]
