"""Journeys drive the real product as a person does: the browser fixtures of tests/e2e serve them too."""
from tests.e2e.conftest import (  # noqa: F401 (fixtures and the report hook they rely on)
    asgi_server,
    asgi_server_log,
    browser,
    login,
    page,
    page_errors,
    pytest_runtest_makereport,
)
