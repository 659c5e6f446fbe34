"""Issue #30, medium finding 8: logins are throttled per client address and per account. After
the limit of failures, every login there is refused with a message saying so, the right password
included, until the window has passed. (Through the real server: test_round3_web_server.py.)"""
import html
import time
import uuid

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users
DIDNT_MATCH = "Your username and password didn't match"
LOCKED = "Too many failed logins from this address or for this account"


@pytest.fixture(autouse=True)
def limits(settings):
    """Small limits, and a cache of this test's own."""
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": str(uuid.uuid4())}
    }
    settings.RFTWEB_LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.RFTWEB_LOGIN_FAILURES_PER_ADDRESS = 8
    settings.RFTWEB_LOGIN_LOCKOUT_SECONDS = 60
    return settings


def log_in(username, password, address="10.0.0.1", url=None):
    """The login page's answer, and whether it logged in."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(url or reverse("login"), {"username": username, "password": password})
    return html.unescape(response.content.decode()), client.session.get("_auth_user_id") is not None


def test_wrong_passwords_for_one_account_lock_it_even_for_the_right_one(researcher):
    # The probe's 150 guesses were all answered. These come from as many addresses, so that only
    # the account's own count can stop them.
    answers = [log_in("res", f"guess-{n}", address=f"10.0.0.{n}")[0] for n in range(50)]
    assert [DIDNT_MATCH in page for page in answers] == [True] * 5 + [False] * 45
    assert all(LOCKED in page for page in answers[5:])
    page, logged_in = log_in("res", PASSWORD, address="10.9.9.9")
    assert LOCKED in page and "locked for 1 more minute, even with the right password" in page and not logged_in


def test_wrong_passwords_from_one_address_lock_that_address(researcher):
    for n in range(8):  # a different account each time: only the address's count can stop them
        assert DIDNT_MATCH in log_in(f"user{n}", "guess")[0]
    page, logged_in = log_in("res", PASSWORD)
    assert LOCKED in page and not logged_in
    assert log_in("res", PASSWORD, address="10.0.0.2")[1]  # another address is not locked


def test_an_ipv6_client_counts_by_its_64(researcher):
    for n in range(8):
        log_in(f"user{n}", "guess", address=f"2001:db8::{n + 1}")
    assert LOCKED in log_in("res", PASSWORD, address="2001:db8::ffff:1")[0]
    assert log_in("res", PASSWORD, address="2001:db8:0:1::1")[1]  # the next /64


def test_the_lock_ends_after_the_window(researcher, limits):
    limits.RFTWEB_LOGIN_LOCKOUT_SECONDS = 1
    for _ in range(5):
        log_in("res", "guess")
    assert not log_in("res", PASSWORD)[1]
    time.sleep(1.2)
    assert log_in("res", PASSWORD)[1]


def test_a_successful_login_clears_the_accounts_count(researcher):
    for _ in range(2):
        for n in range(4):
            log_in("res", "guess", address=f"10.1.0.{n}")
        assert log_in("res", PASSWORD, address="10.1.1.1")[1]


def test_the_admin_login_is_throttled_too(curator):
    admin_login = reverse("admin:login")
    for _ in range(5):
        assert not log_in("cur", "guess", url=admin_login)[1]
    page, logged_in = log_in("cur", PASSWORD, url=admin_login)
    assert LOCKED in page and not logged_in


def test_a_curator_sees_a_locked_account_on_its_people_page_and_unlocks_it(researcher, curator):
    """A walkthrough: a person locked out after 10 failed logins waited 15 minutes, the right
    password refused, and the People page said nothing of it."""
    for n in range(5):
        log_in("res", f"guess-{n}", address=f"10.0.1.{n}")
    assert LOCKED in log_in("res", PASSWORD, address="10.0.2.1")[0]
    client = Client()
    client.force_login(curator)
    page = html.unescape(client.get(reverse("person-detail", args=[researcher.pk])).content.decode())
    assert 'id="person-locked"' in page and "5 failed logins for this account" in page
    unlocked = client.post(reverse("person-unlock", args=[researcher.pk]), follow=True).content.decode()
    assert "<bdi>res</bdi> may log in again" in html.unescape(unlocked) and 'id="person-locked"' not in unlocked
    page, logged_in = log_in("res", PASSWORD, address="10.0.2.1")
    assert logged_in
