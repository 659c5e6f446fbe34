"""The dashboard pages: runs list, run page and its controls, live snapshot, rollouts, compare, downloads."""

import gzip
import io
import json
import re
import tarfile

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.runs import services
from apps.runs.live import publisher
from apps.runs.models import Checkpoint, MetricPoint, Run
from apps.runs.store import DjangoCheckpointStore
from apps.runs.supervision import run_dir
from apps.runs.views import PLOTLY_VERSION

Status = Run.Status


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


# ---- runs list ----------------------------------------------------------------------------------


def test_list_shows_progress_reward_and_owner(researcher_client, make_run):
    run = make_run("alpha", status=Status.RUNNING, trainer_step=25)
    MetricPoint.objects.create(run=run, role="explorer", step=3, values={"reward_mean": 0.5})
    MetricPoint.objects.create(run=run, role="explorer", step=4, values={"reward_mean": 0.75})
    html = researcher_client.get(reverse("run-list")).content.decode()
    assert "alpha" in html and "25 / 100" in html and 'style="width: 25%"' in html
    assert "0.750" in html and "res" in html


@pytest.fixture
def three_runs(make_run, researcher, curator):
    return {
        "alpha": make_run("alpha-grpo", status=Status.RUNNING),
        "beta": make_run("beta-grpo", status=Status.COMPLETED),
        "gamma": make_run("gamma-sft", status=Status.RUNNING, owner=curator),
    }


@pytest.mark.parametrize(
    "query, expected",
    [
        ({}, {"alpha-grpo", "beta-grpo", "gamma-sft"}),
        ({"status": "running"}, {"alpha-grpo", "gamma-sft"}),
        ({"owner": "cur"}, {"gamma-sft"}),
        ({"q": "GRPO"}, {"alpha-grpo", "beta-grpo"}),
        ({"q": "grpo", "status": "completed", "owner": "res"}, {"beta-grpo"}),
    ],
)
def test_list_filters_and_search(researcher_client, three_runs, query, expected):
    response = researcher_client.get(reverse("run-list"), query)
    assert {run.name for run in response.context["runs"]} == expected


def test_list_owner_choices_are_the_run_owners(researcher_client, three_runs, annotator):
    owners = researcher_client.get(reverse("run-list")).context["filters"].fields["owner"].queryset
    assert set(owners.values_list("username", flat=True)) == {"res", "cur"}


def test_bulk_stop_stops_what_it_can_and_names_the_rest(researcher_client, make_run):
    queued, running, done = make_run("q"), make_run("r", status=Status.RUNNING), make_run("d", status=Status.COMPLETED)
    back = reverse("run-list") + "?status=running"
    response = researcher_client.post(
        reverse("run-bulk-stop"), {"runs": [queued.pk, running.pk, done.pk], "next": back}
    )
    assert response.status_code == 302 and response["Location"] == back
    statuses = dict(Run.objects.values_list("name", "status"))
    assert statuses == {"q": Status.STOPPED, "r": Status.STOPPING, "d": Status.COMPLETED}
    notes = messages_of(response)
    assert any("Stopping 2 runs" in note for note in notes)
    assert any(f"Could not stop {isolate('d')} (completed)" in note for note in notes)


def test_bulk_stop_says_whose_run_it_did_not_stop(researcher_client, make_run, curator):
    theirs = make_run("theirs", owner=curator, status=Status.RUNNING)
    notes = messages_of(researcher_client.post(reverse("run-bulk-stop"), {"runs": [theirs.pk]}))
    theirs_and_owner = f"{isolate('theirs')} ({isolate('cur')})"
    assert notes == [f"Could not stop {theirs_and_owner}: only a run's owner or a curator stops it."]
    assert Run.objects.get().status == Status.RUNNING


def test_bulk_stop_ignores_a_foreign_next(researcher_client, make_run):
    response = researcher_client.post(
        reverse("run-bulk-stop"), {"runs": [make_run().pk], "next": "https://evil.example/"}
    )
    assert response["Location"] == reverse("run-list")


