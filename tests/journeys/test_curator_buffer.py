"""A curator looks after the buffer in the admin (#29), in Chromium at 1366x768.

Retention, both ways the README offers (embedded: `manage.py demo` on SQLite, the job on a thread
of the server; full stack: Postgres, Redis, daphne and a real Celery worker running the job): a
stopped run has rollouts written by the explorer's own write (`DjangoExperienceBuffer.write`), one
of them rated and one corrected by an annotator (a human edit). Its page offers Resume. The
curator selects it in the Runs admin, chooses *Archive the buffer of the selected ended runs*,
confirms, and lands on the job's page, which follows the job to the end; the archive downloads
from there as Parquet and holds exactly the rows that were deleted, while the rated and edited
rows and the human edit stay. The run page now says its buffer was archived and links the job,
and offers no Resume; a Resume from a page opened before is refused with the reason, and so is the
API's. An annotator and a researcher never reach the action.

Search, full stack only (embedded SQLite has substring search only): rows just written are found
by the Experiences admin's search at once (the admin makes their documents before it searches),
and with Celery beat running the indexer (RFTWEB_SEARCH_INDEX_INTERVAL) no backlog is left after
its interval without any search.

With RFTWEB_JOURNEY_SHOTS=DIR the journeys leave screenshots of the pages a curator sees in DIR.
"""
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from apps.buffer import search
from apps.buffer.models import BufferJob, Experience
from apps.buffer.store import DjangoExperienceBuffer
from apps.runs.models import Run
from tests.e2e.conftest import PASSWORD, _artifact_dir, _failed
from tests.support import free_port, make_taskset, wait_for, wait_for_port
from workers.rft.experience import Experience as EngineExperience

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = os.environ.get("RFTWEB_JOURNEY_SHOTS")
VIEWPORT = {"width": 1366, "height": 768}
ARCHIVE = "Archive the buffer of the selected ended runs"
STEPS, TASKS, REPEATS = 2, 2, 4


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=Path(SHOTS) / f"{name}.png")


def rollouts(run: Run, step: int, words: str) -> list[EngineExperience]:
    """One explorer step's rollouts of the run's tasks, as the explorer hands them to the buffer."""
    tasks = list(run_tasks(run))
    return [
        EngineExperience(
            task.pk, f"{step}-{task.pk}", i, [1, 2, 3], [4, 5], [1, 1], logprobs=[-0.5, -0.25],
            prompt_text=task.prompt, response_text=f"{words} {i}", reward=float(i % 2), model_version=step,
            explorer_step=step,
        )
        for task in tasks for i in range(REPEATS)
    ]


def run_tasks(run: Run):
    from apps.tasksets.models import Task

    return Task.objects.filter(taskset__name=run.config["buffer"]["taskset"]).order_by("index")


def ended_run(owner, annotator) -> dict:
    """A stopped run of `owner` with STEPS explorer steps of rollouts; `annotator` rated one and
    corrected another (a human edit). Its ids: the run, its rollouts and the rows retention keeps."""
    from apps.feedback import services as feedback
    from workers.rft.config import RunConfig

    make_taskset("journey-sums", n=TASKS)
    config = RunConfig.from_dict({"buffer": {"taskset": "journey-sums"}, "trainer": {"total_steps": 10}}).to_dict()
    run = Run.objects.create(name="retired run", owner=owner, config=config, mode="both", status=Run.Status.RUNNING)
    buffer = DjangoExperienceBuffer(run.pk)
    for step in range(STEPS):
        buffer.write(rollouts(run, step, "the answer is"))
    written = list(Experience.objects.filter(run=run, source="rollout").order_by("pk").values_list("pk", flat=True))
    rated, edited = written[0], written[1]
    feedback.rate(rated, annotator, "5")
    task = Experience.objects.get(pk=edited).task
    feedback.edit(edited, annotator, task.answer, confirmed=True)
    edit = Experience.objects.get(parent_id=edited, source="human_edit").pk
    Run.objects.filter(pk=run.pk).update(status=Run.Status.STOPPED, finished_at=timezone.now(),
                                        explorer_step=STEPS, trainer_step=STEPS)
    return {"run": run.pk, "rollouts": written, "kept": sorted([rated, edited, edit])}


