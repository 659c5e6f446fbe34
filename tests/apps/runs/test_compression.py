"""JSON answers compressed (apps/runs/compression.py): the live snapshot and the metrics downloads
come gzipped to a client that accepts it, whole or streamed, and read back the same; HTML pages,
which carry the CSRF token, never are (BREACH). On Postgres and SQLite."""
import gzip
import json
import random

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

from apps.runs.models import MetricPoint

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}


@pytest.fixture
def long_run(make_run):
    """500 steps with the engine's keys (as tests/e2e/test_dashboard.seed_history): what a run page loads."""
    run = make_run("long", status="completed")
    rng = random.Random(0)
    rows = []
    for step in range(1, 501):
        rows.append(MetricPoint(run=run, role="explorer", step=step, values={
            key: rng.random() for key in ("reward_mean", "reward_std", "response_length", "truncated_frac",
                                          "tokens_per_s", "seconds", "idle_share", "sync_seconds")}))
        rows.append(MetricPoint(run=run, role="trainer", step=step, values={
            key: rng.random() for key in ("loss", "policy_loss", "sft_loss", "entropy", "grad_norm", "approx_kl",
                                          "clip_frac", "seconds", "tokens_per_s", "lr", "reward_mean")}))
    MetricPoint.objects.bulk_create(rows)
    return run


def streamed(response) -> bytes:
    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def test_the_live_snapshot_comes_gzipped_and_reads_back_the_same(researcher_client, long_run):
    url = reverse("run-live", args=[long_run.pk])
    plain = researcher_client.get(url)
    packed = researcher_client.get(url, **GZIP)
    assert "Content-Encoding" not in plain and packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"] and "Accept-Encoding" in plain["Vary"]
    assert int(packed["Content-Length"]) == len(packed.content) < len(plain.content) / 3
    assert json.loads(gzip.decompress(packed.content)) == plain.json()


@pytest.mark.parametrize("name, args", [("run-metrics-json", True), ("compare-metrics-json", False)])
def test_a_metrics_download_streams_one_gzip_stream(researcher_client, long_run, name, args):
    url = reverse(name, args=[long_run.pk]) if args else reverse(name) + f"?runs={long_run.pk}"
    plain, packed = streamed(researcher_client.get(url)), researcher_client.get(url, **GZIP)
    assert packed["Content-Encoding"] == "gzip" and packed.streaming and "Content-Length" not in packed
    chunks = []

    async def read():
        chunks.extend([chunk async for chunk in packed.streaming_content])

    async_to_sync(read)()
    assert len(chunks) > 2 and all(chunks)  # the bytes flow chunk by chunk, not all at the end
    body = b"".join(chunks)
    assert gzip.decompress(body) == plain and len(body) < len(plain) / 3


def test_pages_are_never_compressed(researcher_client, long_run):
    """An HTML page carries the CSRF token: compressed, its size would leak it (BREACH)."""
    for url in (reverse("run-detail", args=[long_run.pk]), reverse("run-compare") + f"?runs={long_run.pk}"):
        response = researcher_client.get(url, **GZIP)
        assert response.status_code == 200 and "Content-Encoding" not in response, url
