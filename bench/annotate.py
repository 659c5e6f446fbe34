"""Seconds per annotated item by keyboard: a scripted annotator in headless Chromium on the real
annotation page, served by daphne (DEBUG off, static files from whitenoise), judging N items each
of rate, edit, compare and flag as fast as the page allows.

    python -m bench annotate [--quick]        # or: python bench/annotate.py [--items N]

Each item is timed from the item on screen to the next item on screen, accepting keys: the script
presses the keys, then waits only until the next item is shown and the page's key handler is
attached, as a fast human would (no reading time: what the product adds to each item). A second
figure types three ratings ahead without waiting at all and counts how many were saved.

Uses its own database `rftweb_bench_annotate` (dropped and created), Redis db 12 and
RFTWEB_DATA_DIR=/tmp/rftweb_bench_annotate. Figures, not pass/fail.
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
DATABASE = "rftweb_bench_annotate"
ENV = {
    "DJANGO_SETTINGS_MODULE": "rftweb.settings",
    "DATABASE_URL": f"postgres://postgres@localhost:5432/{DATABASE}",
    "REDIS_URL": "redis://localhost:6379/12",
    "RFTWEB_DATA_DIR": "/tmp/rftweb_bench_annotate",
    "DEBUG": "0",
    "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
    "SECURE_COOKIES": "0",
    "SECURE_SSL_REDIRECT": "0",  # plain HTTP on 127.0.0.1
    "SECURE_HSTS_SECONDS": "0",
    "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
}
PASSWORD = "bench-password-1"
KINDS = ("rate", "edit", "compare", "flag")
# The keys of one judgement of each kind (the edit types the reference answer: {answer}).
KEYS = {
    "rate": ["4", "Enter"],
    "edit": ["e", "Control+a", "{answer}", "Control+Enter"],
    "compare": ["c", "1", "Enter"],
    "flag": ["f", "3", "Enter"],
}
# The item on screen, and the page ready for keys: the old page reloads for every item, the new one
# swaps items in place; both hold the item's id on #annotate.
SHOWN = """() => { const item = document.getElementById("annotate");
  return document.readyState !== "loading" && item ? Number(item.dataset.experience) : null; }"""


def create_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")


def make_run(items: int):
    """A running run with two different answers to each of `items` sums: every item can be rated,
    edited, compared or flagged."""
    from apps.accounts.roles import ANNOTATOR, RESEARCHER
    from apps.accounts.services import create_user
    from apps.buffer.models import Experience
    from apps.runs.models import Run
    from apps.tasksets.models import Task, Taskset

    owner = create_user("owner", PASSWORD, roles=(RESEARCHER,))
    annotator = create_user("annotator", PASSWORD, roles=(ANNOTATOR,))
    run = Run.objects.create(name="bench annotate", owner=owner, status=Run.Status.RUNNING, config={})
    taskset = Taskset.objects.create(name="bench sums")
    rows = []
    for i in range(items):
        task = Task.objects.create(taskset=taskset, index=i, prompt=f"What is {i} + {i + 1}?", answer=str(2 * i + 1))
        for k, text in enumerate((f"{i} + {i + 1} = {2 * i + 1}", f"I think it is {2 * i + 2}.")):
            rows.append(Experience(
                run=run, task=task, explorer_step=i, rollout_index=k, group_id=f"g{i}", prompt_text=task.prompt,
                response_text=text, prompt_ids=[1], response_ids=[2, 3], action_mask=[1, 1], reward=0.5,
                model_version=i,
            ))
    Experience.objects.bulk_create(rows)
    return annotator, run


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {name: value for name, value in {**os.environ, **ENV}.items() if name != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError("daphne did not start")


def shown(page, previous: int | None, timeout: float = 30) -> int:
    """Waits until an item other than `previous` is on screen; its id. Polled from here: a page
    that reloads destroys the context a wait_for_function would run in."""
    from playwright.sync_api import Error

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            current = page.evaluate(SHOWN)
        except Error:  # the page is navigating
            current = None
        if current is not None and current != previous:
            return current
        time.sleep(0.005)
    raise TimeoutError(f"no item after {previous} was shown in {timeout:.0f} s (at {page.url})")


def answer_of(experience_id: int) -> str:
    from apps.buffer.models import Experience

    return Experience.objects.select_related("task").get(pk=experience_id).task.answer


def judge_items(page, kind: str, n: int, item: int) -> tuple[list[float], int]:
    """n judgements of `kind`, each timed from the item shown to the next one shown."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        for key in KEYS[kind]:
            if key == "{answer}":
                page.keyboard.type(answer_of(item))
            else:
                page.keyboard.press(key)
        item = shown(page, item)
        times.append(time.perf_counter() - started)
    return times, item


def typed_ahead(page, item: int) -> int:
    """Three ratings typed with no wait between them: how many the server saved."""
    from apps.feedback.models import Feedback

    before = Feedback.objects.filter(kind="rating").count()
    for _ in range(3):
        page.keyboard.press("2")
        page.keyboard.press("Enter")
    time.sleep(4)  # ample for three saves; keys the page dropped never arrive
    return Feedback.objects.filter(kind="rating").count() - before


def measure(base: str, items: int) -> dict:
    from playwright.sync_api import sync_playwright

    # Playwright's loop on this thread looks async to Django; the ORM reads here run in between.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("RFTWEB_CHROMIUM", "/usr/bin/chromium"), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=username]", "annotator")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        from apps.runs.models import Run

        page.goto(f"{base}/annotate/?run={Run.objects.get().pk}&strategy=newest")
        item = shown(page, None)
        # One judgement of each kind first, untimed: the server's and the browser's first use of each path.
        for kind in KINDS:
            _, item = judge_items(page, kind, 1, item)
        result = {}
        for kind in KINDS:
            result[kind], item = judge_items(page, kind, items, item)
        result["typed_ahead_saved"] = typed_ahead(page, item)
        browser.close()
    return result


def bench(items: int) -> dict:
    os.environ.update(ENV)
    sys.path.insert(0, str(ROOT))
    create_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # DEBUG off: whitenoise serves STATIC_ROOT
    # rate, edit, flag: one item each; compare: two (both answers are judged); warm-up: 5; typed ahead: 3.
    make_run(items=5 * items + 10)
    server, base = start_server()
    try:
        result = measure(base, items)
    finally:
        server.terminate()
        server.wait(10)
    print(f"seconds per annotated item by keyboard, {items} items each (median, min-max), 1366x768:")
    for kind in KINDS:
        times = result[kind]
        print(f"{kind:>8}: {statistics.median(times):.3f} s ({min(times):.3f}-{max(times):.3f})")
    print(f"three ratings typed ahead with no wait: {result['typed_ahead_saved']} of 3 saved")
    return result


def run(args) -> dict:
    """The entry of `python -m bench annotate`."""
    return bench(items=4 if args.quick else 10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=10)
    bench(parser.parse_args().items)