def test_bulk_stop_needs_post_and_the_role(researcher_client, annotator_client, make_run):
    run = make_run()
    assert researcher_client.get(reverse("run-bulk-stop")).status_code == 405
    assert annotator_client.post(reverse("run-bulk-stop"), {"runs": [run.pk]}).status_code == 403
    assert Run.objects.get().status == Status.QUEUED


# ---- run page and controls ----------------------------------------------------------------------


def test_run_page_has_the_charts_the_socket_and_the_run(researcher_client, make_run):
    run = make_run(
        "live-one",
        status=Status.RUNNING,
        error="CUDA out of memory",
        config={"trainer": {"total_steps": 10}, "algorithm": {"name": "grpo"}},
    )
    Checkpoint.objects.create(run=run, version=3, step=30, path="runs/1/v3")
    response = researcher_client.get(reverse("run-detail", args=[run.pk]))
    html = response.content.decode()
    page = json.loads(html.split('id="run-page-data" type="application/json">')[1].split("</script>")[0])
    assert page["ws_path"] == f"/ws/runs/{run.pk}/" and page["live_url"] == reverse("run-live", args=[run.pk])
    assert 'id="charts"' in html and f'{reverse("plotly-js")}?v={PLOTLY_VERSION}' in html
    assert "CUDA out of memory" in html and "total_steps: 10" in html
    assert reverse("checkpoint-download", args=[run.pk, 3]) in html
    assert f'href="/runs/{run.pk}/rollouts/"' in html
    assert '<span class="live-dot" id="live-dot">connecting</span>' in html


@pytest.mark.parametrize("trainer, model, says", [
    ({"strategy": "single", "num_processes": 1, "num_nodes": 1}, {"path": "tiny"}, None),
    ({"strategy": "ddp", "num_processes": 2, "num_nodes": 1}, {"path": "tiny"},
     "tiny on addition · trainer ddp, 2 ranks ·"),
    ({"strategy": "ddp", "num_processes": 4, "num_nodes": 2}, {"path": "tiny", "lora": {"r": 8}},
     "tiny + LoRA r8 on addition · trainer ddp, 4 ranks × 2 machines ·"),
])
def test_the_run_page_says_how_the_trainer_is_scaled(researcher_client, make_run, trainer, model, says):
    run = make_run(config={"trainer": trainer, "model": model, "buffer": {"taskset": "addition"}})
    html = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    meta = " ".join(re.sub(r"<[^>]+>", "", html.split('class="run-meta muted">')[1].split("</p>")[0]).split())
    assert ("trainer" not in meta) if says is None else (says in meta), meta


def test_the_run_page_opens_its_charts_as_a_link_says(researcher_client, make_run):
    """run_detail did not pass ?filter= to the toolbar (compare did): a shared link lost it. The
    smoothing, log scale and x axis travel the same way (chart_toolbar.js keeps them in the URL)."""
    run = make_run(status=Status.RUNNING)
    url = reverse("run-detail", args=[run.pk])
    linked = {"filter": "kl", "smoothing": "0.25", "log": "1", "x": "relative"}
    html = researcher_client.get(url, linked).content.decode()
    assert 'data-chart-filter value="kl"' in html and 'step="0.01" value="0.25"> <output>0.25</output>' in html
    assert "data-chart-log checked" in html and 'data-chart-x data-linked="relative"' in html
    # Out of range: the defaults.
    plain = researcher_client.get(url, {"smoothing": "7", "x": "sideways"}).content.decode()
    assert 'data-chart-filter value=""' in plain and 'value="0.60"> <output>0.60</output>' in plain
    assert "data-chart-log>" in plain and "data-chart-x>" in plain


def page_data(response) -> dict:
    html = response.content.decode()
    return json.loads(html.split('id="run-page-data" type="application/json">')[1].split("</script>")[0])


