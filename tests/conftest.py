import pytest

from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER


def _make_user(django_user_model, username, *roles, **extra):
    from apps.accounts.services import create_user

    return create_user(username, "pw-for-tests-123", roles=roles, **extra)


@pytest.fixture
def annotator(db, django_user_model):
    return _make_user(django_user_model, "ann", ANNOTATOR)


@pytest.fixture
def researcher(db, django_user_model):
    return _make_user(django_user_model, "res", RESEARCHER)


@pytest.fixture
def curator(db, django_user_model):
    return _make_user(django_user_model, "cur", CURATOR)


@pytest.fixture
def researcher_client(client, researcher):
    client.force_login(researcher)
    return client


@pytest.fixture
def annotator_client(client, annotator):
    client.force_login(annotator)
    return client
