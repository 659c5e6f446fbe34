"""The JSON API: token and session auth, runs, metrics, experiences, launch and controls."""

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.runs.api import token_for
from apps.runs.models import Checkpoint, MetricPoint, Run
from apps.runs.presets import preset_config

Status = Run.Status


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def api(researcher):
    """A script's client: no session, the researcher's token."""
    client = Client(enforce_csrf_checks=True)
    headers = bearer(token_for(researcher))

    def call(method, url, data=None, **extra):
        if method == "post":
            return client.post(
                url, data, content_type=extra.pop("content_type", "application/json"), **headers, **extra
            )
        return client.get(url, data, **headers, **extra)

    return call


def test_a_valid_token_reads_the_runs(api, make_run):
    make_run("alpha", status=Status.RUNNING, trainer_step=50)
    body = api("get", reverse("api-runs")).json()
    assert body["count"] == 1 and body["page"] == 1
    (run,) = body["results"]
    assert run["name"] == "alpha" and run["owner"] == "res" and run["progress"] == 0.5 and run["total_steps"] == 100


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("rft_1_deadbeef"), bearer("nonsense"), {"HTTP_AUTHORIZATION": "Basic cmVzOnB3"}, bearer("")],
    ids=["missing", "wrong", "malformed", "basic", "empty"],
)
def test_without_a_valid_token_it_is_401_json_not_a_redirect(db, headers, researcher):
    response = Client().get(reverse("api-runs"), **headers)
    assert response.status_code == 401 and response["Content-Type"] == "application/json"
    assert response["WWW-Authenticate"].startswith("Bearer") and "error" in response.json()


def test_someone_elses_mac_does_not_pass(db, researcher, curator):
    forged = f"rft_{curator.pk}_{token_for(researcher).rsplit('_', 1)[1]}"
    assert Client().get(reverse("api-runs"), **bearer(forged)).status_code == 401


def test_an_annotator_token_is_403(annotator):
    response = Client().get(reverse("api-runs"), **bearer(token_for(annotator)))
    assert response.status_code == 403 and "researcher" in response.json()["error"]


def test_a_password_change_revokes_the_token(researcher):
    token = token_for(researcher)
    researcher.set_password("a-brand-new-password-9")
    researcher.save()
    assert Client().get(reverse("api-runs"), **bearer(token)).status_code == 401
    assert Client().get(reverse("api-runs"), **bearer(token_for(researcher))).status_code == 200


def test_an_inactive_users_token_is_401(researcher):
    token = token_for(researcher)
    researcher.is_active = False
    researcher.save()
    assert Client().get(reverse("api-runs"), **bearer(token)).status_code == 401


@pytest.mark.parametrize("role, status", [("researcher", 200), ("annotator", 403)])
def test_pages_use_the_api_with_their_session(request, make_run, role, status):
    make_run()
    client = Client()
    client.force_login(request.getfixturevalue(role))
    assert client.get(reverse("api-runs")).status_code == status


def test_a_session_must_pass_the_csrf_check_to_change_things(researcher, make_run):
    run = make_run(status=Status.RUNNING)
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    response = client.post(reverse("api-run-pause", args=[run.pk]))
    assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert Run.objects.get().status == Status.RUNNING


def test_runs_filters(api, make_run, curator):
    make_run("alpha", status=Status.RUNNING)
    make_run("beta", status=Status.COMPLETED, owner=curator)
    names = lambda **q: [r["name"] for r in api("get", reverse("api-runs"), q).json()["results"]]  # noqa: E731
    assert names(status="running") == ["alpha"] and names(owner="cur") == ["beta"] and names(q="ET") == ["beta"]
    assert api("get", reverse("api-runs"), {"status": "bogus"}).status_code == 400


def test_runs_carry_their_tags_and_notes_and_filter_by_tag(api, make_run):
    tagged = make_run("alpha")
    tagged.tags, tagged.notes = ["baseline", "lr-1e-6"], "the reference run"
    tagged.save(update_fields=["tags", "notes"])
    make_run("beta")

    body = api("get", reverse("api-runs"), {"tag": "baseline"}).json()

    assert [(r["name"], r["tags"], r["notes"]) for r in body["results"]] == [
        ("alpha", ["baseline", "lr-1e-6"], "the reference run")
    ]
    assert api("get", reverse("api-run", args=[tagged.pk])).json()["tags"] == ["baseline", "lr-1e-6"]