def test_key_figures_start_with_held_out_accuracy_when_the_run_evaluates(researcher_client, make_run):
    run = make_run(status=Status.RUNNING, config={"explorer": {"eval_interval": 10}, "trainer": {"total_steps": 50}})
    response = researcher_client.get(reverse("run-detail", args=[run.pk]))
    figures = page_data(response)["figures"]
    assert [figure["id"] for figure in figures] == ["heldout", "reward", "step", "throughput"]
    heldout = figures[0]
    assert heldout["candidates"][:2] == [
        ["eval/accuracy", "Held-out accuracy"], ["eval/exact_match", "Held-out accuracy"]
    ]
    assert heldout["candidates"][-1] == ["eval/reward", "Eval reward"]
    assert heldout["pending"] == "evaluated every 10 explorer steps"
    # The charts the page shows first: held-out score, then train reward, each from its first candidate.
    assert page_data(response)["overview"] == [
        [chart for chart, _ in heldout["candidates"]], [chart for chart, _ in figures[1]["candidates"]]
    ]
    html = response.content.decode()
    # In that order on the page, above the charts; the step is the run's own counter.
    assert html.index('data-figure="heldout"') < html.index('data-figure="reward"') < html.index('data-figure="step"')
    assert html.index('data-figure="throughput"') < html.index('id="charts"')
    assert '<span data-state="trainer_step">0</span><span class="of"> / 50</span>' in html


def test_a_run_without_eval_has_no_held_out_figure_and_one_that_only_trains_shows_its_loss(researcher_client, make_run):
    explore = make_run("plain", config={"trainer": {"total_steps": 10}})
    assert [f["id"] for f in page_data(researcher_client.get(reverse("run-detail", args=[explore.pk])))["figures"]] == [
        "reward", "step", "throughput"
    ]
    # Eval points make it appear even when the config does not say (an older run, a bench run).
    MetricPoint.objects.create(run=explore, role="eval", step=0, values={"reward_mean": 0.5})
    assert page_data(researcher_client.get(reverse("run-detail", args=[explore.pk])))["figures"][0]["id"] == "heldout"
    sft = make_run("sft", mode=Run.Mode.TRAIN, config={"algorithm": {"name": "sft"}, "trainer": {"total_steps": 10}})
    reward = page_data(researcher_client.get(reverse("run-detail", args=[sft.pk])))["figures"][0]
    assert reward["candidates"][-1] == ["trainer/loss", "Train loss"]


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED, Status.STOPPED])
def test_the_live_dot_of_a_finished_run_says_how_it_finished(researcher_client, make_run, status):
    run = make_run(status=status)
    response = researcher_client.get(reverse("run-detail", args=[run.pk]))
    assert f'<span class="live-dot finished" id="live-dot">{status}</span>' in response.content.decode()
    assert set(page_data(response)["finished_statuses"]) == {"stopped", "completed", "failed"}


@pytest.mark.parametrize(
    "trainer, says",
    [
        ({}, "one is saved every 5 min, and at the end; the newest 3 are kept"),
        (
            {"save_interval": 50, "save_interval_s": 90, "keep_checkpoints": 1},
            "one is saved every 50 trainer steps and every 1.5 min, and at the end; the newest 1 is kept",
        ),
        ({"save_interval_s": 30}, "one is saved every 30 s, and at the end; the newest 3 are kept"),
        ({"save_interval": 0, "save_interval_s": 0}, "one is saved only at the end; the newest 3 are kept"),
    ],
)
def test_the_empty_checkpoint_table_says_when_checkpoints_come(researcher_client, make_run, trainer, says):
    run = make_run(config={"trainer": {"total_steps": 10, **trainer}})
    html = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert f"No checkpoints yet: {says}." in html


def control_forms(html: str) -> dict[str, bool]:
    """{action: shown} for the control buttons of a run page."""
    shown = {}
    for action in ("pause", "resume", "stop"):
        start = html.index(f'/{action}/" data-statuses=')
        tag = html[start : html.index(">", start)]
        shown[action] = " hidden" not in tag
    return shown


