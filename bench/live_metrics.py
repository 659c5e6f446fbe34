"""Live metrics: latency from a trainer step's commit to websocket clients receiving it.

    python -m bench live_metrics [--quick]

A real daphne server (rftweb.asgi, the Redis channel layer on REDIS_URL db 10) serves
`/ws/runs/<id>/`; 50 clients (one asyncio process, logged in as a researcher through a session
cookie) watch the run. This process logs trainer steps the way the trainer does
(`apps.runs.store.DjangoMetricSink.log`: MetricPoint + run progress in one transaction, published
after commit through `apps.runs.live`, whose 0.25 s coalescing holds only what follows a send
within the window), one step per second, and notes the time each transaction committed.
Latency = a client's receive time - that commit time, over every (client, step); p50 / p95 / max.
The coalescing is part of the design, so it is part of the figure. Own database (rftweb_d_live), dropped at the end.
"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BENCH_ENV, PY, ROOT, load, machine, percentile, save, table

DB_NAME = "rftweb_d_live"


def env() -> dict:
    return {
        **BENCH_ENV,
        "DATABASE_URL": BENCH_ENV["DATABASE_URL"].rsplit("/", 1)[0] + "/" + DB_NAME,
        "DJANGO_SETTINGS_MODULE": "rftweb.settings", "DEBUG": "0",
        "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
        "SECURE_COOKIES": "0", "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
    }


def admin_sql(*statements):
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- clients (a child process) ------------------------------------------------------------------

async def watch(url: str, cookie: str, origin: str, until_step: int, received: list, ready: list, deadline: float):
    import websockets

    async with websockets.connect(url, additional_headers={"Cookie": cookie, "Origin": origin}, max_size=2**22) as ws:
        ready.append(1)
        while time.time() < deadline:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.1, deadline - time.time()))
            except asyncio.TimeoutError:
                return
            now = time.time()
            message = json.loads(raw)
            for update in message.get("updates", []):
                if update.get("type") == "metrics" and update.get("role") == "trainer":
                    received.append((update["step"], now))
                    if update["step"] >= until_step:
                        return


async def clients_main(url, cookie, origin, n, until_step, out_path, ready_path, timeout):
    deadline = time.time() + timeout
    received = [[] for _ in range(n)]
    ready = []

    async def announce():
        while len(ready) < n and time.time() < deadline:
            await asyncio.sleep(0.05)
        Path(ready_path).write_text(str(len(ready)))

    tasks = [watch(url, cookie, origin, until_step, received[i], ready, deadline) for i in range(n)]
    results = await asyncio.gather(announce(), *tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, Exception)]
    Path(out_path).write_text(json.dumps({"received": received, "errors": errors[:5], "connected": len(ready)}))


# ---- the parent ---------------------------------------------------------------------------------

def live_metrics(clients: int = 50, steps: int = 60, interval: float = 1.0) -> dict:
    os.environ.update(env())
    admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)", f"CREATE DATABASE {DB_NAME}")
    server = None
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import transaction
        from django.test import Client

        from apps.accounts.services import create_user
        from apps.runs.models import Run
        from apps.runs.store import DjangoMetricSink

        call_command("migrate", verbosity=0)
        user = create_user("bench", "bench-password-1", roles=["researcher"])
        run = Run.objects.create(name="live", owner=user, config={}, status="running")
        web = Client()
        assert web.login(username="bench", password="bench-password-1")
        cookie = f"sessionid={web.cookies['sessionid'].value}"
        port = free_port()
        server = subprocess.Popen([PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
                                  cwd=ROOT, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  start_new_session=True)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        tmp = tempfile.mkdtemp()
        out_path, ready_path = f"{tmp}/received.json", f"{tmp}/ready"
        timeout = 120 + steps * interval * 3
        watcher = subprocess.Popen([PY, "-m", "bench.live_metrics", f"ws://127.0.0.1:{port}/ws/runs/{run.pk}/", cookie,
                                    f"http://127.0.0.1:{port}", str(clients), str(steps), out_path, ready_path,
                                    str(timeout)], cwd=ROOT, env={**os.environ})
        while not Path(ready_path).exists():
            if watcher.poll() is not None:
                raise RuntimeError("the websocket clients exited before connecting")
            time.sleep(0.1)
        connected = int(Path(ready_path).read_text())
        time.sleep(1)
        sink = DjangoMetricSink(run)
        committed = {}
        values = {f"metric_{k}": 0.5 for k in range(15)}
        for step in range(1, steps + 1):
            with transaction.atomic():
                sink.log("trainer", step, values | {"loss": 1.0 / step})
            committed[step] = time.time()
            time.sleep(interval)
        watcher.wait(timeout)
        data = json.loads(Path(out_path).read_text())
    finally:
        if server is not None:
            server.terminate()
            server.wait(20)
        from django.db import connections

        connections.close_all()
        admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    latencies = [now - committed[step]
                 for per_client in data["received"] for step, now in per_client if step in committed]
    expected = clients * steps
    results = {
        "machine": machine(), "clients": clients, "connected": connected, "steps": steps,
        "received": len(latencies), "expected": expected, "errors": data["errors"],
        "p50_ms": 1000 * percentile(latencies, 0.5), "p95_ms": 1000 * percentile(latencies, 0.95),
        "max_ms": 1000 * max(latencies) if latencies else None, "load_end": load(),
    }
    save("live_metrics", results)
    row = [clients, connected, f"{len(latencies)}/{expected}", results["p50_ms"], results["p95_ms"], results["max_ms"]]
    print(table([row], ["clients", "connected", "received", "p50 ms", "p95 ms", "max ms"]))
    return results


if __name__ == "__main__":
    url, cookie, origin, n, until_step, out_path, ready_path, timeout = sys.argv[1:9]
    asyncio.run(clients_main(url, cookie, origin, int(n), int(until_step), out_path, ready_path, float(timeout)))
