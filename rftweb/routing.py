from apps.core.routing import websocket_urlpatterns as job_routes
from apps.feedback.routing import websocket_urlpatterns as annotate_routes
from apps.runs.routing import websocket_urlpatterns as run_routes

websocket_urlpatterns = [*run_routes, *annotate_routes, *job_routes]
