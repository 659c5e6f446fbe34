"""Who reaches what: every URL and websocket route x anonymous, annotator, the run's owner, another
researcher (someone else's run) and a curator.

The URL resolver and the websocket routing are walked, so a new URL or route without an entry in
the matrix fails `test_every_url_has_a_matrix_entry`. Expected outcomes:
  A  allowed: the view answers (2xx, a redirect elsewhere, or 400/409 on the empty form it got)
  L  sent to the login page          U  401 JSON (API)          D  403 (admin: its own login page)
  R  refused by the view with a message, and nothing changed (a redirect back)
  N  404, as if it did not exist: someone else's thing whose ids must not be probed
"""
import json
import shutil
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import pytest
from django.conf import settings
from django.contrib import admin
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from apps.accounts.apps import CURATED_APPS
from apps.accounts.roles import ANNOTATOR, CURATOR, RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.feedback.models import Feedback, RunAnnotators
from apps.runs.api import token_for
from apps.runs.models import Checkpoint, Report, Run, RunListColumns, RunListView, Sweep, Worker
from apps.runs.supervision import run_dir
from apps.saved_models.models import ModelAlias, SavedModel
from apps.saved_models.naming import set_alias
from apps.saved_models.services import models_root, save_model
from apps.tasksets.models import Task, Taskset, TasksetImport
from rftweb.routing import websocket_urlpatterns
from tests.support import websocket_connects

PRINCIPALS = ("anonymous", "annotator", "owner", "other", "curator")
JOB_LABEL = "tasksets.tasksetimport"  # the world's job is a taskset import
Status = Run.Status


@dataclass
class Entry:
    expected: str  # one letter per principal, in PRINCIPALS order
    method: str = "get"
    kwargs: Callable = lambda o: {}
    data: Callable = lambda o: {}
    run_status: str = Status.RUNNING
    changed: Callable | None = None  # for a change: did it happen? (it must exactly when allowed)
    api: bool = False  # called with the user's bearer token instead of the session
    extra: dict = field(default_factory=dict)  # more of the client call's arguments: a JSON body's content_type


run = lambda o: {"pk": o.run.pk}  # noqa: E731
run_id = lambda o: {"run_id": o.run.pk}  # noqa: E731
item = lambda o: {"pk": o.experience.pk}  # noqa: E731


def status_is(status):
    return lambda o: Run.objects.get(pk=o.run.pk).status == status


