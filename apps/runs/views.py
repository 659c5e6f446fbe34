"""The training dashboard: launch, the live run page, rollouts, downloads, workers (the runs list:
views_list.py; compare: views_compare.py)."""

import functools
import gzip
import re
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import content_disposition_header, url_has_allowed_host_and_scheme
from django.utils.text import slugify
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from apps.accounts.roles import CURATOR, RESEARCHER, has_role, role_required
from apps.core.bidi import isolate
from apps.core.numbers import SHOWN_CHARS, whole_number
from apps.core.streaming import streaming
from apps.saved_models.directories import moved_to, renamed_from
from apps.saved_models.evaluation import bench_config, bench_results, evaluation
from apps.saved_models.models import SavedModel
from apps.saved_models.services import train_from
from apps.tasksets.models import Task, Taskset
from rftweb.errors import form_checks_nul
from workers.rft.config import ConfigError

from . import duties, queries, services, supervision, sweeps, waits, worker_detail
from .api import token_for, token_or_session, workers_json
from .capacity import DrainRefused, NoSuchWorker, set_drain, shown_name
from .checkpoints import run_checkpoint_dir, tar_stream
from .compression import gzip_json
from .config_keys import as_run
from .controls import control_run, control_statuses, may_control
from .forms import LaunchForm, RolloutFilterForm, dump_config_yaml
from .holding import hand_back
from .live import checkpoints_update, saved_models
from .models import Checkpoint, Run, Sweep
from .notes import shown_tags, taken_draft
from .presets import DEFAULT_PRESET, PRESETS, on_taskset, preset_config

GROUPS_PER_PAGE = 10
# plotly.js's "basic" bundle (scatter, bar, pie: the pages draw only scatter lines), a quarter of
# the full one: `npm pack plotly.js-basic-dist-min@<version>`, then its plotly-basic.min.js.
PLOTLY_JS = settings.BASE_DIR / "static" / "vendor" / "plotly-basic.min.js"
with PLOTLY_JS.open() as _header:
    PLOTLY_VERSION = re.search(r"plotly\.js \(basic - minified\) v([\w.-]+)", _header.read(200))[1]
ACCEPTS_GZIP = re.compile(r"\bgzip\b")
CHART_SMOOTHING = 0.6  # the chart toolbar's default: its pages and chart_toolbar.js read it from here
CHART_X = ("step", "wall", "relative")  # static/js/chart_axes.js's modes


def chart_view(query, smoothing: float | None = None) -> dict:
    """The chart toolbar's settings as a link gives them (?filter=, ?smoothing=, ?log=1, ?x=; the
    pages keep the URL in step as they change: chart_toolbar.js, keepChartView), so a link shared from the
    run page or compare opens the charts as its sender saw them. `smoothing`: a saved report's,
    where the query has none. A value out of range is the default."""
    try:
        smoothing = round(float(query.get("smoothing") or (CHART_SMOOTHING if smoothing is None else smoothing)), 2)
    except ValueError:
        smoothing = CHART_SMOOTHING
    return {"chart_filter": query.get("filter", "")[:200],
            "chart_smoothing": smoothing if 0 <= smoothing <= 0.99 else CHART_SMOOTHING,
            "chart_smoothing_default": CHART_SMOOTHING,
            "chart_log": query.get("log") == "1", "chart_x": query.get("x") if query.get("x") in CHART_X else ""}


def _runs():
    return queries.with_latest_explorer_metrics(Run.objects.select_related("owner"))


