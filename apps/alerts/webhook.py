"""POST an alert's JSON to a URL a user set: http(s) only, no redirects followed, a 10 s timeout,
and (unless RFTWEB_WEBHOOK_PRIVATE) never to a loopback, private or link-local address: the URL is
typed by a user and fetched by the server, which must not become their way into the internal
network (a metadata service at 169.254.169.254, the database's host). The address is checked as
it resolves just before the request; a name that resolves differently a moment later (DNS
rebinding) is not caught, which an egress firewall is for. An IPv6 address that carries an IPv4 one
(mapped, 6to4, Teredo, NAT64) is judged by that IPv4 address too: 2002:7f00:1:: is 127.0.0.1 to a
6to4 relay, yet ipaddress calls it global."""

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


# NAT64 prefixes (RFC 6052 well-known, RFC 8215 local-use): 64:ff9b::a00:1 reaches 10.0.0.1 through
# the translator, and ipaddress (3.11) calls both global.
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d; :: and ::1 are refused as they are


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for on the way (a relay or translator may deliver
    to them), [] for a plain IPv6 address."""
    found = [four for four in (ip.ipv4_mapped, ip.sixtofour) if four]
    found += list(ip.teredo or ())  # (server, client)
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64_WELL_KNOWN or ip in _IPV4_COMPATIBLE:
        found.append(low32)
    elif ip in _NAT64_LOCAL_USE:
        # the site picks the prefix length: a /96 puts the IPv4 address in the low 32 bits; a /48 in
        # bits 48-63 and 72-87 (RFC 6052 2.2, skipping the u octet) with the low 40 bits zero
        bits = int(ip)
        as_48 = ipaddress.IPv4Address(((bits >> 64) & 0xFFFF) << 16 | (bits >> 40) & 0xFFFF)
        found.append(as_48 if bits & (2**40 - 1) == 0 else low32)
    return found


def private_reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `ip` is not a public address (naming the IPv4 address it carries, if that is why), or None."""
    if ip.version == 6:
        for four in embedded_ipv4(ip):
            if not four.is_global:
                return f"{ip}, which carries {four}"
    return None if ip.is_global else str(ip)


def address_problem(url: str) -> str | None:
    """Why the server will not post to `url`, or None."""
    try:
        parts = urlsplit(url)
    except ValueError as err:  # an unclosed [ of an IPv6 host
        return f"is not a URL ({err})"
    try:
        port = parts.port
    except ValueError:  # Django's URLField lets http://example.com:99999/ by; .port raises on it
        return f"has port {parts.netloc.rpartition(':')[2]}: a port is a number from 0 to 65535"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http or https URL"
    if settings.RFTWEB_WEBHOOK_PRIVATE:
        return None
    try:
        found = {info[4][0] for info in socket.getaddrinfo(parts.hostname, port or 443, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError) as err:
        return f"{parts.hostname} does not resolve ({err})"
    for address in sorted(found):
        reason = private_reason(ipaddress.ip_address(address.split("%")[0]))
        if reason:
            return (f"{parts.hostname} is a private address ({reason}); a server's admin allows those with "
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