MATRIX = {
    # accounts: the login page is public; logout (POST) always lands on the login page.
    "login": Entry("AAAAA"),
    "favicon": Entry("AAAAA"),  # a redirect to the static icon, which the login page shows too
    "logout": Entry("LLLLL", method="post"),
    "password_change": Entry("LAAAA"),  # everyone changes their own password (and so revokes their token)
    "password_change_done": Entry("LAAAA"),
    # people: curators add users, set roles and assign annotators; nobody else sees them
    "people": Entry("LDDDA"),
    "person-detail": Entry("LDDDA", kwargs=lambda o: {"pk": o.users["annotator"].pk}),
    "person-roles": Entry(
        "LDDDA", method="post", kwargs=lambda o: {"pk": o.users["annotator"].pk},
        data=lambda o: {"roles": ["annotator", "reviewer"], "active": "on"},
        changed=lambda o: o.users["annotator"].groups.filter(name="reviewer").exists(),
    ),
    "person-assign": Entry(
        "LDDDA", method="post", kwargs=lambda o: {"pk": o.users["annotator"].pk}, data=lambda o: {"run": o.run.pk},
        changed=lambda o: RunAnnotators.objects.filter(run=o.run, users=o.users["annotator"]).exists(),
    ),
    "person-unlock": Entry("LDDDA", method="post", kwargs=lambda o: {"pk": o.users["annotator"].pk}),
    # tasksets: researchers; an import job is its uploader's (and curators')
    "taskset-list": Entry("LDAAA"),
    "taskset-upload": Entry("LDAAA"),
    "taskset-import": Entry("LDANA", kwargs=lambda o: {"pk": o.job.pk}),
    "taskset-import-cancel": Entry(
        "LDANA", method="post", kwargs=lambda o: {"pk": o.job.pk},
        changed=lambda o: TasksetImport.objects.get(pk=o.job.pk).status == TasksetImport.Status.CANCELLED,
    ),
    # a job's progress (an import here): whoever may see the job
    "job-progress": Entry("LNANA", kwargs=lambda o: {"label": JOB_LABEL, "pk": o.job.pk}),
    "taskset-detail": Entry("LDAAA", kwargs=lambda o: {"name": o.taskset.name}),
    # annotation: annotators and up; a run's feedback stats and who annotates it: researchers
    "annotate-start": Entry("LAAAA"),
    "annotate-next": Entry("LAAAA"),
    "annotate-experience": Entry("LAAAA", kwargs=item),
    "annotate-skip": Entry("LAAAA", method="post", kwargs=item),
    "annotate-postpone": Entry("LAAAA", method="post", kwargs=item),
    "annotate-rate": Entry("LAAAA", method="post", kwargs=item, data=lambda o: {"point": "3"}),
    "annotate-edit": Entry("LAAAA", method="post", kwargs=item, data=lambda o: {"text": "a better answer"}),
    "annotate-compare": Entry("LAAAA", method="post", kwargs=item),
    "annotate-flag": Entry("LAAAA", method="post", kwargs=item, data=lambda o: {"reason": "garbled"}),
    "annotate-run-feedback": Entry("LDAAA", kwargs=run_id),
    # review: reviewers (curators are); the owner (a researcher) is none. Nothing waits here: a
    # decision on a judgement that asked no review is refused with a message.
    "review-start": Entry("LDDDA"),
    "review-next": Entry("LDDDA", kwargs=run_id),
    "review-accept": Entry("LDDDA", method="post", kwargs=lambda o: {"pk": o.feedback.pk}),
    "review-reject": Entry("LDDDA", method="post", kwargs=lambda o: {"pk": o.feedback.pk}),
    "review-history": Entry("LDDDA", kwargs=run_id),
    # a change of the curator's own decision only: the world's judgement was never reviewed (refused, a message)
    "review-change": Entry("LDDDA", method="post", kwargs=lambda o: {"pk": o.feedback.pk},
                           data=lambda o: {"to": "accept"}),
    "annotate-export": Entry("LDAAA", kwargs=run_id),
    "annotate-run-summary": Entry("LDAAA", kwargs=run_id),
    # bulk flag: the run's owner and curators, as who assigns its annotators
    "annotate-bulk-flag": Entry("LDADA", kwargs=run_id),
    # (the world's one item has the judgement it needs: refused by the flag, tests/apps/feedback/test_bulk_flag.py)
    "annotate-bulk-flag-confirm": Entry(
        "LDADA", method="post", kwargs=run_id, data=lambda o: {"source": "rollout", "count": "1", "reason": "garbled"},
    ),
    "annotate-bulk-flag-undo": Entry("LDADA", method="post", kwargs=run_id),
    "annotate-assign": Entry(
        "LDARA", method="post", kwargs=run_id, data=lambda o: {"usernames": "ann"},
        changed=lambda o: RunAnnotators.objects.filter(run=o.run).exists(),
    ),
    # the dashboard: every researcher watches every run; only its owner and curators control it
    "home": Entry("LAAAA"),
    "plotly-js": Entry("LAAAA"),
    "run-list": Entry("LDAAA"),
    # the runs list's CSV, as the list (a token too: tests/security/test_runs_table.py); the column
    # picker saves each researcher's own choice
    "run-list-csv": Entry("LDAAA", data=lambda o: {"cols": "status,trainer.lr"}),
    "run-list-columns": Entry(
        "LDAAA", method="post", data=lambda o: {"cols": ["trainer.lr"]},
        changed=lambda o: RunListColumns.objects.filter(columns=["trainer.lr"]).exists(),
    ),
    "run-launch": Entry("LDAAA"),
    "run-compare": Entry("LDAAA", data=lambda o: {"runs": [o.run.pk]}),
    "run-detail": Entry("LDAAA", kwargs=run),
    "run-live": Entry("LDAAA", kwargs=run),
    "run-rollouts": Entry("LDAAA", kwargs=run),
    "checkpoint-download": Entry("LDAAA", kwargs=lambda o: {"pk": o.run.pk, "version": 1}),
    "run-pause": Entry("LDADA", method="post", kwargs=run, changed=status_is(Status.PAUSED)),
    "run-resume": Entry(
        "LDADA", method="post", kwargs=run, run_status=Status.PAUSED, changed=status_is(Status.RUNNING)
    ),
    "run-stop": Entry("LDADA", method="post", kwargs=run, changed=status_is(Status.STOPPING)),
    "run-explorers": Entry(
        "LDADA", method="post", kwargs=run, data=lambda o: {"engine_num": "1"},
        changed=lambda o: Run.objects.get(pk=o.run.pk).config.get("explorer", {}).get("engine_num") == 1,
    ),
    "run-list-views": Entry(  # each researcher's own saved views of the runs list
        "LDAAA", method="post", data=lambda o: {"name": "mine", "query": "sort=name"},
        changed=lambda o: RunListView.objects.filter(name="mine").exists(),
    ),
    "run-bulk-stop": Entry(
        "LDARA", method="post", data=lambda o: {"runs": [o.run.pk]}, changed=status_is(Status.STOPPING)
    ),
    "api-token": Entry("LDAAA"),
    # sweeps: every researcher sees every sweep (launching one is the launch form's)
    "sweep-list": Entry("LDAAA"),
    "sweep-detail": Entry("LDAAA", kwargs=lambda o: {"pk": o.sweep.pk}),
    "api-sweeps": Entry("UDAAA", api=True),
    "api-sweep": Entry("UDAAA", api=True, kwargs=lambda o: {"pk": o.sweep.pk}),
    # reports: every researcher opens and saves them; only a report's owner and curators change it
    "report-list": Entry("LDAAA"),
    "report-save": Entry("LDAAA", method="post", data=lambda o: {"runs": str(o.run.pk), "name": "saved"}),
    "report-detail": Entry("LDAAA", kwargs=lambda o: {"pk": o.report.pk}),
    "report-edit": Entry(
        "LDADA", method="post", kwargs=lambda o: {"pk": o.report.pk}, data=lambda o: {"name": "renamed", "version": 0},
        changed=lambda o: Report.objects.get(pk=o.report.pk).name == "renamed",
    ),
    # saved models: every researcher sees, saves (as any downloads a checkpoint) and trains from
    # them; only who saved one and curators delete it
    "model-list": Entry("LDAAA"),
    "model-save": Entry(
        "LDAAA", method="post", kwargs=lambda o: {"run": o.run.pk, "version": 1}, data=lambda o: {"name": "m1"},
        changed=lambda o: SavedModel.objects.filter(name="m1").exists(),
    ),
    "model-download": Entry("LDAAA", kwargs=lambda o: {"name": o.saved.name}),
    "model-detail": Entry("LDAAA", kwargs=lambda o: {"name": o.saved.name}),
    # renaming and aliasing one: as deleting it (PATCH /api/models/<name>/, the rename's API, shares
    # api-model's URL: tests/apps/saved_models/test_rename.py checks who may)
    "model-rename": Entry(
        "LDADA", method="post", kwargs=lambda o: {"name": o.saved.name}, data=lambda o: {"name": "renamed-m"},
        changed=lambda o: SavedModel.objects.filter(pk=o.saved.pk, name="renamed-m").exists(),
    ),
    "model-alias": Entry(
        "LDADA", method="post", kwargs=lambda o: {"name": o.saved.name}, data=lambda o: {"alias": "challenger"},
        changed=lambda o: ModelAlias.objects.filter(model=o.saved, name="challenger").exists(),
    ),
    "api-model-aliases": Entry(
        "UDADA", api=True, method="post", kwargs=lambda o: {"name": o.saved.name},
        data=lambda o: json.dumps({"alias": "challenger"}), extra={"content_type": "application/json"},
        changed=lambda o: ModelAlias.objects.filter(model=o.saved, name="challenger").exists(),
    ),
    "api-model-alias": Entry(  # the world's model is champion
        "UDADA", api=True, method="delete", kwargs=lambda o: {"name": o.saved.name, "alias": "champion"},
        changed=lambda o: not ModelAlias.objects.filter(model=o.saved, name="champion").exists(),
    ),
    "model-delete": Entry(
        "LDADA", method="post", kwargs=lambda o: {"name": o.saved.name},
        changed=lambda o: not SavedModel.objects.filter(pk=o.saved.pk).exists(),
    ),
    "api-models": Entry("UDAAA", api=True),
    "api-model": Entry(
        "UDADA", api=True, method="delete", kwargs=lambda o: {"name": o.saved.name},
        changed=lambda o: not SavedModel.objects.filter(pk=o.saved.pk).exists(),
    ),
    # alerts: each researcher's own settings, test send and webhook secret
    "alert-settings": Entry("LDAAA"),
    "alert-test": Entry("LDAAA", method="post"),
    "alert-secret": Entry("LDAAA", method="post"),
    # [runs-compare helper entries]
    # every researcher reads every run's metrics; only its owner and curators edit its notes and tags
    "run-metrics-csv": Entry("LDAAA", kwargs=run),
    "run-metrics-json": Entry("LDAAA", kwargs=run),
    "compare-metrics-csv": Entry("LDAAA", data=lambda o: {"runs": [o.run.pk]}),
    "compare-metrics-json": Entry("LDAAA", data=lambda o: {"runs": [o.run.pk]}),
    "run-notes": Entry(
        "LDADA", method="post", kwargs=run, data=lambda o: {"notes": "lr too high", "tags": "baseline", "version": 0},
        changed=lambda o: Run.objects.get(pk=o.run.pk).tags == ["baseline"],
    ),
    # [run-page helper entries]
    "run-logs": Entry("LDAAA", kwargs=run),  # every researcher watches every run, its log too
    "run-distributions": Entry("LDAAA", kwargs=run),
    # [annotation helper entries]
    # the annotation page's JSON: annotators and up (an empty or form body is a 400 naming the problem)
    "annotate-api-next": Entry("LAAAA"),
    "annotate-api-item": Entry("LAAAA", kwargs=item),
    "annotate-api-judge": Entry("LAAAA", method="post", kwargs=lambda o: {"pk": o.experience.pk, "action": "flag"}),
    "annotate-api-undo": Entry("LAAAA", method="post"),
    "annotate-api-progress": Entry("LAAAA"),
    # capacity: every researcher sees every worker and what it holds (run names included)
    "worker-list": Entry("LDAAA"),
    # a curator hands a held duty back or stops its run from the Workers page (none is held here: a
    # message says so, and the page comes back)
    "worker-duty": Entry("LDDDA", method="post", kwargs=lambda o: {"pk": o.run.pk, "duty": "loop",
                                                                   "action": "hand-back"}),
    "api-workers": Entry("UDAAA", api=True),
    # one worker's page and its JSON: as the Workers page (a name with odd characters, quoted)
    "worker-detail": Entry("LDAAA", kwargs=lambda o: {"name": o.worker.name}),
    "api-worker": Entry("UDAAA", api=True, kwargs=lambda o: {"name": o.worker.name}),
    # a curator drains or undrains one through the API too (this one is lost: a 409 says so, nothing changed)
    "api-worker-drain": Entry("UDDDA", api=True, method="post", kwargs=lambda o: {"name": o.worker.name}),
    "api-worker-undrain": Entry("UDDDA", api=True, method="post", kwargs=lambda o: {"name": o.worker.name}),
    # a curator drains or undrains a worker (this one is lost: a message says so, and its page comes back)
    "worker-drain": Entry("LDDDA", method="post", kwargs=lambda o: {"name": o.worker.name}),
    "worker-undrain": Entry("LDDDA", method="post", kwargs=lambda o: {"name": o.worker.name}),
    # tasksets through the API: researchers; an import is its uploader's (and curators'), as on the pages
    "api-tasksets": Entry("UDAAA", api=True),
    "api-taskset": Entry("UDAAA", api=True, kwargs=lambda o: {"name": o.taskset.name}),
    "api-taskset-import": Entry("UDANA", api=True, kwargs=lambda o: {"pk": o.job.pk}),
    # the JSON API, with each user's token
    "api-index": Entry("UDAAA", api=True),
    "api-schema": Entry("UDAAA", api=True),  # the OpenAPI document, as the API it describes
    "api-docs": Entry("LDAAA"),  # Swagger UI over it: a page, for a logged-in researcher
    "api-runs": Entry("UDAAA", api=True),
    "api-run": Entry("UDAAA", api=True, kwargs=run),
    "api-run-duties": Entry("UDAAA", api=True, kwargs=run),
    "api-run-metrics": Entry("UDAAA", api=True, kwargs=run),
    "api-run-experiences": Entry("UDAAA", api=True, kwargs=run),
    "api-run-annotation": Entry("UDAAA", api=True, kwargs=run),
    # the bulk flag's count (the POST flags with the same check, tests/apps/feedback/test_bulk_flag_api.py)
    "api-run-bulk-flag": Entry("UDADA", api=True, kwargs=run, data=lambda o: {"reward_max": "0.5"}),
    "api-run-bulk-flag-undo": Entry("UDADA", api=True, method="post", kwargs=run),
    "api-run-pause": Entry("UDADA", api=True, method="post", kwargs=run, changed=status_is(Status.PAUSED)),
    "api-run-resume": Entry(
        "UDADA", api=True, method="post", kwargs=run, run_status=Status.PAUSED, changed=status_is(Status.RUNNING)
    ),
    "api-run-stop": Entry("UDADA", api=True, method="post", kwargs=run, changed=status_is(Status.STOPPING)),
}