@pytest.mark.parametrize(
    "status, shown",
    [
        (Status.QUEUED, {"pause": False, "resume": False, "stop": True}),
        (Status.RUNNING, {"pause": True, "resume": False, "stop": True}),
        (Status.PAUSED, {"pause": False, "resume": True, "stop": True}),
        (Status.STOPPING, {"pause": False, "resume": False, "stop": False}),
        (Status.COMPLETED, {"pause": False, "resume": False, "stop": False}),
    ],
)
def test_buttons_follow_the_legal_transitions(researcher_client, make_run, status, shown):
    run = make_run(status=status)
    assert control_forms(researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()) == shown


def test_pause_resume_stop(researcher_client, make_run):
    run = make_run(status=Status.RUNNING)
    for action, status in [("pause", Status.PAUSED), ("resume", Status.RUNNING), ("stop", Status.STOPPING)]:
        response = researcher_client.post(reverse(f"run-{action}", args=[run.pk]))
        assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
        run.refresh_from_db()
        assert run.status == status


@pytest.mark.parametrize(
    "status, action",
    [
        (Status.RUNNING, "resume"),
        (Status.QUEUED, "pause"),
        (Status.STARTING, "resume"),
        (Status.COMPLETED, "stop"),
        (Status.STOPPING, "stop"),
    ],
)
def test_illegal_controls_are_refused(researcher_client, make_run, status, action):
    run = make_run(status=status)
    response = researcher_client.post(reverse(f"run-{action}", args=[run.pk]))
    run.refresh_from_db()
    assert run.status == status
    assert messages_of(response) == [f"cannot {action} run 'run': it is {status}"]


def test_controls_need_post_and_the_role(researcher_client, annotator_client, make_run):
    run = make_run(status=Status.RUNNING)
    assert researcher_client.get(reverse("run-pause", args=[run.pk])).status_code == 405
    assert annotator_client.post(reverse("run-pause", args=[run.pk])).status_code == 403
    assert annotator_client.get(reverse("run-detail", args=[run.pk])).status_code == 403


def test_live_snapshot(researcher_client, make_run, django_capture_on_commit_callbacks):
    run = make_run(status=Status.RUNNING)
    with django_capture_on_commit_callbacks():  # nothing is published in this test
        second = services.record_metrics(run, "trainer", 2, {"loss": 0.5})
        first = services.record_metrics(run, "trainer", 1, {"loss": 0.9})
        services.record_metrics(run, "explorer", 1, {"reward_mean": 0.25})
    Run.objects.filter(pk=run.pk).update(live_seq=7, trainer_step=2)
    snapshot = researcher_client.get(reverse("run-live", args=[run.pk])).json()
    assert snapshot["seq"] == 7
    assert snapshot["run"]["status"] == "running" and snapshot["run"]["trainer_step"] == 2
    assert list(snapshot["metrics"]) == ["explorer", "trainer"]
    # Each point says when it was recorded (Unix seconds): the charts' time axes.
    assert snapshot["metrics"]["trainer"] == [
        {"step": 1, "time": round(first.time.timestamp(), 3), "values": {"loss": 0.9}},
        {"step": 2, "time": round(second.time.timestamp(), 3), "values": {"loss": 0.5}},
    ]


