from apps.runs.routing import websocket_urlpatterns as run_routes

websocket_urlpatterns = [*run_routes]