WS_MATRIX = {
    "ws/runs/<int:run_id>/": "DDAAA",
    "ws/annotate/<int:run_id>/": "DAAAA",
    "ws/jobs/<str:label>/<int:job_id>/": "DDADA",
}


def url_names() -> set[str]:
    """Every named URL outside the admin (the admin is checked model by model below)."""
    names = set()

    def walk(patterns, namespace):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, pattern.namespace or namespace)
            elif isinstance(pattern, URLPattern) and namespace != "admin":
                assert pattern.name, f"URL {pattern.pattern} has no name; name it and add it to the matrix"
                names.add(pattern.name)

    walk(get_resolver().url_patterns, None)
    return names


def test_every_url_has_a_matrix_entry():
    assert url_names() == set(MATRIX), "add the new URL to MATRIX (or drop the entry of a removed one)"


def test_every_websocket_route_has_a_matrix_entry():
    assert {str(route.pattern) for route in websocket_urlpatterns} == set(WS_MATRIX)


def role_users() -> dict:
    """A user of each principal but anonymous: an annotator, the run's owner, another researcher, a curator."""
    return {
        "annotator": create_user("ann", "pw-for-tests-123", roles=(ANNOTATOR,)),
        "owner": create_user("owner", "pw-for-tests-123", roles=(RESEARCHER,)),
        "other": create_user("other", "pw-for-tests-123", roles=(RESEARCHER,)),
        "curator": create_user("cur", "pw-for-tests-123", roles=(CURATOR,)),
    }