def test_a_live_metrics_update_says_when_its_point_was_recorded(make_run, monkeypatch,
                                                                 django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(publisher, "publish", lambda run_id, update: sent.append(update))
    run = make_run(status=Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        point = services.record_metrics(run, "trainer", 3, {"loss": 0.5})
    assert sent == [{"type": "metrics", "role": "trainer", "step": 3, "time": round(point.time.timestamp(), 3),
                     "values": {"loss": 0.5}}]


def test_checkpoints_come_with_the_snapshot_and_as_each_is_saved_or_deleted(researcher_client, make_run, monkeypatch,
                                                                              django_capture_on_commit_callbacks):
    """The table was the page's as first rendered: after a stop it listed v20 while v37 was saved,
    and a run completed since the page opened said "No checkpoints yet"."""
    sent = []
    monkeypatch.setattr(publisher, "publish", lambda run_id, update: sent.append(update))
    run = make_run(status=Status.RUNNING)
    checkpoints = DjangoCheckpointStore(run)
    with django_capture_on_commit_callbacks(execute=True):
        checkpoints.record(20, 20, "checkpoints/step_20")
        checkpoints.record(37, 37, "checkpoints/step_37")
    saved = {row.version: round(row.created_at.timestamp(), 3) for row in run.checkpoints.all()}
    listed = [{"version": version, "step": version, "saved": saved[version],
               "url": reverse("checkpoint-download", args=[run.pk, version]),
               "save_url": reverse("model-save", args=[run.pk, version]), "models": []} for version in (37, 20)]
    updates = [update for update in sent if update["type"] == "checkpoints"]
    assert updates[-1] == {"type": "checkpoints", "checkpoints": listed}
    assert researcher_client.get(reverse("run-live", args=[run.pk])).json()["checkpoints"] == listed
    with django_capture_on_commit_callbacks(execute=True):
        assert checkpoints.forget({20: "checkpoints/step_20"}) == [20]  # keep_checkpoints: the older one goes
    assert sent[-1] == {"type": "checkpoints", "checkpoints": listed[:1]}


# ---- checkpoint download ------------------------------------------------------------------------


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def test_checkpoint_download_streams_a_tar_of_the_directory(researcher_client, make_run, data_dir, tmp_path):
    run = make_run("my run")
    directory = run_dir(run) / "checkpoints" / "v2"
    (directory / "tokenizer").mkdir(parents=True)
    weights = bytes(range(256)) * 5000  # not a multiple of the tar block size
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    (tmp_path / "secret").write_text("not yours")
    (directory / "link").symlink_to(tmp_path / "secret")  # symlinks are never followed
    Checkpoint.objects.create(run=run, version=2, step=20, path=str(directory.relative_to(data_dir)))

    response = researcher_client.get(reverse("checkpoint-download", args=[run.pk, 2]))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/x-tar"
    assert f"my-run-{run.pk}-v2.tar" in response["Content-Disposition"]
    body = b"".join(response)
    assert int(response["Content-Length"]) == len(body)
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        root = f"my-run-{run.pk}-v2"
        assert sorted(tar.getnames()) == [
            root,
            f"{root}/model.safetensors",
            f"{root}/tokenizer",
            f"{root}/tokenizer/vocab.json",
        ]
        assert tar.extractfile(f"{root}/model.safetensors").read() == weights
        assert tar.extractfile(f"{root}/tokenizer/vocab.json").read() == b'{"a": 1}'


@pytest.mark.parametrize("where", ["absolute", "relative", "symlink"])
def test_checkpoint_download_refuses_paths_outside_the_data_dir(researcher_client, make_run, data_dir, tmp_path, where):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "id_rsa").write_text("secret")
    path = {"absolute": str(outside), "relative": "../elsewhere", "symlink": "escape"}[where]
    (data_dir / "escape").symlink_to(outside)
    run = make_run()
    Checkpoint.objects.create(run=run, version=1, step=1, path=path)
    assert researcher_client.get(reverse("checkpoint-download", args=[run.pk, 1])).status_code == 403


def test_checkpoint_download_of_a_missing_directory_is_404(researcher_client, make_run, data_dir):
    run = make_run()
    gone = run_dir(run).relative_to(data_dir) / "checkpoints" / "gone"
    Checkpoint.objects.create(run=run, version=1, step=1, path=str(gone))
    assert researcher_client.get(reverse("checkpoint-download", args=[run.pk, 1])).status_code == 404
    assert researcher_client.get(reverse("checkpoint-download", args=[run.pk, 9])).status_code == 404


# ---- rollout browser ----------------------------------------------------------------------------


@pytest.fixture
def rollouts(make_run):
    """Two explorer steps of two groups each, four responses a group, rewards 0/1 alternating."""
    run = make_run("explorer")
    Experience.objects.bulk_create(
        Experience(
            run=run,
            explorer_step=step,
            group_id=f"s{step}-g{group}",
            rollout_index=i,
            prompt_text=f"What is {group} + {step}?",
            response_text=f"answer {i}" + (" banana" if (step, group, i) == (2, 1, 3) else ""),
            reward=float(i % 2),
            reward_components={"exact_match": float(i % 2)},
            advantage=i - 1.5,
            model_version=step,
            response_ids=[1, 2, 3][: i + 1],
        )
        for step in (1, 2)
        for group in (0, 1)
        for i in range(4)
    )
    Experience.objects.create(
        run=run, explorer_step=2, group_id="", source="human_edit", response_text="edited", reward=1.0
    )
    return run


def browse(client, run, **query):
    return client.get(reverse("run-rollouts", args=[run.pk]), query).context


def test_rollouts_show_whole_groups_newest_step_first(researcher_client, rollouts):
    context = browse(researcher_client, rollouts)
    groups = context["groups"]
    assert [(g.explorer_step, g.group_id) for g in groups] == [
        (2, ""),
        (2, "s2-g0"),
        (2, "s2-g1"),
        (1, "s1-g0"),
        (1, "s1-g1"),
    ]
    group = groups[1]
    assert group.prompt == "What is 0 + 2?" and group.reward_mean == 0.5 and group.reward_std == 0.5
    assert [e.response_tokens for e in group.experiences] == [1, 2, 3, 3]
    html = researcher_client.get(reverse("run-rollouts", args=[rollouts.pk])).content.decode()
    assert f'href="/annotate/experience/{group.experiences[0].pk}/"' in html


@pytest.mark.parametrize(
    "query, groups, matches",
    [
        ({"step": 1}, [(1, "s1-g0"), (1, "s1-g1")], 8),
        ({"min_reward": 0.5, "step": 2}, [(2, ""), (2, "s2-g0"), (2, "s2-g1")], 5),
        ({"max_reward": 0.5, "step": 1}, [(1, "s1-g0"), (1, "s1-g1")], 4),
        ({"source": "human_edit"}, [(2, "")], 1),
        ({"q": "BANANA"}, [(2, "s2-g1")], 1),
    ],
)
def test_rollout_filters(researcher_client, rollouts, query, groups, matches):
    context = browse(researcher_client, rollouts, **query)
    assert [(g.explorer_step, g.group_id) for g in context["groups"]] == groups
    assert context["matching_count"] == matches
    if query.get("q"):
        (group,) = context["groups"]
        assert len(group.experiences) == 4 and len(group.matched) == 1  # the whole group, one match marked


def test_rollouts_paginate_by_group(researcher_client, make_run):
    run = make_run()
    Experience.objects.bulk_create(
        Experience(run=run, explorer_step=step, group_id="g", rollout_index=0) for step in range(25)
    )
    first, last = browse(researcher_client, run), browse(researcher_client, run, page=3)
    assert [g.explorer_step for g in first["groups"]] == list(range(24, 14, -1))
    assert [g.explorer_step for g in last["groups"]] == list(range(4, -1, -1))


def test_rollout_groups_of_a_step_go_in_task_order(researcher_client, make_run):
    """Group ids are "<step>-<task id>": as text, 72-22 came before 72-3. Shorter ids go first, so a
    step's groups read in the order of their tasks."""
    run = make_run()
    Experience.objects.bulk_create(
        Experience(run=run, explorer_step=72, group_id=f"72-{task}", rollout_index=0) for task in (22, 3, 100, 4)
    )
    assert [g.group_id for g in browse(researcher_client, run)["groups"]] == ["72-3", "72-4", "72-22", "72-100"]


def test_bad_rollout_filters_are_shown_not_applied(researcher_client, rollouts):
    context = browse(researcher_client, rollouts, min_reward="lots")
    assert "min_reward" in context["filters"].errors and context["matching_count"] == 17


# ---- compare, plotly, home ----------------------------------------------------------------------


def test_compare_lists_the_picked_runs_for_the_charts(researcher_client, make_run):
    a, b, _ = make_run("a"), make_run("b"), make_run("c")
    response = researcher_client.get(reverse("run-compare"), {"runs": [b.pk, a.pk, "999", "x"]})
    series = response.context["series"]
    assert [s["name"] for s in series] == ["b", "a"]
    assert series[0]["metrics_url"] == reverse("run-metrics-json", args=[b.pk])
    html = response.content.decode()
    assert 'id="compare-data"' in html and 'id="charts"' in html and html.count('type="checkbox" name="runs"') == 3


def test_compare_without_runs_invites_a_pick(researcher_client, make_run):
    make_run("a")
    response = researcher_client.get(reverse("run-compare"))
    assert response.context["series"] == [] and "Pick two or more runs" in response.content.decode()


def test_plotly_is_the_vendored_basic_bundle_compressed_and_cached_for_good(researcher_client):
    from apps.runs.views import PLOTLY_JS

    response = researcher_client.get(reverse("plotly-js"), {"v": PLOTLY_VERSION}, HTTP_ACCEPT_ENCODING="gzip, br")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/javascript")
    assert "immutable" in response["Cache-Control"] and "Accept-Encoding" in response["Vary"]
    assert response["Content-Encoding"] == "gzip"
    assert gzip.decompress(response.content) == PLOTLY_JS.read_bytes()
    assert len(response.content) < 500_000  # the full bundle is 1.4 MB compressed
    plain = researcher_client.get(reverse("plotly-js"), HTTP_ACCEPT_ENCODING="identity")
    assert "Content-Encoding" not in plain and b"".join(plain.streaming_content) == PLOTLY_JS.read_bytes()


def test_the_favicon_is_served_to_anyone(client):
    from django.contrib.staticfiles import finders

    response = client.get("/favicon.ico")  # not logged in
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
    assert open(finders.find("favicon.svg")).read().startswith("<svg")
    assert '<link rel="icon" href="/static/favicon.svg"' in client.get(reverse("login")).content.decode()


def test_home_shows_recent_runs(researcher_client, make_run):
    make_run("recent", status=Status.RUNNING)
    assert "recent" in researcher_client.get(reverse("home")).content.decode()


def test_api_token_page(researcher_client, researcher):
    from apps.runs.api import token_for

    assert token_for(researcher) in researcher_client.get(reverse("api-token")).content.decode()


def test_resuming_a_failed_run_from_the_page_says_where_it_continues(researcher_client, make_run):
    from apps.runs.models import Checkpoint

    run = make_run(status=Status.FAILED, error="loop failed: boom")
    Checkpoint.objects.create(run=run, version=2, step=10, path="runs/x/checkpoints/step_10")
    response = researcher_client.post(reverse("run-resume", args=[run.pk]), follow=True)
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.error == ""
    assert messages_of(response) == [f"Run {run.pk} resumes from checkpoint v2 (trainer step 10)."]


def test_a_group_says_which_of_several_explorers_rolled_it_out(researcher_client, make_run):
    """#42, finding 11: the rollouts page did not say which explorer wrote a group."""
    from apps.buffer.store import DjangoExperienceBuffer
    from workers.rft.experience import Experience

    run = make_run("two explorers", status=Run.Status.COMPLETED)
    for step, (explorer, group) in enumerate((("explorer", "g-0"), ("explorer-1", "g-1"))):
        DjangoExperienceBuffer(run.pk, explorer=explorer).write([
            Experience(task_id=None, group_id=group, rollout_index=i, prompt_ids=[1], response_ids=[2],
                       explorer_step=step, action_mask=[1], response_text=f"{explorer} {i}",
                       metadata={"finish_reason": "stop"})
            for i in range(2)])
    stored = {e.group_id: e.metadata for e in run.experiences.all()}
    assert stored == {"g-0": {"finish_reason": "stop", "explorer": "explorer"},
                      "g-1": {"finish_reason": "stop", "explorer": "explorer-1"}}
    page = researcher_client.get(reverse("run-rollouts", args=[run.pk])).content.decode()
    assert page.count("data-explorer") == 2 and ">explorer-1</span>" in page
