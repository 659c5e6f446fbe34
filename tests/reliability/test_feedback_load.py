"""Human feedback under load, over the real ASGI server (daphne) and Postgres: 200 feedback POSTs
at once, and 50 annotators working the queue for a fixed time. Every request gets an answer
(a judgement saved, or a clear refusal), never a server error; no item is judged beyond the
overlap setting; every judgement the server confirmed is stored.

Prints the load test's figures (p95 latency, errors): pytest -s shows them.

Django runs each HTTP request on a thread of its own with a database connection of its own, so a
burst of requests past Postgres's max_connections failed with HTTP 500s ("too many clients")
until the server bounded the requests it runs at once (rftweb/asgi.py, HttpConcurrencyLimit)."""
import asyncio
import re
import time
from collections import Counter

import httpx
import pytest
from django.conf import settings
from django.test import Client

from apps.accounts.roles import ANNOTATOR
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from rftweb import asgi
from tests.e2e.conftest import asgi_server, asgi_server_log  # noqa: F401 (fixtures: the real server)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
needs_request_limit = pytest.mark.skipif(
    not hasattr(asgi, "HttpConcurrencyLimit"),
    reason="a burst past Postgres's max_connections needs the server's HTTP concurrency limit (rftweb/asgi.py)",
)

CSRF = "c" * 32  # the cookie and the form carry the same token, as a page's form would
TIMEOUT_S = 120.0  # a loaded 2-core CI machine answers slowly, but it answers


def make_run(owner, items: int, per_item: int = 1) -> list[Experience]:
    config = {"feedback": {"judgements_per_item": per_item}}
    run = Run.objects.create(name="load", owner=owner, config=config, status=Run.Status.RUNNING)
    taskset = Taskset.objects.create(name="load")
    tasks = Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", answer="1") for i in range(items))
    return Experience.objects.bulk_create(
        Experience(
            run=run, task=task, explorer_step=0, rollout_index=0, group_id=f"g{i}", prompt_text=task.prompt,
            response_text=f"answer {i}", prompt_ids=[1], response_ids=[2], action_mask=[1], reward=0.0, model_version=0,
        )
        for i, task in enumerate(tasks)
    )


def annotators(n: int) -> list[dict]:
    """n annotators, each with the cookies of a logged-in browser."""
    cookies = []
    for i in range(n):
        client = Client()
        client.force_login(create_user(f"load{i}", "pw-for-tests-123", roles=(ANNOTATOR,)))
        cookies.append(
            {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value, "csrftoken": CSRF}
        )
    return cookies


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


SERVER_TROUBLE = ("Error", "FATAL", "WARNING", "Timing out", "took too long")


def server_errors(log_path, since: int) -> str:
    """The distinct error lines the server logged during the test, for a failure message."""
    with open(log_path, errors="replace") as log:
        log.seek(since)
        lines = {line.strip() for line in log if any(word in line for word in SERVER_TROUBLE)}
    return "\n".join(sorted(lines)[:20])


def listen_overflows() -> int | None:
    """The kernel's count of handshakes dropped because a listening socket's backlog was full, on
    every socket of this network namespace (None where Linux's /proc/net/netstat is not there)."""
    try:
        with open("/proc/net/netstat") as netstat:
            names, values = [line.split() for line in netstat if line.startswith("TcpExt:")][:2]
    except OSError:
        return None
    return int(values[names.index("ListenOverflows")])