def test_run_detail(api, make_run):
    run = make_run("alpha", config=preset_config("sft"))
    Checkpoint.objects.create(run=run, version=1, step=50, path="runs/1/v1")
    MetricPoint.objects.create(run=run, role="explorer", step=1, values={"reward_mean": 0.25})
    body = api("get", reverse("api-run", args=[run.pk])).json()
    assert body["config"]["algorithm"]["name"] == "sft" and body["latest_reward"] == 0.25
    assert body["checkpoints"] == [
        {
            "version": 1,
            "step": 50,
            "created_at": body["checkpoints"][0]["created_at"],
            "download_url": reverse("checkpoint-download", args=[run.pk, 1]),
        }
    ]
    assert api("get", reverse("api-run", args=[run.pk + 1])).status_code == 404


def test_metrics_by_role_and_since(api, make_run):
    run = make_run()
    for step in (1, 2, 3):
        MetricPoint.objects.create(run=run, role="trainer", step=step, values={"loss": 1 / step})
    MetricPoint.objects.create(run=run, role="explorer", step=1, values={"reward_mean": 0.1})
    url = reverse("api-run-metrics", args=[run.pk])
    assert list(api("get", url).json()["metrics"]) == ["explorer", "trainer"]
    trainer = api("get", url, {"role": "trainer", "since": 1}).json()["metrics"]["trainer"]
    assert [(p["step"], p["values"]) for p in trainer] == [(2, {"loss": 0.5}), (3, {"loss": 1 / 3})]
    recorded = MetricPoint.objects.get(run=run, role="trainer", step=2).time.timestamp()
    assert abs(trainer[0]["time"] - recorded) < 0.001, "each point says when it was recorded"
    assert api("get", url, {"since": "yesterday"}).status_code == 400


def test_experiences_with_filters_and_pages(api, make_run):
    run = make_run()
    Experience.objects.bulk_create(
        Experience(
            run=run,
            explorer_step=step,
            group_id=f"g{step}",
            rollout_index=i,
            reward=float(i),
            response_text=f"r{i}",
            response_ids=[7] * i,
        )
        for step in (1, 2)
        for i in range(3)
    )
    url = reverse("api-run-experiences", args=[run.pk])
    body = api("get", url, {"min_reward": 1, "page_size": 2}).json()
    assert (body["count"], body["pages"]) == (4, 2)
    first = body["results"][0]
    assert (first["explorer_step"], first["rollout_index"], first["response_tokens"], first["reward"]) == (2, 1, 1, 1.0)
    assert first["annotate_url"] == f"/annotate/experience/{first['id']}/"
    assert api("get", url, {"step": 1, "q": "r2"}).json()["count"] == 1
    assert api("get", url, {"step": -1}).status_code == 400


@pytest.mark.parametrize("query, message", [
    ({"page_size": "0"}, "page_size must be a whole number from 1 to 500"),
    ({"page_size": "-5"}, "page_size must be a whole number from 1 to 500"),
    ({"page_size": "abc"}, "page_size must be a whole number from 1 to 500"),
    ({"page": "0"}, "page must be a whole number from 1"),
    ({"page": "abc"}, "page must be a whole number from 1"),
    ({"page": "99999999999999999999"}, "page must be a whole number from 1"),
])
@pytest.mark.parametrize("route", ["api-runs", "api-run-experiences", "api-tasksets", "api-taskset", "api-sweeps"])
def test_a_page_or_page_size_that_is_no_count_is_a_400_naming_it(api, make_run, route, query, message):
    """page_size=0 and -5 read as 1 and abc as 50: a script's mistake came back as a page it did
    not ask for, where limit=-5 was a 400."""
    from apps.tasksets.models import Taskset

    run = make_run()
    Taskset.objects.create(name="sums")
    args = {"api-run-experiences": [run.pk], "api-taskset": ["sums"]}.get(route, [])
    answer = api("get", reverse(route, args=args), query)
    assert (answer.status_code, answer.json()["error"]) == (400, message)


def test_a_page_past_the_last_answers_the_last_and_a_page_size_past_500_reads_as_500(api, make_run):
    for name in ("a", "b", "c"):
        make_run(name)
    assert api("get", reverse("api-runs"), {"page": "9", "page_size": "2"}).json()["page"] == 2
    assert api("get", reverse("api-runs"), {"page_size": "501"}).json()["pages"] == 1


def test_launch_through_the_api(api, tasksets, worker_queue, django_capture_on_commit_callbacks, researcher):
    with django_capture_on_commit_callbacks(execute=True):
        response = api("post", reverse("api-runs"), {"name": "scripted", "config": preset_config("quick-demo")})
    assert response.status_code == 201
    run = Run.objects.get()
    assert response.json()["id"] == run.pk and run.owner == researcher and worker_queue == [run.pk]


