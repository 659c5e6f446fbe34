import pytest

from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER


def _engine() -> str:
    from django.conf import settings

    return settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]  # 'postgresql' | 'sqlite3'


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """On SQLite (`make test-sqlite`: the embedded demo's database), a test database in a file, as
    `make demo`'s: Django's default in-memory one shares one cache between connections, whose
    table locks fail a second thread's write at once ('database table is locked') instead of
    waiting out the settings' 30 s busy timeout. Named after DATABASE_URL's file as Postgres' test
    database is after its database (test_<name>): two sessions whose URLs name two files in one
    folder (/tmp/a.sqlite3, /tmp/b.sqlite3) each delete and create their own, not one shared file."""
    import os
    from pathlib import Path

    from django.conf import settings

    if _engine() == "sqlite3":
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # each xdist worker its own file
        test = settings.DATABASES["default"].setdefault("TEST", {})
        database = Path(settings.DATABASES["default"]["NAME"])
        test["NAME"] = str(database.with_name(f"test_{database.stem}{worker}{database.suffix}"))


def pytest_runtest_setup(item):
    """A `postgres` test checks what only the full stack's database has (full-text search, query
    plans, COPY, a second connection reading while another writes): skipped on SQLite, saying why."""
    marker = item.get_closest_marker("postgres")
    if marker is not None and _engine() == "sqlite3":
        pytest.skip(f"Postgres only: {marker.args[0] if marker.args else 'a feature SQLite lacks'}")


def _flush_test_redis():
    """Empty the tests' own Redis database (test_settings: /14; under xdist, this worker's own).
    Celery tasks acks late, so a task held by a worker that a test killed stays "unacked" and Redis
    hands it out again after the visibility timeout (6 h): a serve_duty of an earlier session's run
    3 would then serve this session's run 3, whose ids start again from 1. Queued tasks of a test
    that ended before a worker took them are dropped the same way."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


def _xdist_controller(config) -> bool:
    """Whether this process hands the tests out to xdist workers (and runs none itself)."""
    return config.pluginmanager.has_plugin("dsession")


def _share_the_cores():
    """On an xdist worker, this process's share of the cores for torch and OpenMP, inherited by the
    processes its tests start. Each torch process takes every core by default: two workers at 2
    threads each on 2 cores made OpenMP's barriers wait on a descheduled thread, and the MIX learning
    test took 901 s beside the LoRA one (CI timed it out at 900) where it takes ~250 s alone."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, share)
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(trylast=True)  # after xdist's, which makes this process the controller
def pytest_configure(config):
    if not _xdist_controller(config):
        _share_the_cores()
    if _xdist_controller(config):
        import os

        from django.conf import settings

        for name in getattr(settings, "TEST_WORKER_ENV", []):  # each worker sets its own
            os.environ.pop(name, None)


def pytest_sessionstart(session):
    import redis

    if _xdist_controller(session.config):
        return  # each worker empties its own database (the controller's settings name gw0's)
    try:
        _flush_test_redis()
    except redis.exceptions.ConnectionError:
        pass  # the tests that need Redis say so themselves


# -- pytest-xdist (`make test`: -n 2; --dist loadgroup in pytest.ini) -----------------------------
# xdist hands a worker one unit at a time: a whole file where it has slow tests or module-scoped
# fixtures (built once, on one worker, its tests in order), any other test alone. Each worker runs
# its units in pytest-django's order (database tests, then transactional ones, then the rest), the
# longest units of each kind first and the short single tests last, so that both workers finish at
# about the same time. Without xdist (no -n) none of this applies: the order is pytest-django's.

