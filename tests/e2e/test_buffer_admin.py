"""A curator's way into the buffer: the nav's Buffer link opens Experiences, the list fits 1366 px, and
Export is one action whose file downloads when its job has written it."""

import json

import pytest

from apps.buffer import services
from apps.buffer.models import BufferJob, Experience
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_buffer_link_opens_experiences_whose_export_downloads_in_one_action(
    page, login, curator, celery_worker_factory, settings
):
    run = Run.objects.create(name="r", owner=curator, config={})
    task = Task.objects.create(taskset=Taskset.objects.create(name="ts"), index=0, prompt="What is 6 + 9?", answer="15")
    rows = [
        Experience.objects.create(
            run=run, task=task, explorer_step=i, rollout_index=i, group_id="g", prompt_text=task.prompt,
            response_text=f"answer {i}", prompt_ids=[1], response_ids=[2, 3], action_mask=[1, 1],
            logprobs=[-0.5, -0.5], reward=1.0, model_version=i,
        )
        for i in range(3)
    ]
    celery_worker_factory(queues="default")
    page.set_viewport_size({"width": 1366, "height": 768})
    login(curator)

    page.get_by_role("link", name="Buffer", exact=True).click()
    page.wait_for_url("**/admin/buffer/experience/")
    # Every column is on screen: the last one (run) ends inside the window.
    last_header = page.locator("#result_list thead th").last.bounding_box()
    assert last_header["x"] + last_header["width"] <= 1366
    page.locator("#action-toggle").check()
    page.locator("select[name=action]").select_option("export_selection")
    page.locator("select[name=export_format]").select_option("jsonl")
    try:
        with page.expect_download(timeout=60_000) as download:
            page.locator("button[name=index]").click()
        lines = download.value.path().read_text().splitlines()
        assert sorted(json.loads(line)["id"] for line in lines) == [row.pk for row in rows]
        assert "download" not in page.url, "a reload does not download again"
    finally:
        settings.MEDIA_ROOT = settings.DATA_DIR / "uploads"  # where the worker wrote
        services.delete_jobs(BufferJob.objects.all())