@form_checks_nul
@role_required(RESEARCHER)
def run_launch(request):
    preset = None
    if request.method == "POST":
        form = LaunchForm(request.POST)
        if form.is_valid():
            if "switch" in request.POST:
                form = form.switched()
            elif "launch_sweep" in request.POST:
                try:
                    sweep = sweeps.launch_sweep(
                        request.user, form.run_name(), form.cleaned_data["config"], form.sweep_space(),
                        form.cleaned_data["sweep_method"] or Sweep.Method.GRID, form.cleaned_data.get("sweep_count"),
                        form.cleaned_data.get("sweep_seed") or 0,
                    )
                except sweeps.SweepError as err:
                    form.add_sweep_errors(err)
                else:
                    messages.success(request, f"Launched sweep {isolate(sweep.name)}: {sweep.count} runs, which take "
                                              "their slots in the order shown.")
                    first = sweep.runs.order_by("pk").first()
                    for warning in waits.launch_warnings(first.config, first.pk):
                        messages.warning(request, warning)
                    return redirect("sweep-detail", pk=sweep.pk)
            else:
                try:
                    run = services.launch_run(request.user, form.run_name(), form.cleaned_data["config"])
                except ConfigError as err:
                    form.add_config_errors(err)
                else:
                    messages.success(request, f"Launched {isolate(run.name)}.")
                    for warning in waits.launch_warnings(run.config, run.pk):
                        messages.warning(request, warning)
                    return redirect("run-detail", pk=run.pk)
    else:
        config, name, preset = _starting_point(request)
        form = LaunchForm.for_config(config, name=name)
    return render(request, "runs/launch.html", {"form": form, "presets": PRESETS, "preset_name": preset,
                                                "capacity": waits.free_slots(),
                                                "carried": {key: request.GET[key]
                                                            for key in ("taskset", "model", "evaluate")
                                                            if request.GET.get(key)}})


def with_saved_models(run: Run) -> list[Checkpoint]:
    """The run's checkpoints, newest first, each with .models: the names of the models saved from it."""
    saved = saved_models(run.pk)
    checkpoints = list(run.checkpoints.order_by("-version"))
    for checkpoint in checkpoints:
        checkpoint.models = saved.get(checkpoint.version, [])
    return checkpoints


def _saved_model(request, name: str) -> SavedModel | None:
    """The saved model named `name`, else the one renamed from it (a link from before the rename,
    said), else None."""
    saved = SavedModel.objects.filter(name=name).first()
    if saved is None and (saved := renamed_from(name)) is not None:
        messages.info(request, f"Model {isolate(name)} was renamed {isolate(saved.name)}: the form names it so.")
    return saved


def _models_now(request, config: dict) -> dict:
    """The config with each model it loads from a saved model's former directory named as that
    model is now (a run that loaded it before a rename, launched again), said."""
    model = dict(config.get("model") or {})
    for key, path in model.items():
        if isinstance(path, str) and (saved := moved_to(path)) is not None:
            model[key] = saved.model_path
            messages.info(request, f"Model {isolate(Path(path).name)} was renamed {isolate(saved.name)}: the form "
                                   f"names it so (model.{key}).")
    return {**config, "model": model}


def _starting_point(request) -> tuple[dict, str, str | None]:
    """(config, run name, preset) to open the launch form with: a run to copy (?from=<id>), a
    preset (?preset=<name>), or the default preset; ?taskset=<name> (the taskset page's link) puts
    that taskset in it, and ?model=<name> (the Models page's "Train from it") that saved model as
    model.path: the settings of the run it was saved from unless a preset is named
    (saved_models.services.train_from), said on the page. ?evaluate=<name> (the Models page's
    "Evaluate") opens a mode-bench run of that saved model (saved_models.evaluation.evaluation),
    with a named preset's prompt format and reward where its preset links add ?preset=."""
    source = whole_number(request.GET.get("from"))
    if source is not None:
        run = get_object_or_404(Run, pk=source)
        return _models_now(request, as_run(run.config)), f"{run.name} (again)", None
    evaluated = request.GET.get("evaluate") or ""
    if evaluated and (model := _saved_model(request, evaluated)):
        # A preset link on this form carries ?evaluate=: it changes the prompt format and reward
        # the model is scored with, not what the run does (it had opened a training run).
        preset = request.GET.get("preset") if request.GET.get("preset") in PRESETS else None
        config, name, said = evaluation(model, preset)
        messages.info(request, said)
        return config, name, preset
    taskset = Taskset.objects.filter(name=request.GET.get("taskset") or "").first()
    wanted = request.GET.get("model") or evaluated  # a stale Evaluate link is said so as a stale model link
    saved = _saved_model(request, wanted) if wanted != evaluated else None
    if saved and request.GET.get("preset") not in PRESETS:
        config, preset, said = train_from(saved, taskset)
        messages.info(request, said)
        return config, "", preset
    default = "smollm2-grpo" if taskset or wanted else DEFAULT_PRESET
    preset = request.GET.get("preset") if request.GET.get("preset") in PRESETS else default
    config = preset_config(preset)
    if taskset:
        config = on_taskset(config, taskset)
    if saved:
        config = {**config, "model": {**config["model"], "path": saved.model_path}}
    elif wanted:  # deleted in another tab, or mistyped: no model rather than the preset's, which Launch would train
        config = {**config, "model": {**config["model"], "path": ""}}
        messages.error(request, f"No saved model named {isolate(wanted)} (deleted?): pick model.path, or a model "
                                "on the Models page.")
    return config, "", preset


