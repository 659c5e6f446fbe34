"""A run whose only reward is human feedback learns what its annotator prefers.

The run (GRPO on the tiny model, explorer and trainer on a real Celery worker) gives its rule
reward no weight and takes each rollout's reward from its rating (`feedback.reward_mode:
override`), training only on rated rollouts (`rated_only`, waiting for the ratings). A scripted
annotator judges over the real server exactly as a person's browser would: it asks the queue for
the next item, reads the response off the item's page, posts a rating that prefers shorter answers
(in characters), and when the queue is empty waits on the annotation websocket for new
experiences. The model's answers get shorter: the last quarter of explorer steps against the first.
"""
import asyncio
import html
import re
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from websockets.asyncio.client import connect

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import MetricPoint, Run
from apps.runs.services import launch_run
from apps.tasksets.services import BUILTIN_TASKSETS, create_generated_taskset
from tests.e2e.conftest import asgi_server, asgi_server_log  # noqa: F401 (fixtures: the real server)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1500)]

STEPS = 20
CONFIG = {
    "seed": 0,
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 4},
    "explorer": {"batch_size": 4, "max_new_tokens": 8, "use_chat_template": False, "reward_fn": {"exact_match": 0}},
    "trainer": {"lr": 3e-3, "micro_batch_size": 16, "total_steps": STEPS},
    "buffer": {"taskset": "addition"},
    "feedback": {"scale_min": 0, "scale_max": 9, "reward_mode": "override", "rated_only": True, "rating_wait_s": 300},
}
RUN_DEADLINE_S = 1200  # a loaded 2-core machine: tens of seconds a step
RESPONSE = re.compile(r'id="response">(.*?)</div>', re.S)


def preferred_rating(response: str) -> str:
    """The annotator's taste: the shorter the answer, the better (9 at up to 2 characters, 0 from 27)."""
    return str(max(0, 9 - len(response) // 3))


def cookies_of(user) -> dict:
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value, "csrftoken": "t" * 32}


def run_finished(run_id: int) -> bool:
    try:
        return Run.objects.get(pk=run_id).is_finished
    finally:
        connection.close()  # this helper thread's own: the test database must be free to drop at the end


async def scripted_annotator(base_url: str, run: Run, cookies: dict) -> dict[int, str]:
    """Judge the run's rollouts through the pages and the websocket until the run finishes."""
    ratings = {}
    new_experiences = asyncio.Event()
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()), "Origin": base_url}

    async def listen(socket):
        async for message in socket:
            if '"new_experiences"' in message:
                new_experiences.set()

    async with httpx.AsyncClient(base_url=base_url, cookies=cookies, timeout=120) as http, connect(
        base_url.replace("http", "ws", 1) + f"/ws/annotate/{run.pk}/", additional_headers=headers
    ) as socket:
        listener = asyncio.create_task(listen(socket))
        response = await http.get("/annotate/", params={"run": run.pk, "strategy": "newest"})
        assert response.status_code == 302, response.text
        deadline = time.monotonic() + RUN_DEADLINE_S
        while time.monotonic() < deadline:
            if await asyncio.to_thread(run_finished, run.pk):
                break
            response = await http.get("/annotate/next/")
            # The item page's address names its queue (?run=&strategy=): the next page's forms post it.
            item = re.fullmatch(r"/annotate/experience/(\d+)/(\?.*)?", response.headers.get("location", ""))
            if item is None:
                assert response.status_code == 200 and b"Nothing to judge" in response.content, response.text
                new_experiences.clear()
                try:  # the explorer's next step, or a recheck of the run's status
                    await asyncio.wait_for(new_experiences.wait(), timeout=3)
                except TimeoutError:
                    pass
                continue
            page = await http.get(item.group(0))
            text = html.unescape(RESPONSE.search(page.text).group(1))
            point = preferred_rating(text)
            response = await http.post(f"/annotate/experience/{item.group(1)}/rate/",
                                       data={"point": point, "csrfmiddlewaretoken": "t" * 32})
            assert response.status_code == 302, response.text
            ratings[int(item.group(1))] = point
        listener.cancel()
    return ratings


def quarter_means(values_by_step: dict[int, list[float]]) -> tuple[float, float]:
    steps = sorted(values_by_step)
    quarter = max(1, len(steps) // 4)
    first = [v for s in steps[:quarter] for v in values_by_step[s]]
    last = [v for s in steps[-quarter:] for v in values_by_step[s]]
    return sum(first) / len(first), sum(last) / len(last)


def test_a_run_rewarded_only_by_a_scripted_annotator_learns_to_answer_shorter(
    asgi_server, celery_worker_factory, researcher, annotator  # noqa: F811
):
    create_generated_taskset(next(spec for spec in BUILTIN_TASKSETS if spec.name == "addition"))
    run = launch_run(researcher, "human-only reward", CONFIG)
    worker = celery_worker_factory()

    ratings = asyncio.run(scripted_annotator(asgi_server, run, cookies_of(annotator)))

    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, f"{run.status}: {run.error}\n{worker.log_path.read_text()[-3000:]}"
    assert run.trainer_step == STEPS
    # Every rating the annotator was told was saved is stored, on the rollout it judged.
    stored = dict(Feedback.objects.filter(user=annotator, kind="rating").values_list("experience_id", "label"))
    assert stored == ratings and len(ratings) >= STEPS * 16 // 2
    # What was trained on was rated: the trainer consumed only rated rollouts.
    consumed = Experience.objects.filter(run=run, status="consumed")
    assert consumed.exists() and not consumed.exclude(reward_components__has_key="human").exists()

    lengths = {}
    rollouts = Experience.objects.filter(run=run, source="rollout")
    for step, text in rollouts.values_list("explorer_step", "response_text"):
        lengths.setdefault(step, []).append(len(text))
    first, last = quarter_means(lengths)
    rewards = {
        p.step: [p.values["reward_mean"]]
        for p in MetricPoint.objects.filter(run=run, role="trainer")
        if "reward_mean" in p.values
    }
    first_reward, last_reward = quarter_means(rewards)
    print(f"\nmean answer length (characters), first vs last quarter of {len(lengths)} explorer steps: "
          f"{first:.1f} -> {last:.1f}; trainer reward_mean (human): {first_reward:.3f} -> {last_reward:.3f}")
    assert last <= 0.8 * first, (first, last)
    assert last_reward >= first_reward + 0.1, (first_reward, last_reward)
