import asyncio
import os
from urllib.parse import urlsplit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

import django  # noqa: E402
from django.apps import apps  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

# Django is set up before importing code that touches models, unless this process has set it up
# already: runserver (and `manage.py demo`, which starts the demo run's duty on a thread first) imports this
# module after its own setup, and setting up again configured logging again, whose dictConfig
# drops every handler of the root logger. A duty already serving lost its DutyLog so: the demo
# run's Logs panel stayed empty for the run's whole life (CI's embedded newcomer journey, under
# load, when the run's thread opened its log before the server loaded this module).
if not apps.ready:
    django.setup(set_prefix=False)  # what get_asgi_application() does, first
django_asgi_app = ASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.signals import request_finished  # noqa: E402
from django.db import connections  # noqa: E402
from django.http.request import is_same_domain, split_domain_port, validate_host  # noqa: E402
from django.urls import re_path  # noqa: E402

from apps.core.consumers import UnknownPathConsumer  # noqa: E402
from rftweb.routing import websocket_urlpatterns  # noqa: E402


def close_request_connections(**kwargs):
    """Under ASGI each HTTP request runs in a context of its own, and a connection kept open there
    outlives it: 20 busy dashboard users used up Postgres's 100 connections. Close the request's
    connections when it ends. Websocket consumers (no request_finished) keep sharing theirs, so a
    burst of 100 page loads does not open 200 connections within daphne's handshake limit."""
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


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(text: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin like `https://example.com:8443`, or None if it is none."""
    try:
        parts = urlsplit(text)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port that is not a number, or out of range
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.username:
        return None
    return parts.scheme, parts.hostname, port


class SameOriginWebsockets:
    """A websocket is accepted only from a page of this server, as CSRF protects forms: its
    Origin must have the scheme, host and port the request came to (its Host header, which must be
    in ALLOWED_HOSTS; https when the socket is wss or the proxy header of SECURE_PROXY_SSL_HEADER
    says so), or be one of CSRF_TRUSTED_ORIGINS. Anything else, a missing Origin or Host
    included, is refused at the handshake (403). channels' AllowedHostsOriginValidator compared the
    host alone, so a page on another port or scheme of the same host could open sockets."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if self.same_origin(scope):
            return await self.app(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    @staticmethod
    def same_origin(scope) -> bool:
        headers = {name.decode("latin1").lower(): value.decode("latin1") for name, value in scope.get("headers", [])}
        origin = _origin(headers.get("origin", ""))
        if origin is None:
            return False
        if any(_trusted(origin, pattern) for pattern in settings.CSRF_TRUSTED_ORIGINS):
            return True
        host = headers.get("host", "")
        domain, _ = split_domain_port(host)
        # Django's own default with DEBUG on and no ALLOWED_HOSTS.
        allowed_hosts = settings.ALLOWED_HOSTS or ([".localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else [])
        if not domain or not validate_host(domain, allowed_hosts):
            return False
        return origin == _origin(f"{'https' if _secure(scope, headers) else 'http'}://{host}")


def _secure(scope, headers: dict) -> bool:
    """Whether the page that opens the socket was served over TLS (by us, or by the proxy)."""
    if scope.get("scheme") == "wss":
        return True
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:  # ("HTTP_X_FORWARDED_PROTO", "https"): the header's WSGI name, and the value
        name, value = proxy_header
        return headers.get(name.removeprefix("HTTP_").replace("_", "-").lower(), "").split(",")[0].strip() == value
    return False


def _trusted(origin: tuple[str, str, int], pattern: str) -> bool:
    """An origin matches a CSRF_TRUSTED_ORIGINS entry as Django's CSRF check matches it: scheme,
    host and port, where `https://*.example.com` takes every subdomain."""
    wildcard = "://*." in pattern
    trusted = _origin(pattern.replace("://*.", "://", 1))
    if trusted is None:
        return False
    (scheme, host, port), (t_scheme, t_host, t_port) = origin, trusted
    same_host = is_same_domain(host, "." + t_host) if wildcard else host == t_host
    return scheme == t_scheme and port == t_port and same_host


def close_oversized_messages_with_4009():
    """daphne's autobahn fails a websocket message over the server's limit (daphne's
    --websocket-max-message-size, 1 MiB by default; it never reaches a consumer) by dropping the
    TCP connection: the page saw no close code at all. Close it as a consumer closes a message
    over its own, smaller limit instead: a closing handshake with CLOSE_MESSAGE_TOO_BIG (4009).
    autobahn still reads nothing more of the message into memory."""
    from daphne.ws_protocol import WebSocketProtocol

    from apps.core.consumers import CLOSE_MESSAGE_TOO_BIG

    def close_too_big(protocol, message_size, limit, reason):
        protocol.failByDrop = False  # autobahn's own option: send a close frame rather than drop
        protocol._fail_connection(CLOSE_MESSAGE_TOO_BIG, "message too big")

    WebSocketProtocol._max_message_size_exceeded = close_too_big


close_oversized_messages_with_4009()

MAX_CONCURRENT_REQUESTS = int(os.environ.get("RFTWEB_MAX_CONCURRENT_REQUESTS", "16"))

application = ProtocolTypeRouter(
    {
        "http": HttpConcurrencyLimit(django_asgi_app, MAX_CONCURRENT_REQUESTS),
        # Last, any other path: URLRouter raises ValueError for a path it cannot route (a 500).
        "websocket": SameOriginWebsockets(AuthMiddlewareStack(URLRouter(
            [*websocket_urlpatterns, re_path(r"", UnknownPathConsumer.as_asgi())]
        ))),
    }
)
