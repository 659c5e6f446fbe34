"""Test settings: real Postgres and Redis (the test command starts them), never the embedded default."""
import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@localhost:5432/rftweb")
os.environ.setdefault("REDIS_URL", "redis://localhost:6379/14")
os.environ.setdefault("RFTWEB_DATA_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "test"))
# Tests kill workers on purpose: notice a dead one in seconds, not minutes.
os.environ.setdefault("RFTWEB_HEARTBEAT_INTERVAL", "1")
os.environ.setdefault("RFTWEB_HEARTBEAT_TIMEOUT", "6")
# Tests open event loops and threads by the hundred; a connection kept by each would pile up to
# Postgres's max_connections (the load test's server sets the production default itself).
os.environ.setdefault("DB_CONN_MAX_AGE", "0")

from .settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