def test_launch_takes_yaml_text(api, tasksets, worker_queue):
    text = yaml.safe_dump(preset_config("sft"))
    assert api("post", reverse("api-runs"), {"name": "y", "config": text}).status_code == 201


def test_launch_reads_yaml_numbers_as_yaml_1_2_does(api, tasksets, worker_queue):
    """`seed: 010` launched with seed 8 (YAML 1.1's octal) and `seed: 1:30` with seed 90 (base 60)."""
    text = yaml.safe_dump({**preset_config("quick-demo"), "seed": 0})
    assert api("post", reverse("api-runs"), {"config": text.replace("seed: 0", "seed: 010")}).status_code == 201
    assert Run.objects.get().config["seed"] == 10
    refused = api("post", reverse("api-runs"), {"config": text.replace("seed: 0", "seed: 1:30")})
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"key": "seed", "message": "expected an integer, got a string"}]


def test_a_control_refused_after_another_request_moved_the_run_names_the_status_it_has_now(
        api, make_run, monkeypatch):
    """Three resumes of a stopped run at once: the ones refused answered "run 2 is queued: ..." beside
    "status": "stopped", the status read before the other request's resume (a reviewer's finding)."""
    from apps.runs.api import routes
    from apps.runs.controls import control_run

    run = make_run(status=Status.STOPPED)

    def another_request_first(run, action, user):
        Run.objects.filter(pk=run.pk).update(status=Status.QUEUED)  # the other resume, committed
        return control_run(run, action, user)

    monkeypatch.setattr(routes, "control_run", another_request_first)
    refused = api("post", reverse("api-run-resume", args=[run.pk]))
    assert refused.status_code == 409
    assert refused.json()["status"] == "queued" and "is queued" in str(refused.json())


def test_an_invalid_launch_lists_its_errors_and_creates_nothing(api, tasksets, worker_queue):
    config = preset_config("quick-demo")
    config["algorithm"]["kl"]["coef"] = -1
    config["buffer"]["taskset"] = "nope"
    response = api("post", reverse("api-runs"), {"name": "bad", "config": config})
    assert response.status_code == 400
    assert [e["key"] for e in response.json()["errors"]] == ["algorithm.kl.coef"]  # the schema speaks first
    assert api("post", reverse("api-runs"), {"config": "a: [unclosed"}).json()["errors"][0]["key"] == "<config>"
    assert api("post", reverse("api-runs"), "not json", content_type="text/plain").status_code == 400
    assert not Run.objects.exists() and worker_queue == []


def test_a_run_stopped_before_it_copied_its_expert_dataset_keeps_it_from_the_admins_delete(
        api, tasksets, worker_queue, curator):
    """The hostile tester's steps: launch on the expert dataset hx, stop the run while it is queued,
    delete hx in the admin. The delete went through, and the run's Resume failed for good
    ("buffer.expert_dataset: no expert dataset is named 'hx'")."""
    from apps.buffer.models import ExpertDataset

    dataset = ExpertDataset.objects.create(name="hx", layout="sft")
    config = {"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_dataset": "hx"},
              "trainer": {"total_steps": 3}}
    launched = api("post", reverse("api-runs"), {"name": "on hx", "config": config})
    assert launched.status_code == 201, launched.content
    run = Run.objects.get()
    assert api("post", reverse("api-run-stop", args=[run.pk])).json()["status"] == "stopped"
    admin = Client()
    admin.force_login(curator)
    delete = reverse("admin:buffer_expertdataset_delete", args=[dataset.pk])
    page = admin.post(delete, {"post": "yes"}).content.decode()
    assert "Cannot delete expert dataset" in page
    assert (f"Run on hx (#{run.pk}) names &#x27;hx&#x27;, which it has not copied, and is stopped: it can be "
            "resumed; delete the run first") in page
    assert ExpertDataset.objects.filter(name="hx").exists()


def test_controls(api, make_run):
    run = make_run(status=Status.RUNNING)
    response = api("post", reverse("api-run-pause", args=[run.pk]))
    assert response.status_code == 200 and response.json()["status"] == "paused"
    refused = api("post", reverse("api-run-pause", args=[run.pk]))
    assert refused.status_code == 409 and refused.json()["status"] == "paused"
    assert api("get", reverse("api-run-stop", args=[run.pk])).status_code == 405
