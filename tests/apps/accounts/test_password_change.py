"""Issue #20, finding 7: every user changes their own password, and that revokes their API token."""
import pytest
from django.urls import reverse

from apps.runs.api import token_for, user_for_token

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users
NEW_PASSWORD = "a-new-passphrase-456"

pytestmark = pytest.mark.django_db


def change(client, old: str, new: str, again: str | None = None):
    return client.post(
        reverse("password_change"),
        {"old_password": old, "new_password1": new, "new_password2": again or new},
    )


def test_the_header_links_to_the_password_change_page_which_asks_for_the_old_and_new_password(client, annotator):
    client.force_login(annotator)
    home = client.get(reverse("home"), follow=True)
    assert f'href="{reverse("password_change")}"' in home.content.decode()
    page = client.get(reverse("password_change"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="old_password"' in html and 'name="new_password1"' in html and 'name="new_password2"' in html


def test_anonymous_users_are_sent_to_login(client):
    response = client.get(reverse("password_change"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_changing_the_password_revokes_the_api_token_and_keeps_the_session(client, researcher):
    client.force_login(researcher)
    old_token = token_for(researcher)
    assert client.get(reverse("api-runs"), HTTP_AUTHORIZATION=f"Bearer {old_token}").status_code == 200

    response = change(client, PASSWORD, NEW_PASSWORD)
    assert response.status_code == 302 and response["Location"] == reverse("password_change_done")

    researcher.refresh_from_db()
    assert researcher.check_password(NEW_PASSWORD)
    assert user_for_token(old_token) is None
    anonymous = client.__class__()
    assert anonymous.get(reverse("api-runs"), HTTP_AUTHORIZATION=f"Bearer {old_token}").status_code == 401
    assert user_for_token(token_for(researcher)) == researcher  # the new token works
    done = client.get(reverse("password_change_done"))  # still logged in
    assert done.status_code == 200 and "old API token no longer works" in done.content.decode()


@pytest.mark.parametrize(
    "old, new, again, words",
    [
        ("wrong-password", NEW_PASSWORD, None, "old password was entered incorrectly"),
        (PASSWORD, NEW_PASSWORD, "something-else-789", "didn’t match"),
        (PASSWORD, "short", None, "too short"),
    ],
)
def test_a_refused_change_names_the_problem_and_changes_nothing(client, researcher, old, new, again, words):
    client.force_login(researcher)
    token = token_for(researcher)
    response = change(client, old, new, again)
    assert response.status_code == 200 and words in response.content.decode(), response.content.decode()
    researcher.refresh_from_db()
    assert researcher.check_password(PASSWORD) and user_for_token(token) == researcher
