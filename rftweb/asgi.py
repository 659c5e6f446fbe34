import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()  # before importing code that touches models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.signals import request_finished  # noqa: E402
from django.db import connections  # noqa: E402

from rftweb.routing import websocket_urlpatterns  # noqa: E402


def close_request_connections(**kwargs):
    """Under ASGI each HTTP request runs in a context of its own, and a connection kept open there
    outlives it: 20 busy dashboard users used up Postgres's 100 connections. Close the request's
    connections when it ends. Websocket consumers (no request_finished) keep sharing theirs, so a
    burst of 100 page loads does not open 200 connections within daphne's 5 s handshake limit."""
    connections.close_all()


# Only for requests the ASGI server handles (the test client's handler is another sender).
request_finished.connect(close_request_connections, sender=ASGIHandler, dispatch_uid="rftweb-close-request-connections")

class HttpConcurrencyLimit:
    """At most `limit` HTTP requests run at once; the rest wait in the event loop. Django runs each
    request's view in a thread of its own with a database connection of its own, so a burst of
    requests (200 annotators posting at once) would otherwise open more connections than Postgres
    allows and fail with 500s."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit
        self._semaphore = None  # made on first use, inside the server's event loop

    async def __call__(self, scope, receive, send):
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.limit)
        async with self._semaphore:
            await self.app(scope, receive, send)


MAX_CONCURRENT_REQUESTS = int(os.environ.get("RFTWEB_MAX_CONCURRENT_REQUESTS", "16"))

application = ProtocolTypeRouter(
    {
        "http": HttpConcurrencyLimit(django_asgi_app, MAX_CONCURRENT_REQUESTS),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