BENCH_STEP_TITLE = "model version evaluated"


@role_required(RESEARCHER)
def run_detail(request, pk):
    run = get_object_or_404(_runs(), pk=pk)
    run.progress = queries.run_progress(run)
    run.shown_tags = shown_tags(run.tags)
    figures = queries.key_figures(run)
    # The counter live updates move, as run_progress counts (a bench run's with its status: run_page.js).
    progress_counter = {Run.Mode.EXPLORE: "explorer_step", Run.Mode.BENCH: "evaluation"}.get(run.mode, "trainer_step")
    shown = waits.duties_json(run)
    run.shown_status = shown["shown_status"]  # as the runs list says it: queued until a worker takes it
    controls = control_statuses()
    retired_job = run.buffer_retired_at and run.buffer_retirement.get("job")
    if run.buffer_retired_at:
        controls.pop("resume")  # refused for good: its buffer is gone (services.buffer_retired)
    # A bench run is an evaluation: the page shows what it scored, not the training it never did.
    bench = bench_results(run)
    if bench:  # the metrics table's rows: each key any version recorded, its value a version ("—": none)
        keys = dict.fromkeys(key for result in bench["results"] for key in result["metrics"])
        bench["metric_rows"] = [(key, [f"{result['metrics'][key]:.4g}" if key in result["metrics"] else "—"
                                       for result in bench["results"]]) for key in keys]
    return render(
        request,
        "runs/detail.html",
        {
            "run": run,
            "config_yaml": dump_config_yaml(bench_config(run.config) if bench else run.config),
            "bench": bench,
            "checkpoints": [] if bench else with_saved_models(run),
            "checkpoint_schedule": queries.checkpoint_schedule(run),
            "skipped": queries.skipped_steps(run),
            "figures": figures,
            "progress_counter": progress_counter,
            "controls": controls,
            "may_control": may_control(request.user, run),
            "notes_draft": taken_draft(request.session, run),  # a refused notes form's text (notes.keep_draft)
            "buffer_retired": run.buffer_retired_at and services.buffer_retired(run),
            # The retention job (its archive file) for those who may open it in the admin.
            "retirement_job_url": retired_job and request.user.is_staff
            and request.user.has_perm("buffer.view_bufferjob")
            and reverse("admin:buffer_bufferjob_change", args=[retired_job]),
            # Explorers of a run whose explorers are workers of their own may be added or removed
            # while it runs, with checkpoint sync (nccl's weight group has a fixed size).
            "explorers": "trainer" in duties.duties_of_run(run) and run.config["explorer"]["engine_num"],
            "sync_method": run.config.get("synchronizer", {}).get("method", "memory"),
            "explorers_editable": may_control(request.user, run) and run.status in (Run.Status.RUNNING,
                                                                                     Run.Status.PAUSED)
            and supervision.fixed_explorers(run) is None,
            "plotly_version": PLOTLY_VERSION,
            **chart_view(request.GET),
            "page_data": {
                "live_url": reverse("run-live", args=[run.pk]),
                "ws_path": f"/ws/runs/{run.pk}/",
                "total_steps": run.progress.total,
                "progress_counter": progress_counter,
                "finished_statuses": Run.FINISHED,
                "figures": figures,
                "overview": queries.overview_charts(bench=bool(bench)),
                "duties": shown,
                "duties_url": reverse("api-run-duties", args=[run.pk]),
                "algorithm": run.config.get("algorithm", {}).get("name"),
                "bench": bool(bench),
                # A bench run's eval points are numbered by the model version they scored (Loop.bench:
                # v0 as loaded, then each published one), not by an explorer step: its axis says so.
                "step_titles": {"eval": BENCH_STEP_TITLE} if bench else {},
            },
        },
    )


