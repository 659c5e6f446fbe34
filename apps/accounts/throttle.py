"""Login throttling, per client address and per account, in Django's cache (Redis in the full
stack, so every web process shares the counts; this process's memory when embedded).

A failed login counts against the address it came from and the username it tried, for
RFTWEB_LOGIN_LOCKOUT_SECONDS from the first failure. When either count reaches its limit
(RFTWEB_LOGIN_FAILURES_PER_ADDRESS, RFTWEB_LOGIN_FAILURES_PER_ACCOUNT) that address or account is
locked for RFTWEB_LOGIN_LOCKOUT_SECONDS: every login from it or to it is refused without looking
at the password, the right one included, so guessing on gains nothing. A successful login clears
its account's count, not its address's: logging in to one's own account must not reset the count
of guesses made at others from the same address.

The address is the connection's (REMOTE_ADDR): behind a proxy, run daphne with --proxy-headers so
it is the client's. An IPv6 client counts by its /64, which one machine usually has whole.
"""

import hashlib
import ipaddress
import math
import time

from django.conf import settings
from django.core.cache import cache

PREFIX = "login-throttle"


def _counters(request, username: str) -> list[tuple[str, int]]:
    """(cache key, limit) of the client's address and of the account."""
    account = hashlib.sha256(username.casefold().encode()).hexdigest()  # any text makes a safe key
    return [
        (f"{PREFIX}:address:{_address(request)}", settings.RFTWEB_LOGIN_FAILURES_PER_ADDRESS),
        (f"{PREFIX}:account:{account}", settings.RFTWEB_LOGIN_FAILURES_PER_ACCOUNT),
    ]


def _address(request) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


def locked_until(request, username: str) -> float | None:
    """When the lock on the client's address or on the account ends (a Unix time), or None."""
    ends = cache.get_many([f"{key}:lock" for key, _ in _counters(request, username)]).values()
    return max(ends, default=None)


def lockout_message(until: float) -> str:
    minutes = max(1, math.ceil((until - time.time()) / 60))
    return (
        "Too many failed logins from this address or for this account: logging in is locked for "
        f"{minutes} more minute{'s' if minutes != 1 else ''}, even with the right password."
    )


def failed(request, username: str) -> None:
    window = settings.RFTWEB_LOGIN_LOCKOUT_SECONDS
    for key, limit in _counters(request, username):
        cache.add(key, 0, timeout=window)  # the window starts at the first failure
        try:
            count = cache.incr(key)
        except ValueError:  # the window ended between the two calls
            cache.add(key, 1, timeout=window)
            count = 1
        if count >= limit:
            cache.set(f"{key}:lock", time.time() + window, timeout=window)


def succeeded(request, username: str) -> None:
    account_key, _ = _counters(request, username)[1]
    cache.delete(account_key)