@pytest.fixture
def world(db, settings):
    """Users of each role, a run of `owner` with an experience and a checkpoint, an import job."""

    class World:
        pass

    o = World()
    o.users = role_users()
    o.taskset = Taskset.objects.create(name="ts", task_count=1)
    task = Task.objects.create(taskset=o.taskset, index=0, prompt="1+1?", answer="2")
    # Held by a live worker, so that a stop asks it to stop (a run no worker holds stops at once).
    beat = {"at": timezone.now().isoformat(), "worker": "test-worker"}
    o.sweep = Sweep.objects.create(name="s", owner=o.users["owner"], method="grid", space=[], count=1, base_config={})
    o.run = Run.objects.create(name="r", owner=o.users["owner"], config={}, heartbeats={"loop": beat}, sweep=o.sweep)
    # Lost an hour ago: shown for a day, and counted by no launch or stop.
    seen = timezone.now() - timedelta(hours=1)
    o.worker = Worker.objects.create(name="train@gpu 1/ü", host="elsewhere", pid=1, queues=["train"], slots=1,
                                     started_at=seen, last_seen=seen)
    o.report = Report.objects.create(name="report", owner=o.users["owner"], run_ids=[o.run.pk])
    o.experience = Experience.objects.create(
        run=o.run, task=task, explorer_step=0, rollout_index=0, group_id="g0", prompt_text="1+1?", response_text="2",
        prompt_ids=[1], response_ids=[2], action_mask=[1], logprobs=[-0.1], reward=1.0, model_version=0,
    )
    o.feedback = Feedback.objects.create(experience=o.experience, user=o.users["annotator"], kind="rating",
                                         value=1.0, label="5")
    directory = run_dir(o.run) / "checkpoints" / "v1"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "weights.bin").write_bytes(b"w")
    Checkpoint.objects.create(run=o.run, version=1, step=1, path=str(directory))
    o.saved = save_model(o.run, 1, "saved-by-owner", o.users["owner"])
    set_alias(o.saved, "champion", o.users["owner"])
    o.job = TasksetImport.objects.create(
        original_filename="t.jsonl", name="new-ts", format="jsonl", default_workflow="single_turn",
        default_reward_fn="exact_match", created_by=o.users["owner"],
    )
    yield o
    shutil.rmtree(directory, ignore_errors=True)
    for name in ("saved-by-owner", "m1", "renamed-m"):
        shutil.rmtree(models_root() / name, ignore_errors=True)


