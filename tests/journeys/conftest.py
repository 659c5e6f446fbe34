"""Journeys drive the real product as a person does: the browser fixtures of tests/e2e serve them too."""
import pytest

from tests.e2e.conftest import (  # noqa: F401 (fixtures and the report hook they rely on)
    asgi_server,
    asgi_server_log,
    browser,
    login,
    page,
    page_errors,
    pytest_runtest_makereport,
)
from tests.support import Stack


@pytest.fixture
def stack(tmp_path):
    """stack(**env): a Stack of Celery processes for the test (any number); all killed at its end."""
    from rftweb.celery import app

    app.control.purge()
    stacks = []

    def make(**env):
        stacks.append(Stack(tmp_path, **env))
        return stacks[-1]

    yield make
    for made in stacks:
        made.stop()
