"""Login throttling, per client address and per account, in Django's cache (Redis in the full
stack, so every web process shares the counts; this process's memory when embedded).

A failed login counts against the address it came from and the username it tried, for
RFTWEB_LOGIN_LOCKOUT_SECONDS from the first failure. When either count reaches its limit
(RFTWEB_LOGIN_FAILURES_PER_ADDRESS, RFTWEB_LOGIN_FAILURES_PER_ACCOUNT) that address or account is
locked for RFTWEB_LOGIN_LOCKOUT_SECONDS: every login from it or to it is refused without looking
at the password, the right one included, so guessing on gains nothing. A successful login clears
its account's count, not its address's: logging in to one's own account must not reset the count
of guesses made at others from the same address.

The old password a password change asks for is a guess like a login's (a stolen session must
not try passwords unthrottled, then lock its owner out): it counts and is refused the same way
(forms.ThrottledPasswordChangeForm).

An attempt is counted *before* its password is checked (`attempt`), in one atomic increment of
each count (Redis INCR; the in-process cache's lock when embedded), and only the attempts whose
count is within the limit reach the password. Checked first and counted after, 40 parallel logins
had 33 wrong passwords checked against a limit of 10, then the right one accepted (#41, finding 9).
A right password gives its attempt back (`succeeded`). django-axes, the usual library, checks first
and counts after, and lists the same race as a known issue it will not fix (jazzband/django-axes
#592); so this stays our own, 100 lines.

An account counts by its username exactly as Django looks it up (case-sensitive, NFKC-normalized
by the login form): `Victim7` and `victim7` are two accounts, and guesses at one lock only that one.

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
    return [
        (f"{PREFIX}:address:{_address(request)}", settings.RFTWEB_LOGIN_FAILURES_PER_ADDRESS),
        (_account_key(username), settings.RFTWEB_LOGIN_FAILURES_PER_ACCOUNT),
    ]


def _account_key(username: str) -> str:
    return f"{PREFIX}:account:{hashlib.sha256(username.encode()).hexdigest()}"  # any text makes a safe key


def account_lock(username: str) -> tuple[int, float | None]:
    """(failed logins counted, when the account's lock ends or None) for the People page; an
    address's lock is the address's, not the person's."""
    key = _account_key(username)
    found = cache.get_many([key, f"{key}:lock"])
    return found.get(key) or 0, found.get(f"{key}:lock")


def unlock_account(username: str) -> None:
    """A curator lets the person log in again at once: the account's count and lock go (locked,
    they waited out RFTWEB_LOGIN_LOCKOUT_SECONDS, the right password refused)."""
    key = _account_key(username)
    cache.delete_many([key, f"{key}:lock"])


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


def lockout_message(until: float, locked: str = "logging in") -> str:
    minutes = max(1, math.ceil((until - time.time()) / 60))
    return (
        f"Too many failed logins from this address or for this account: {locked} is locked for "
        f"{minutes} more minute{'s' if minutes != 1 else ''}, even with the right password."
    )


def attempt(request, username: str) -> float | None:
    """Count an attempt at `username`'s password from the client's address before it is checked.
    Returns None when the password may be checked, or when the lock ends (a Unix time) when it
    may not: the address or account is locked, or this attempt is beyond a limit (it then locks)."""
    if until := locked_until(request, username):
        return until
    window, until = settings.RFTWEB_LOGIN_LOCKOUT_SECONDS, None
    for key, limit in _counters(request, username):
        if _count(key, window) > limit:
            until = time.time() + window
            cache.add(f"{key}:lock", until, timeout=window)  # the first over the limit sets the lock
    return until


def failed(request, username: str) -> None:
    """The attempt's password was wrong: a count that reached its limit locks."""
    window = settings.RFTWEB_LOGIN_LOCKOUT_SECONDS
    for key, limit in _counters(request, username):
        if (cache.get(key) or 0) >= limit:
            cache.add(f"{key}:lock", time.time() + window, timeout=window)


def succeeded(request, username: str) -> None:
    """The attempt's password was right: the account's count starts again, and the address gets
    this attempt back (a login to one's own account must neither reset nor use up the address's
    count of guesses at others)."""
    (address_key, _), (account_key, _) = _counters(request, username)
    cache.delete(account_key)
    try:
        cache.decr(address_key)
    except ValueError:  # the window ended meanwhile
        pass


def _count(key: str, window: int) -> int:
    """The count at `key` after one more, atomically; the window starts at the first."""
    cache.add(key, 0, timeout=window)
    try:
        return cache.incr(key)
    except ValueError:  # the window ended between the two calls
        cache.add(key, 1, timeout=window)
        return 1
