"""The run page of a 2,000-step run: server time of the page and its snapshot, and time to draw.

    python bench/run_page.py [--steps 2000]

Metrics are inserted directly (explorer and trainer every step with 15 values each, eval every
10 steps, system every step). Server time: Django's test client in this process, median of 5.
Draw time: headless Chromium (/usr/bin/chromium) against daphne, from navigation until every chart
in view has drawn all its points (1280x720). Uses its own database `rftweb_bench_page`. Figures, not pass/fail.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.update(
    DJANGO_SETTINGS_MODULE="rftweb.settings",
    DATABASE_URL="postgres://postgres@localhost:5432/rftweb_bench_page",
    REDIS_URL="redis://localhost:6379/9",
    DEBUG="0",
    SECRET_KEY="bench-only-secret-key-not-for-production-use-0123456789",
    SECURE_COOKIES="0",
    ALLOWED_HOSTS="testserver,127.0.0.1,localhost",
)


def create_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS rftweb_bench_page WITH (FORCE)")
        conn.execute("CREATE DATABASE rftweb_bench_page")


def metric_values(step: int, prefix: str) -> dict:
    return {f"{prefix}_{i}": (i + 1) / (step + 1) for i in range(15)}


def make_run(steps: int):
    from django.contrib.auth import get_user_model

    from apps.runs.models import MetricPoint, Run

    user = get_user_model().objects.create_superuser("bench", password="bench-password-1")
    run = Run.objects.create(name="2000 steps", owner=user, config={"trainer": {"total_steps": steps}},
                             status="completed", trainer_step=steps, explorer_step=steps, model_version=steps)
    points = [MetricPoint(run=run, role=role, step=s, values=metric_values(s, role))
              for s in range(1, steps + 1) for role in ("explorer", "trainer")]
    points += [MetricPoint(run=run, role="eval", step=s, values={"exact_match": s / steps})
               for s in range(0, steps + 1, 10)]
    points += [MetricPoint(run=run, role="system", step=1_790_000_000 + s,
                           values={"cpu_percent": 50.0, "memory_gb": 1.0})
               for s in range(steps)]
    MetricPoint.objects.bulk_create(points, batch_size=2000)
    return user, run, len(points)


def server_times(user, run) -> dict[str, float]:
    from django.test import Client

    client = Client()
    client.force_login(user)
    result = {}
    for name, url in (("run page", f"/runs/{run.pk}/"), ("snapshot live.json", f"/runs/{run.pk}/live.json")):
        times = []
        for _ in range(5):
            started = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.status_code
        result[name] = statistics.median(times)
    return result


def draw_time(run) -> float:
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "rftweb.asgi:application"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("RFTWEB_CHROMIUM", "/usr/bin/chromium"), args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            page = browser.new_page()
            page.goto(f"{base}/accounts/login/")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", "bench-password-1")
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")
            page.goto(f"{base}/runs/{run.pk}/")  # warm the server (templates, imports) and the browser cache
            page.goto(f"{base}/")
            started = time.perf_counter()
            page.goto(f"{base}/runs/{run.pk}/")
            # Charts near the viewport are drawn at once, the others as they scroll into view.
            page.wait_for_function(
                """() => { const charts = [...(window.rftRunPage?.board.charts.values() || [])];
                     const inView = charts.filter(c => c.visible);
                     return inView.length > 0 && inView.every(c => c.drawn); }""",
                timeout=60_000,
            )
            if os.environ.get("BENCH_VERBOSE"):
                print(page.evaluate("""() => { const n = performance.getEntriesByType('navigation')[0];
                    return {requestStart: n.requestStart, responseStart: n.responseStart, responseEnd: n.responseEnd,
                            domContentLoaded: n.domContentLoadedEventEnd}; }"""))
                print(page.evaluate("""() => performance.getEntriesByType('resource').map(
                    e => [e.name.split('/').pop(), Math.round(e.startTime), Math.round(e.duration)])"""))
            elapsed = time.perf_counter() - started
            counts = page.evaluate("""() => { const charts = [...window.rftRunPage.board.charts.values()];
                return [charts.filter(c => c.drawn).length, charts.length]; }""")
            browser.close()
        return elapsed, counts
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    steps = parser.parse_args().steps
    create_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # DEBUG off: whitenoise serves STATIC_ROOT
    user, run, rows = make_run(steps)
    times = server_times(user, run)
    drawn, (in_view, charts) = draw_time(run)
    print(f"run page of a {steps}-step run ({rows} metric rows)")
    for name, seconds in times.items():
        print(f"{name:>20}: {seconds * 1000:7.1f} ms server time (median of 5)")
    print(f"{'draw in Chromium':>20}: {drawn * 1000:7.1f} ms from navigation to the {in_view} charts in view drawn "
          f"({charts} charts in all, the rest drawn as they scroll into view)")


if __name__ == "__main__":
    main()