def embedded_setup() -> dict:
    """ended_run() in the embedded demo's database, with its users (run by `python -c`)."""
    from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER
    from apps.accounts.services import create_user
    from apps.runs.api import token_for

    users = {role: create_user(name, PASSWORD, roles=[role]) for role, name in
             ((CURATOR, "cur"), (RESEARCHER, "res"), (ANNOTATOR, "ann"))}
    return {**ended_run(users[RESEARCHER], users[ANNOTATOR]), "token": token_for(users[RESEARCHER])}


# ---- where the journey happens ----


@pytest.fixture(params=["embedded", "full-stack"])
def site(request, tmp_path, stack):
    """The server the curator works on, the run they retire (`made`), and `remaining()`: the ids of
    the run's rows still in its buffer, read from the server's own database."""
    if request.param == "full-stack":
        from apps.buffer import services
        from apps.runs.api import token_for

        researcher, annotator = request.getfixturevalue("researcher"), request.getfixturevalue("annotator")
        request.getfixturevalue("curator")
        made = ended_run(researcher, annotator) | {"token": token_for(researcher)}
        stack().worker("default")  # the jobs' queue
        yield SimpleNamespace(
            base_url=request.getfixturevalue("asgi_server"), made=made,
            remaining=lambda: set(Experience.objects.filter(run_id=made["run"]).values_list("pk", flat=True)),
        )
        services.delete_jobs(BufferJob.objects.all())  # and their files, in the tests' data dir
        return
    from tests.journeys.test_newcomer import newcomer_env

    data = tmp_path / "data"
    env = newcomer_env(data)  # no DATABASE_URL, no REDIS_URL: embedded
    port, log_path = free_port(), tmp_path / "demo.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--no-run", f"127.0.0.1:{port}"], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, proc, log_path, timeout=180)  # migrated
        script = ("import django, json; django.setup(); "
                  "from tests.journeys.test_curator_buffer import embedded_setup; print(json.dumps(embedded_setup()))")
        setup = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env=env | {"DJANGO_SETTINGS_MODULE": "rftweb.settings"})
        assert setup.returncode == 0, setup.stderr
        made = json.loads(setup.stdout.strip().splitlines()[-1])

        def remaining():
            with sqlite3.connect(data / "rftweb.sqlite3") as db:
                return {pk for (pk,) in db.execute("SELECT id FROM buffer_experience WHERE run_id = ?", [made["run"]])}

        yield SimpleNamespace(base_url=f"http://127.0.0.1:{port}", made=made, remaining=remaining)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=90)
        if _failed(request):
            shutil.copy(log_path, _artifact_dir(request) / "demo.log")


@pytest.fixture
def signed_in(request, browser, tmp_path):
    """signed_in(base_url, username, path): a page of a fresh browser context at 1366x768, signed in
    through the login form. On failure each page's screenshot and the workers' logs go to
    test-artifacts/<test>/."""
    pages = []

    def sign_in(base_url: str, username: str, next_path: str = "/"):
        context = browser.new_context(base_url=base_url, viewport=VIEWPORT, accept_downloads=True)
        context.set_default_timeout(30_000)
        page = context.new_page()
        pages.append(page)
        page.goto(next_path)
        page.wait_for_url(re.compile(r"/accounts/login/"))
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(lambda url: "/accounts/login/" not in url)
        context.on("page", lambda opened: pages.append(opened))
        return page

    yield sign_in
    if _failed(request):
        out = _artifact_dir(request)
        for number, page in enumerate(pages):
            if not page.is_closed():
                page.screenshot(path=out / f"page-{number}.png", full_page=True)
        for log in tmp_path.glob("*.log"):
            shutil.copy(log, out / log.name)
    for page in pages:
        if not page.is_closed():
            page.context.close()


