"""An API token lives until its user changes their password, and no longer dies when Django only
rewrites the stored hash: a login upgrades a hash made with fewer PBKDF2 iterations than the
settings' (every Django upgrade raises them), and the token, an HMAC over the hash, was revoked
with it, silently, for every script."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for, user_for_token

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users
NEW_PASSWORD = "a-new-passphrase-456"


def answers(token: str) -> int:
    return Client().get(reverse("api-runs"), HTTP_AUTHORIZATION=f"Bearer {token}").status_code


@pytest.fixture
def pbkdf2(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]


def test_a_token_survives_the_hash_upgrade_of_a_login(pbkdf2, researcher):
    hasher = PBKDF2PasswordHasher()
    weaker = hasher.encode(PASSWORD, hasher.salt(), iterations=hasher.iterations // 10)
    get_user_model().objects.filter(pk=researcher.pk).update(password=weaker)
    researcher.refresh_from_db()
    token = token_for(researcher)
    assert answers(token) == 200

    login = Client().post(reverse("login"), {"username": researcher.username, "password": PASSWORD})
    assert login.status_code == 302, "the login page logged in"
    researcher.refresh_from_db()
    assert researcher.password != weaker and hasher.decode(researcher.password)["iterations"] == hasher.iterations
    assert answers(token) == 200 and token_for(researcher) == token


def test_set_password_revokes_the_token(researcher):
    token = token_for(researcher)
    researcher.set_password(NEW_PASSWORD)
    researcher.save()
    assert answers(token) == 401
    assert token_for(researcher) != token and answers(token_for(researcher)) == 200


def test_the_password_change_page_revokes_the_token(researcher):
    token = token_for(researcher)
    client = Client()
    client.force_login(researcher)
    changed = client.post(reverse("password_change"), {
        "old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert changed.status_code == 302
    assert user_for_token(token) is None and answers(token) == 401


def test_a_save_that_changes_no_password_keeps_the_token(researcher):
    token = token_for(researcher)
    researcher.first_name = "Ada"
    researcher.save()
    researcher.save(update_fields=["last_login"])
    assert answers(token) == 200


def test_the_token_keeps_its_spelling(researcher):
    token = token_for(researcher)
    prefix, user_id, mac = token.split("_")
    assert (prefix, user_id, len(mac)) == ("rft", str(researcher.pk), 64) and token_for(researcher) == token