# Files whose rank processes meet through a store within seconds (join timeouts of 3-10 s): one
# after the other on one worker, never two groups of ranks starting at once. Two lanes, as each
# unit keeps to one of pytest-django's kinds: the engine's ranks (no database), and the ranks of
# runs on Celery workers (transactional).
TORCH_DISTRIBUTED, RUN_RANKS = "torch-distributed", "run-ranks"
LANES = {
    **dict.fromkeys([
        "tests/workers/rft/test_distributed.py",
        "tests/workers/rft/test_fsdp.py",
        "tests/workers/rft/test_weight_broadcast.py",
        "tests/workers/rft/test_sync_nccl.py",
    ], TORCH_DISTRIBUTED),
    **dict.fromkeys([
        "tests/workers/test_ddp_worker.py",
        "tests/security/test_round3_workers_rendezvous.py",
    ], RUN_RANKS),
}
# The longest units (minutes each on 2 cores), longest first (pytest-django's order comes first:
# these are three lists in one); then the others by their slow tests. `make test`'s --durations
# list shows the slowest tests when this needs updating.
LONGEST_FIRST = [  # seconds a file (a lane: its files) in CI's run of 2026-12-02 (2 workers, 28:51)
    TORCH_DISTRIBUTED,  # 575
    "tests/workers/test_explorers.py",  # 229
    "tests/journeys/test_recovery.py",  # 220
    "tests/workers/rft/test_option_matrix.py",  # 184
    "tests/journeys/test_newcomer.py",  # 168
    "tests/workers/rft/test_vllm.py",  # 163
    RUN_RANKS,  # 162+
    "tests/reliability/test_faults.py",  # 157
    "tests/workers/test_tasks.py",  # 153
    "tests/workers/rft/test_lora.py",  # 119
    "tests/apps/feedback/test_human_learning.py",  # 115
    "tests/workers/rft/test_learning.py",  # 105
    "tests/security/test_round3_workers_stop.py",  # 95
    "tests/journeys/test_annotator.py",
    "tests/workers/rft/test_frozenlake.py",
]


def _file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _has_module_fixture(item) -> bool:
    """Whether the test uses a module- or class-scoped fixture of this project (not a plugin's)."""
    infos = getattr(item, "_fixtureinfo", None)
    return infos is not None and any(
        defs and defs[-1].scope in ("module", "class") and defs[-1].baseid
        for defs in infos.name2fixturedefs.values()
    )


def _db_order(item) -> int:
    """pytest-django's order of a test: 0 database, 1 transactional database, 2 neither."""
    marker, names = item.get_closest_marker("django_db"), getattr(item, "fixturenames", ())
    if marker is not None and (marker.args[:1] == (True,) or marker.kwargs.get("transaction")
                               or marker.kwargs.get("reset_sequences")):
        return 1
    if "transactional_db" in names or "live_server" in names:
        return 1
    return 0 if marker is not None or "db" in names else 2


def _units(items) -> tuple[dict[tuple, list], dict[str, int]]:
    """{(unit, pytest-django's order): its items} (a single test's unit is its node id; a file's
    tests of each order are a unit: pytest-django runs them apart too), and each file's number of
    slow tests. The items of a file's or a lane's unit get its xdist_group."""
    slow: dict[str, int] = {}
    whole = set()
    for item in items:
        path = _file_of(item)
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)
        if slow[path] or _has_module_fixture(item):
            whole.add(path)
    units: dict[tuple, list] = {}
    for item in items:
        path = _file_of(item)
        unit = LANES.get(path) or (path if path in whole else item.nodeid)
        units.setdefault((unit, _db_order(item)), []).append(item)
    orders: dict[str, int] = {}
    for unit, _ in units:
        orders[unit] = orders.get(unit, 0) + 1
    for (unit, order), unit_items in units.items():
        if unit != unit_items[0].nodeid:
            name = unit.removeprefix("tests/").removesuffix(".py")
            if orders[unit] > 1:  # the file has tests of more than one order
                name += ("-db", "-transactional", "-nodb")[order]
            for item in unit_items:
                item.add_marker(pytest.mark.xdist_group(name))
    return units, slow


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers alone, with --dist loadgroup
        return (yield)
    grouped, slow = _units(items)  # before xdist's own hook, which reads the groups
    unit_of = {id(item): key for key, unit_items in grouped.items() for item in unit_items}
    singles = {key for key, unit_items in grouped.items() if key[0] == unit_items[0].nodeid}
    result = yield  # -m and -k deselect, pytest-django sorts, xdist names the groups
    units: dict[tuple, list] = {}
    for item in items:  # in pytest-django's order
        units.setdefault(unit_of.get(id(item), (item.nodeid, _db_order(item))), []).append(item)

    def rank(key: tuple) -> tuple:  # by pytest-django's order, the longest units first, single tests last
        unit, order = key
        first = LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)
        return order, first, -slow.get(unit, 0), key in singles or key not in grouped

    # The same order on every worker (xdist checks); pytest-django's order breaks the ties (stable sort).
    items[:] = [item for key in sorted(units, key=rank) for item in units[key]]
    return result


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.duration:
        path = report.nodeid.split("::", 1)[0]
        _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    """Under xdist, the files that took longest (setup, call and teardown of their tests added up):
    what LONGEST_FIRST should start with."""
    if _xdist_controller(config) and _FILE_SECONDS:
        terminalreporter.write_sep("=", "slowest 15 files (what tests/conftest.py's LONGEST_FIRST starts with)")
        for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")


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