# ---- retention ----


def test_a_curator_archives_the_buffer_of_a_stopped_run_and_it_can_no_longer_be_resumed(site, signed_in):
    made, run = site.made, site.made["run"]
    rollouts_written, kept = set(made["rollouts"]), set(made["kept"])
    assert site.remaining() == rollouts_written | kept and len(rollouts_written) == STEPS * TASKS * REPEATS
    page = signed_in(site.base_url, "cur", f"/runs/{run}/")
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    # Before: the stopped run offers Resume. This tab stays open on it.
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    expect(page.locator("#run-buffer-retired")).to_have_count(0)
    admin = page.context.new_page()
    admin.on("pageerror", lambda error: errors.append(str(error)))

    # The Runs admin: select the run, choose the archive action, Go.
    admin.goto("/admin/runs/run/")
    admin.locator(f'input[name="_selected_action"][value="{run}"]').check()
    admin.locator("select[name=action]").select_option(label=ARCHIVE)
    shot(admin, "retention-1-runs-changelist-action-chosen")
    admin.get_by_role("button", name="Go").click()

    # It asks first, saying what goes and what stays.
    expect(admin.locator("#content")).to_contain_text("Archive the buffer: 1 run")
    expect(admin.locator("#content")).to_contain_text("Human edits (other runs train on them)")
    deleted = len(rollouts_written - kept)
    expect(admin.locator("#content")).to_contain_text(
        f"{deleted} of the {len(rollouts_written | kept)} experiences in their buffer go.")
    expect(admin.get_by_role("link", name=re.compile("retired run"))).to_be_visible()
    shot(admin, "retention-2-confirmation")
    admin.get_by_role("button", name="Yes, archive the buffer").click()

    # The job's page follows it to the end (live, then shown as the server renders it finished).
    admin.wait_for_url(re.compile(r"/admin/buffer/bufferjob/\d+/change/$"))
    job = int(re.search(r"/bufferjob/(\d+)/", admin.url)[1])
    expect(admin.locator(".field-what .readonly")).to_have_text(f"archive the buffer of run #{run}")
    expect(admin.locator(".field-status .readonly")).to_have_text("Succeeded", timeout=120_000)
    expect(admin.locator("[data-job-percent]")).to_have_text("100")
    # Each row counted once, though the job went through them twice (written, then deleted).
    expect(admin.locator("[data-job-rows]")).to_have_text(f"{deleted} archived, {deleted} of {deleted} deleted")
    result = admin.locator(".field-result_summary .readonly")
    for said in (f"archived: {deleted}", f"deleted: {deleted}", "kept human edits: 1", "kept with feedback: 2"):
        expect(result).to_contain_text(said)
    shot(admin, "retention-3-job-done")

    # The archive downloads from there: Parquet, exactly the rows deleted.
    with admin.expect_download() as download:
        admin.locator(".field-download a").click()
    archived = pq.read_table(download.value.path())
    assert download.value.suggested_filename.endswith(".parquet")
    assert archived.num_rows == deleted
    assert set(archived.column("id").to_pylist()) == rollouts_written - kept
    assert set(archived.column("run").to_pylist()) == {run}
    assert set(archived.column("response").to_pylist()) == {f"the answer is {i}" for i in range(REPEATS)}
    assert site.remaining() == kept, "the rated and edited rollouts and the human edit stay"

    day = f"{timezone.now():%Y-%m-%d}"  # the day it was retired, as the server writes it (UTC)

    # The run page says why it cannot be resumed, links the job, and offers no Resume.
    admin.goto(f"/runs/{run}/")
    notice = admin.locator("#run-buffer-retired")
    expect(notice).to_contain_text(f"Buffer retired. This run cannot be resumed: its buffer was archived on "
                                   f"{day} by buffer retention (buffer job {job})")
    expect(notice.get_by_role("link", name="The retention job")).to_have_attribute(
        "href", f"/admin/buffer/bufferjob/{job}/change/")
    expect(notice).to_contain_text("downloads the archive")
    expect(admin.get_by_role("button", name="Resume")).to_have_count(0)
    expect(admin.get_by_role("link", name="Launch again")).to_be_visible()
    # An ended run has no duties to show (no "waiting for a train worker: start one" on it).
    expect(admin.locator("#run-duties")).to_be_hidden()
    shot(admin, "retention-4-run-page-retired")

    # Resume from the page opened before is refused with the reason; the run stays stopped.
    page.get_by_role("button", name="Resume").click()
    page.wait_for_load_state()
    reason = (f"run {run} cannot be resumed: its buffer was archived on {day} by buffer "
              f"retention (buffer job {job}); launch a new run from its config (Launch again)")
    expect(page.locator("body")).to_contain_text(reason)
    expect(page.locator("#run-status")).to_have_text("stopped")
    # So is the API's.
    answer = page.request.post(f"/api/runs/{run}/resume/", headers={"Authorization": f"Bearer {made['token']}"})
    assert (answer.status, answer.json()) == (409, {"error": reason, "status": "stopped"})
    assert errors == []

    # Annotators and researchers never reach the action: the admin is for staff.
    for who in ("ann", "res"):
        other = signed_in(site.base_url, who)
        other.goto("/admin/runs/run/")
        expect(other).to_have_url(re.compile(r"/admin/login/"))
        expect(other.locator("body")).not_to_contain_text(ARCHIVE)