def outcome(response) -> str:
    location = response.headers.get("Location", "")
    if response.status_code == 401:
        return "U"
    if response.status_code == 403 or (response.status_code == 302 and location.startswith("/admin/login/")):
        return "D"
    if response.status_code == 302 and location.startswith(reverse("login")):
        return "L"
    if response.status_code == 404:
        return "N"
    if response.status_code in (200, 201, 204, 301, 302, 400, 409):
        return "A"
    return f"unexpected {response.status_code}"


def call(o, principal: str, entry: Entry, url: str):
    client = Client()
    user = o.users.get(principal)
    headers = {}
    if entry.api and user is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token_for(user)}"
    elif user is not None:
        client.force_login(user)
    return getattr(client, entry.method)(url, entry.data(o), **headers, **entry.extra)


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("name", sorted(MATRIX))
def test_access(world, name, principal):
    entry = MATRIX[name]
    Run.objects.filter(pk=world.run.pk).update(status=entry.run_status)
    expected = entry.expected[PRINCIPALS.index(principal)]
    response = call(world, principal, entry, reverse(name, kwargs=entry.kwargs(world)))
    got = outcome(response)
    if expected == "R":  # the view answers, but refuses: a message and a redirect, nothing changed
        assert got == "A" and response.status_code == 302, (name, principal, response.status_code)
    else:
        assert got == expected, (name, principal, response.status_code, response.headers.get("Location"))
    if entry.changed is not None:
        assert entry.changed(world) == (expected == "A"), (name, principal, "change")