@gzip_json  # 7.4 MB for a 5,000-step run, fetched again after each gap
@role_required(RESEARCHER)
def run_live(request, pk):
    """The snapshot a live page starts from, and fetches again when it sees a gap in `seq`."""
    # Read the sequence number first: every message numbered at or below it was sent after its
    # data committed, so that data is in what we read next.
    seq = get_object_or_404(Run.objects.only("live_seq"), pk=pk).live_seq
    run = Run.objects.get(pk=pk)
    state = {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "mode": run.mode,
        "explorer_step": run.explorer_step,
        "trainer_step": run.trainer_step,
        "model_version": run.model_version,
        "error": run.error,
    }
    return JsonResponse({"seq": seq, "run": state, "metrics": queries.metrics_by_role(run),
                         "checkpoints": checkpoints_update(run.pk)["checkpoints"]})


@require_POST
@role_required(RESEARCHER)
def run_control(request, pk, action):
    run = get_object_or_404(Run, pk=pk)
    was = run.status
    try:
        control_run(run, action, request.user)  # PermissionDenied: 403
    except services.InvalidTransition as err:
        messages.error(request, str(err))
    else:
        if action == "resume":
            said = services.describe_resume(run, was)
            messages.success(request, said[0].upper() + said[1:] + ".")
        else:
            messages.success(request, {"pause": "Paused", "stop": "Stopping"}[action] + f" {isolate(run.name)}.")
    return redirect("run-detail", pk=pk)


@require_POST
@role_required(RESEARCHER)
def run_explorers(request, pk):
    """Add or remove explorers while the run trains (supervision.set_explorers)."""
    run = get_object_or_404(Run, pk=pk)
    if not may_control(request.user, run):
        raise PermissionDenied(f"only the owner of run {run.name!r} ({run.owner}) or a curator may change explorers")
    # whole_number, as every other number people send: int() read "1_0" as 10 and a full-width "１" as 1.
    sent = request.POST.get("engine_num", "")
    count = whole_number(sent)
    if count is None:
        shown = sent.strip()[:SHOWN_CHARS]
        messages.error(request, f"explorer.engine_num: {shown!r} is not a whole number: type the explorers "
                                "wanted in digits 0-9, e.g. 2" if shown else "explorer.engine_num: type how many "
                                "explorers the run should have, e.g. 2")
        return redirect("run-detail", pk=pk)
    try:
        supervision.set_explorers(run, count)
    except ConfigError as err:
        messages.error(request, "; ".join(f"{issue.key}: {issue.message}" for issue in err.errors))
    except services.InvalidTransition as err:
        messages.error(request, str(err))
    else:
        messages.success(request, f"{isolate(run.name)} asks for {count} explorer{'s' if count != 1 else ''} "
                                  "from now on: each added one starts when an `explore` worker has a free slot "
                                  "(the duty lines say where each stands).")
    return redirect("run-detail", pk=pk)


@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def checkpoint_download(request, pk, version):
    """The checkpoint's directory as a tar, streamed (403 for a path outside the run's own checkpoints)."""
    checkpoint = get_object_or_404(Checkpoint.objects.select_related("run"), run_id=pk, version=version)
    name = f"{slugify(checkpoint.run.name) or 'run'}-{pk}-v{version}"
    chunks, size = tar_stream(run_checkpoint_dir(checkpoint, supervision.run_dir(checkpoint.run)), name)
    response = streaming(chunks, content_type="application/x-tar")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename=f"{name}.tar")
    return response


@role_required(RESEARCHER)
def run_rollouts(request, pk):
    run = get_object_or_404(Run, pk=pk)
    filters = RolloutFilterForm(request.GET)
    matching = filters.filter(run.experiences.all())
    page = Paginator(queries.group_keys(matching), GROUPS_PER_PAGE).get_page(request.GET.get("page"))
    groups = queries.rollout_groups(run, page.object_list, matching)
    # Each group answers one task: its reference answer goes beside the responses.
    task_ids = {group.experiences[0].task_id for group in groups if group.experiences}
    tasks = Task.objects.select_related("taskset").in_bulk(task_ids - {None})
    for group in groups:
        group.task = tasks.get(group.experiences[0].task_id) if group.experiences else None
    return render(
        request,
        "runs/rollouts.html",
        {"run": run, "filters": filters, "page": page, "groups": groups, "matching_count": matching.count(),
         "buffer_retired": run.buffer_retired_at and services.buffer_retired(run)},  # why none are left
    )


