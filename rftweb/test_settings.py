"""Test settings: real Postgres and Redis (the test command starts them), never the embedded default."""
import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@localhost:5432/rftweb")
os.environ.setdefault("REDIS_URL", "redis://localhost:6379/14")
os.environ.setdefault("RFTWEB_DATA_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "test"))
# Tests kill workers on purpose: notice a dead one in seconds, not minutes.
os.environ.setdefault("RFTWEB_HEARTBEAT_INTERVAL", "1")
os.environ.setdefault("RFTWEB_HEARTBEAT_TIMEOUT", "6")

from .settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Close each connection after use: websocket tests run database calls on executor threads that
# die with their event loop, and kept-alive connections there would pile up to max_connections.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