# Routes whose URL name MATRIX holds for another method: one entry per name there.
OTHER_METHODS = {
    # GET /api/models/<name>/ (api-model's entry is its DELETE): every researcher reads every model
    "api-model": Entry("UDAAA", api=True, kwargs=lambda o: {"name": o.saved.name}),
}


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("name", sorted(OTHER_METHODS))
def test_access_by_another_method(world, name, principal):
    entry = OTHER_METHODS[name]
    response = call(world, principal, entry, reverse(name, kwargs=entry.kwargs(world)))
    assert outcome(response) == entry.expected[PRINCIPALS.index(principal)], (name, principal, response.status_code)


ITEM_ROUTES = ("annotate-experience", "annotate-skip", "annotate-postpone", "annotate-rate", "annotate-edit",
               "annotate-compare", "annotate-flag")


@pytest.mark.parametrize("principal", ["annotator", "owner", "curator"])
@pytest.mark.parametrize("name", ITEM_ROUTES)
def test_a_run_restricted_to_no_annotators_refuses_every_item_route_to_an_annotator(world, name, principal):
    """The owner assigns nobody: a plain annotator gets a 403 on reading, taking, setting aside and
    judging its items (its owner and curators still may)."""
    RunAnnotators.objects.create(run=world.run, open_to_all=False)
    entry = MATRIX[name]
    response = call(world, principal, entry, reverse(name, kwargs=entry.kwargs(world)))
    assert outcome(response) == ("D" if principal == "annotator" else "A"), (name, principal, response.status_code)


