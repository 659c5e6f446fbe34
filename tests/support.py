"""What test modules share: the environment of the processes they start (Celery workers, daphne,
beat) on the test database and Redis, and polling for a condition."""
import os
import time


def service_env(**overrides) -> dict:
    """os.environ plus what a started process needs to reach this test's database, Redis and data dir."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "rftweb.test_settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "RFTWEB_DATA_DIR": str(settings.DATA_DIR),
        "RFTWEB_HEARTBEAT_INTERVAL": str(settings.RFTWEB_HEARTBEAT_INTERVAL),
        "RFTWEB_HEARTBEAT_TIMEOUT": str(settings.RFTWEB_HEARTBEAT_TIMEOUT),
        **overrides,
    }


def wait_for(predicate, timeout=300, what="condition", every=0.5):
    """The predicate's first truthy value, polled every `every` seconds; fails after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def websocket_connects(path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the real ASGI app accepts a websocket handshake at `path` with these headers."""
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from rftweb.asgi import application

    async def scenario():
        ws = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await ws.connect(timeout=10)
        if connected:
            await ws.disconnect()
        return connected

    return async_to_sync(scenario)()