@needs_request_limit
def test_two_hundred_feedback_posts_at_once_all_get_an_answer_and_none_is_lost(
    asgi_server, asgi_server_log, researcher  # noqa: F811
):
    # 100 items rated by one annotator each, and 25 contested items that 4 annotators rate at once:
    # one of the four gets it (one judgement per item), the others a clear refusal.
    items = make_run(researcher, 125)
    targets = [items[i] for i in range(100)] + [items[100 + i // 4] for i in range(100)]
    cookies = annotators(len(targets))

    async def post(cookie, experience, latencies, statuses):
        async with httpx.AsyncClient(base_url=asgi_server, cookies=cookie, timeout=TIMEOUT_S) as http:
            started = time.perf_counter()
            try:
                response = await http.post(
                    f"/annotate/experience/{experience.pk}/rate/", data={"point": "4", "csrfmiddlewaretoken": CSRF}
                )
            except httpx.TransportError as error:  # no answer at all: kept, to say when and how below
                dropped.append(f"{type(error).__name__} {error} after {time.perf_counter() - started:.1f} s")
                return
            latencies.append(time.perf_counter() - started)
            statuses.append((experience.pk, response.status_code))

    async def burst():
        latencies, statuses = [], []
        await asyncio.gather(*(post(c, e, latencies, statuses) for c, e in zip(cookies, targets)))
        return latencies, statuses

    log_start, overflows = asgi_server_log.stat().st_size, listen_overflows()
    dropped = []
    latencies, statuses = asyncio.run(burst())
    # Two CI runs saw connections closed without an answer (httpx.ReadError; 46 of 200 after
    # ~2.3 s once, the server logging nothing), in many runs: say how many, when, what the server
    # logged meanwhile and whether the kernel dropped handshakes (the server's listen backlog).
    assert not dropped, f"{len(dropped)} of 200 got no answer: {sorted(set(dropped))[:5]}; " \
                        f"listen overflows (machine-wide) {overflows} before, {listen_overflows()} after; " \
                        f"the server logged:\n{server_errors(asgi_server_log, log_start)}"
    codes = Counter(code for _, code in statuses)
    errors = sum(n for code, n in codes.items() if code >= 500)
    print(f"\n200 concurrent feedback POSTs: p95 {p95(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms, "
          f"errors {errors}, answers {dict(codes)}")
    assert errors == 0, f"{codes}; the server logged:\n{server_errors(asgi_server_log, log_start)}"
    assert set(codes) <= {302, 400}, codes  # saved (redirect to the next item) or refused with the reason
    saved = Counter(pk for pk, code in statuses if code == 302)
    stored = Counter(Feedback.objects.values_list("experience_id", flat=True))
    assert stored == saved  # every confirmed judgement is there, and nothing else
    assert len(stored) == 125 and max(stored.values()) == 1


async def annotate_for(base_url: str, cookie: dict, seconds: float, confirmed: Counter, errors: list) -> None:
    """One annotator: ask the queue for an item, rate it, repeat, until the time is up or the queue is empty."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base_url, cookies=cookie, timeout=TIMEOUT_S) as http:
        while time.monotonic() < deadline:
            response = await http.get("/annotate/next/")
            # the item's page, its queue after "?" (the page's forms carry it: page_queue.py)
            found = re.fullmatch(r"/annotate/experience/(\d+)/(\?.*)?", response.headers.get("location", ""))
            if response.status_code == 200 and b"Nothing to judge" in response.content:
                return
            if found is None:
                errors.append(f"GET /annotate/next/ -> {response.status_code}")
                return
            pk = int(found.group(1))
            response = await http.post(
                f"/annotate/experience/{pk}/rate/", data={"point": "3", "csrfmiddlewaretoken": CSRF}
            )
            if response.status_code == 302:
                confirmed[pk] += 1
            else:
                errors.append(f"rate {pk} -> {response.status_code}")


@pytest.mark.parametrize("per_item", [1, 2])
def test_fifty_annotators_over_the_server_never_judge_beyond_the_overlap(asgi_server, researcher, per_item):  # noqa: F811
    items = make_run(researcher, 150, per_item)
    cookies = annotators(50)
    run = items[0].run
    for cookie in cookies:  # the queue follows the run chosen on the start page
        httpx.get(f"{asgi_server}/annotate/", params={"run": run.pk}, cookies=cookie, timeout=TIMEOUT_S)
    confirmed, errors = Counter(), []

    async def everyone():
        await asyncio.gather(*(annotate_for(asgi_server, c, 8.0, confirmed, errors) for c in cookies))

    asyncio.run(everyone())
    stored = Counter(Feedback.objects.values_list("experience_id", flat=True))
    print(f"\n50 annotators for 8 s, {per_item} judgement(s) per item: {sum(stored.values())} judgements, "
          f"{len(stored)} items, refusals/errors {len(errors)}")
    assert errors == []
    assert stored == confirmed and sum(stored.values()) > 0
    assert max(stored.values()) <= per_item
    assert Feedback.objects.values("experience_id", "user_id").distinct().count() == Feedback.objects.count()