# ---- the admin: curators only, and never the user accounts ---------------------------------------

# Experiences come from runs and imports, jobs from their forms: the admin adds none of them by hand.
NOT_ADDED_BY_HAND = {
    ("buffer", "experience"), ("buffer", "bufferjob"), ("tasksets", "tasksetimport"),
    ("buffer", "expertdataset"),  # imports make them
    ("runs", "run"), ("runs", "checkpoint"),  # workers make them; an admin could plant a config or a path
    ("runs", "sweep"), ("alerts", "alert"),  # the launch form makes sweeps, events make alerts
    # judgements come from annotating, metric points from workers: the feedback services keep
    # training in step with judgements, and a metric point is a figure some worker measured
    ("feedback", "feedback"), ("runs", "metricpoint"),
}
ADMIN_PAGES = sorted(
    (model._meta.app_label, model._meta.model_name, page)
    for model in admin.site._registry
    for page in ("changelist", "add")
)


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("app_label, model_name, page", ADMIN_PAGES)
def test_admin_access(world, principal, app_label, model_name, page):
    expected = {"anonymous": "L", "annotator": "D", "owner": "D", "other": "D"}.get(principal)
    if principal == "curator":
        by_hand = page != "add" or (app_label, model_name) not in NOT_ADDED_BY_HAND
        expected = "A" if app_label in CURATED_APPS and by_hand else "D"
    response = call(world, principal, Entry(expected), reverse(f"admin:{app_label}_{model_name}_{page}"))
    got = outcome(response)
    assert got == expected, (app_label, model_name, page, principal, response.status_code)


# ---- websockets -----------------------------------------------------------------------------------


def ws_path(route: str, o, *, missing: bool = False) -> str:
    """The route's path for the world's run or job (`missing`: one that does not exist)."""
    unknown = 1000 if missing else 0
    path = route.replace("<int:run_id>", str(o.run.pk + unknown))
    path = path.replace("<str:label>", JOB_LABEL).replace("<int:job_id>", str(o.job.pk + unknown))
    return "/" + path


def ws_accepts(o, principal: str, path: str, origin: bytes = b"http://localhost") -> bool:
    headers = [(b"host", b"localhost")] + ([(b"origin", origin)] if origin else [])
    user = o.users.get(principal)
    if user is not None:
        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
    return websocket_connects(path, headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("route", sorted(WS_MATRIX))
def test_websocket_access(world, route, principal):
    path = ws_path(route, world)
    expected = WS_MATRIX[route][PRINCIPALS.index(principal)] == "A"
    assert ws_accepts(world, principal, path) == expected


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin",
    [b"https://evil.example", b"http://localhost.evil.example", b"null", b"", b"http://localhost:9999", b"https://localhost"],
)
@pytest.mark.parametrize("route", sorted(WS_MATRIX))
def test_websocket_refuses_a_foreign_or_missing_origin(world, route, origin):
    path = ws_path(route, world)
    assert not ws_accepts(world, "curator", path, origin=origin)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WS_MATRIX))
def test_websocket_refuses_a_run_or_job_that_does_not_exist(world, route):
    assert not ws_accepts(world, "curator", ws_path(route, world, missing=True))