# ---- search ----


def matching(word: str) -> int:
    from django.contrib.postgres.search import SearchQuery

    return Experience.objects.filter(search__document=SearchQuery(word, config="simple")).count()


@pytest.mark.postgres("search documents, their backlog and beat's indexer: SQLite has none, its search reads each "
                      "row's texts (apps/buffer/search.py; tests/apps/buffer/test_admin.py searches on both)")
def test_rows_just_written_are_found_at_once_and_beat_leaves_no_backlog(page, curator, researcher, stack):
    make_taskset("journey-sums", n=TASKS)
    run = Run.objects.create(name="searched run", owner=researcher, config={"buffer": {"taskset": "journey-sums"}})
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write(rollouts(run, 0, "the walrus said"))
    written = TASKS * REPEATS
    assert search.backlog() >= written and matching("walrus") == 0  # no indexer has run

    # The curator searches the Experiences admin for a word of a response: every row is there.
    page.set_viewport_size(VIEWPORT)
    page.goto("/accounts/login/?next=/admin/buffer/experience/")
    page.get_by_label("Username").fill(curator.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/admin/buffer/experience/")
    page.locator("#searchbar").fill("walrus")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"\?q=walrus"))
    expect(page.locator("#result_list tbody tr")).to_have_count(written)
    expect(page.locator("#result_list tbody")).to_contain_text("the walrus said 0")
    expect(page.locator("#changelist-search")).to_contain_text(f"{written} results")
    expect(page.locator(".messagelist")).to_have_count(0)  # no "not searchable yet"
    shot(page, "search-1-experiences-results")
    assert search.backlog() == 0

    # With beat running the indexer, what the explorer writes is indexed within its interval, unasked.
    interval = 1
    processes = stack(RFTWEB_SEARCH_INDEX_INTERVAL=str(interval))
    processes.worker("default")
    processes.beat()
    buffer.write(rollouts(run, 1, "a narwhal wrote"))
    assert search.backlog() >= written
    wait_for(lambda: search.backlog() == 0, timeout=30 * interval, what="beat's indexer to leave no backlog")
    assert matching("narwhal") == written
    page.locator("#searchbar").fill("narwhal")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(written)
