"""Issue #41, findings 9-11: login counting is atomic (no race past the limit), a lockout is keyed
by the account as Django looks it up, and the old password of a password change is throttled as a
login's. Through the real middleware and the tests' Redis cache (test_settings: REDIS_URL)."""
import html
import threading
import time

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from tests.support import forget_login_failures

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users
DIDNT_MATCH = "Your username and password didn't match"
LOCKED = "Too many failed logins from this address or for this account"
ACCOUNT_LIMIT = 10  # settings' default: RFTWEB_LOGIN_FAILURES_PER_ACCOUNT


@pytest.fixture(autouse=True)
def clean_counts(settings):
    settings.RFTWEB_LOGIN_FAILURES_PER_ACCOUNT = ACCOUNT_LIMIT
    settings.RFTWEB_LOGIN_FAILURES_PER_ADDRESS = 50
    settings.RFTWEB_LOGIN_LOCKOUT_SECONDS = 60
    forget_login_failures()
    yield
    forget_login_failures()


@pytest.fixture
def slow_password_checks(monkeypatch):
    """A password check that takes as long as a real hasher's (PBKDF2 with Django's iterations:
    ~0.3 s here), so that parallel logins overlap while their passwords are checked, as they do in
    production; the tests' MD5 hasher alone returns before the next thread starts. Counts checks."""
    checked = []
    verify = MD5PasswordHasher.verify

    def slow_verify(self, password, encoded):
        checked.append(password)
        time.sleep(0.2)
        return verify(self, password, encoded)

    monkeypatch.setattr(MD5PasswordHasher, "verify", slow_verify)
    return checked


def make_user(django_user_model, username):
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username, password=PASSWORD)
    user.groups.add(Group.objects.get_or_create(name=RESEARCHER)[0])
    return user


def log_in(username, password, address="10.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    response = client.post(reverse("login"), {"username": username, "password": password})
    return html.unescape(response.content.decode()), client.session.get("_auth_user_id") is not None


@pytest.mark.django_db(transaction=True)
def test_forty_parallel_logins_check_no_more_passwords_than_the_limit(django_user_model, slow_password_checks):
    """Finding 9: 40 parallel logins had 33 wrong passwords checked, then the right one accepted."""
    make_user(django_user_model, "victim9")
    answers = []
    start = threading.Barrier(40)

    def guess(n):
        start.wait()
        answers.append(log_in("victim9", f"guess-{n}", address=f"10.9.{n}.1"))

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(slow_password_checks) <= ACCOUNT_LIMIT, f"{len(slow_password_checks)} passwords checked"
    assert sum(DIDNT_MATCH in text for text, _ in answers) == len(slow_password_checks)
    assert sum(LOCKED in text for text, _ in answers) == 40 - len(slow_password_checks)
    text, logged_in = log_in("victim9", PASSWORD, address="10.9.99.1")
    assert not logged_in and LOCKED in text


@pytest.mark.django_db
def test_failures_on_one_account_do_not_lock_an_account_whose_name_differs_in_case(django_user_model):
    """Finding 10: 10 failures on `Victim7` locked the separate account `victim7`."""
    make_user(django_user_model, "Victim7")
    make_user(django_user_model, "victim7")
    for n in range(ACCOUNT_LIMIT):
        log_in("Victim7", f"wrong-{n}", address=f"10.7.{n}.1")
    text, logged_in = log_in("Victim7", PASSWORD, address="10.7.50.1")
    assert not logged_in and LOCKED in text
    text, logged_in = log_in("victim7", PASSWORD, address="10.7.51.1")
    assert logged_in, text


@pytest.mark.django_db
def test_a_right_password_neither_uses_up_nor_resets_the_addresss_count(django_user_model, settings):
    settings.RFTWEB_LOGIN_FAILURES_PER_ADDRESS = 3
    make_user(django_user_model, "own")
    for _ in range(5):  # logging in to one's own account, again and again, costs the address nothing
        assert log_in("own", PASSWORD)[1]
    for n in range(3):
        log_in("someone-else", f"wrong-{n}")
    text, logged_in = log_in("own", PASSWORD)
    assert not logged_in and LOCKED in text


def change_password(client, old):
    response = client.post(
        reverse("password_change"),
        {"old_password": old, "new_password1": "a-new-passphrase-456", "new_password2": "a-new-passphrase-456"},
    )
    return response.status_code, html.unescape(response.content.decode())


@pytest.mark.django_db
def test_wrong_old_passwords_lock_the_password_change_even_for_the_right_one(researcher):
    """Finding 11: 30 wrong old passwords were all answered."""
    client = Client(REMOTE_ADDR="10.11.0.1")
    client.force_login(researcher)
    answers = [change_password(client, f"wrong-{n}") for n in range(30)]
    assert sum("old password was entered incorrectly" in text for _, text in answers) == ACCOUNT_LIMIT
    locked = [text for _, text in answers[ACCOUNT_LIMIT:]]
    assert all("changing the password is locked" in text for text in locked), locked[0]
    status, text = change_password(client, PASSWORD)
    assert status == 200 and "changing the password is locked" in text
    researcher.refresh_from_db()
    assert researcher.check_password(PASSWORD)
    # The lock is the account's: logging in is refused too, even with the right password.
    assert not log_in(researcher.username, PASSWORD, address="10.11.0.2")[1]


@pytest.mark.django_db
def test_the_admins_password_change_link_leads_to_the_throttled_page(client, curator):
    client.force_login(curator)
    response = client.get(reverse("admin:password_change"))
    assert response.status_code == 302 and response["Location"] == reverse("password_change")