@role_required(RESEARCHER)
def worker_list(request):
    """Every worker, what each slot holds, and the workers lost (apps/runs/capacity.py); the page
    polls /api/workers/ for the same JSON it starts from. A curator may hand a duty back to its
    queue or stop its run from here (worker_duty)."""
    return render(request, "runs/workers.html", {"workers_data": workers_json(),
                                                 "may_act": has_role(request.user, CURATOR)})


@role_required(RESEARCHER)
def worker_page(request, name):
    """One worker (apps/runs/worker_detail.py): what it holds, the duties it held in the last day
    and how each ended, and its log's tail; the page polls /api/workers/<name>/ for the same JSON."""
    shown = worker_detail.detail(name)
    if shown is None:
        raise Http404(f"no worker named {shown_name(name)} was seen in the last day")
    return render(request, "runs/worker.html", {"worker_data": shown, "name": name,
                                                "may_act": has_role(request.user, CURATOR)})


@require_POST
@role_required(CURATOR)
def worker_drain(request, name, drain):
    """A curator drains a worker (it finishes what it holds and takes no new duty) or undrains it
    (capacity.set_drain), from its page."""
    try:
        set_drain(name, request.user.get_username(), drain)
    except NoSuchWorker as err:  # its page is a 404, which shows no message: the list says it
        messages.error(request, str(err))
        return redirect("worker-list")
    except DrainRefused as err:
        messages.error(request, str(err))
    else:
        messages.success(request, f"Draining {isolate(name)}: it finishes what it holds and takes no new duty."
                         if drain else f"{isolate(name)} takes duties again.")
    return redirect("worker-detail", name=name)


DUTY_ACTIONS = ("hand-back", "stop")


@require_POST
@role_required(CURATOR)
def worker_duty(request, pk, duty, action):
    """A curator acts on a duty a worker holds: hands it back to its queue (holding.hand_back: it
    saves at its next step and another slot takes it, keeping its place) or stops its run (as the
    run page's Stop)."""
    run = get_object_or_404(Run, pk=pk)
    if action not in DUTY_ACTIONS or duty not in duties.duties_of_run(run):
        raise Http404(f"run {run.pk} has no duty {duty!r} to {action}")
    try:
        if action == "hand-back":
            hand_back(run, duty, by=request.user.get_username())
            messages.success(request, f"Handing back {duty} of {isolate(run.name)}: it saves at its next step and "
                                      "goes back to its queue, keeping its place.")
        else:
            control_run(run, "stop", request.user)
            messages.success(request, f"Stopping {isolate(run.name)}.")
    except services.InvalidTransition as err:
        messages.error(request, str(err))
    # Back to the page it was asked from: a worker's own page sends `next` (its URL).
    back = request.POST.get("next", "")
    return redirect(back if url_has_allowed_host_and_scheme(back, allowed_hosts=None) and back.startswith("/workers/")
                    else "worker-list")


@never_cache  # the token is a password: no cache, shared or the browser's, may keep the page
@role_required(RESEARCHER)
def api_token(request):
    return render(
        request,
        "runs/api_token.html",
        {"token": token_for(request.user), "api_root": request.build_absolute_uri("/api/")},
    )


def plotly_js(request):
    """The vendored plotly.js (no CDN). Pages link it with ?v=<version>, so browsers may keep it
    for a year. Compressed once per process: compressing a megabyte on every request, in the
    ASGI server's small chunks, took a third of a second."""
    if ACCEPTS_GZIP.search(request.headers.get("Accept-Encoding", "")):
        response = HttpResponse(_plotly_gzipped(), content_type="text/javascript; charset=utf-8")
        response["Content-Encoding"] = "gzip"
    else:
        response = FileResponse(PLOTLY_JS.open("rb"), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    patch_vary_headers(response, ["Accept-Encoding"])
    return response


@functools.cache
def _plotly_gzipped() -> bytes:
    return gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=9, mtime=0)
