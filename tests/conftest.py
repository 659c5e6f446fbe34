import pytest

from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER


def _flush_test_redis():
    """Empty the tests' own Redis database (test_settings: /14). Celery tasks acks late, so a task
    held by a worker that a test killed stays "unacked" and Redis hands it out again after the
    visibility timeout (6 h): a serve_duty of an earlier session's run 3 would then serve this
    session's run 3, whose ids start again from 1. Queued tasks of a test that ended before a worker
    took them are dropped the same way."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


def pytest_sessionstart(session):
    import redis

    try:
        _flush_test_redis()
    except redis.exceptions.ConnectionError:
        pass  # the tests that need Redis say so themselves


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


@pytest.fixture
def celery_worker_factory(transactional_db, tmp_path):
    """Start real Celery worker processes on the test database and Redis; stop them at the end.

    Tests using it must be transactional (the worker sees only committed rows)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from rftweb.celery import app
    from tests.support import service_env

    env = service_env()
    _flush_test_redis()  # nothing left over from an earlier test
    started = []

    def start(queues="default,train,explore", pool="prefork"):
        name = f"test-{uuid.uuid4().hex[:8]}@localhost"
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-Q", queues, "-c", "1", "--pool", pool,
             "-n", name, "--without-gossip", "--without-mingle", "-l", "info"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        proc.log_path = tmp_path / f"{name}.log"
        proc.name = name  # its Celery hostname: what the Workers page and duty heartbeats call it
        started.append(proc)
        deadline = time.time() + 60
        while time.time() < deadline:
            if app.control.ping(destination=[name], timeout=0.5):
                return proc
            if proc.poll() is not None:
                break
        raise RuntimeError(f"celery worker did not start:\n{proc.log_path.read_text()}")

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
