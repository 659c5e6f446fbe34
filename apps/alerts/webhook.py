"""POST an alert's JSON to a URL a user set: http(s) only, no redirects followed, a 10 s timeout,
and (unless RFTWEB_WEBHOOK_PRIVATE) never to a loopback, private or link-local address: the URL is
typed by a user and fetched by the server, which must not become their way into the internal
network (a metadata service at 169.254.169.254, the database's host). The address is checked as
it resolves just before the request; a name that resolves differently a moment later (DNS
rebinding) is not caught, which an egress firewall is for."""

import hashlib
import hmac
import ipaddress
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from django.conf import settings

TIMEOUT_S = 10


class WebhookError(Exception):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx is raised as an HTTPError: a redirect could point anywhere


def address_problem(url: str) -> str | None:
    """Why the server will not post to `url`, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http or https URL"
    if settings.RFTWEB_WEBHOOK_PRIVATE:
        return None
    try:
        found = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError) as err:
        return f"{parts.hostname} does not resolve ({err})"
    for address in found:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not ip.is_global:
            return (f"{parts.hostname} is a private address ({ip}); a server's admin allows those with "
                    "RFTWEB_WEBHOOK_PRIVATE=1")
    return None


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post(url: str, body: bytes, *, secret: str, event: str) -> None:
    problem = address_problem(url)
    if problem:
        raise WebhookError(f"not sent: {problem}")
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "rftweb-alerts", "X-Rftweb-Event": event,
        **({"X-Rftweb-Signature": signature(secret, body)} if secret else {}),
    })
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(request, timeout=TIMEOUT_S) as answer:
            answer.read(1024)
    except urllib.error.HTTPError as err:
        raise WebhookError(f"{url} answered {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise WebhookError(f"{url} could not be reached: {getattr(err, 'reason', err)}") from None
