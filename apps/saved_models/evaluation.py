"""Evaluating saved models, and their scores: the Models page's leaderboard (as MLflow's model
registry shows each version's metrics beside it).

"Evaluate" opens the launch form on a mode-bench run of the model (workers/rft/loop.py bench: it
scores the model on buffer.eval_taskset, greedy, and trains nothing). Its prompt format, workflow
and reward are those of the run the model was saved from, and its eval taskset that run's, so that
its score reads beside the one that run recorded at the checkpoint's step.

A score is what the run's eval points record (Explorer.evaluate, role "eval"): the held-out
accuracy where its reward fn scores 1 or 0 per answer, else the mean eval reward, as the run page's
first figure picks it (apps.runs.queries.HELD_OUT). A finished bench run's is its summary's latest
(MetricSummary: the model's own score, at step 0); the source run's is its eval point at the
checkpoint's step, where it evaluated then."""

from dataclasses import dataclass
from pathlib import Path

from django.db.models import Q

from apps.core.bidi import isolate
from apps.runs.config_checks import shown as shown_path
from apps.runs.models import MetricPoint, MetricSummary, Run
from apps.runs.presets import PRESETS
from apps.runs.queries import ACCURACY_KEYS, REWARD_KEYS
from apps.runs.summaries import numbers
from workers.rft.config import RunConfig

from .directories import renamed_from
from .models import SavedModel
from .services import CONTINUE_PRESET, model_dirs, models_root

# The first a run records is its score: HELD_OUT's order (accuracy, else the mean eval reward).
SCORE_KEYS = (*ACCURACY_KEYS, *REWARD_KEYS)


@dataclass(frozen=True)
class Score:
    eval_taskset: str
    metric: str  # the eval key it is: "exact_match", "reward_mean"
    value: float
    run_id: int
    run_name: str
    step: int
    at_save: bool  # the source run's own eval at the checkpoint's step, not a bench run's

    @property
    def is_accuracy(self) -> bool:
        return self.metric in ACCURACY_KEYS

    def as_json(self) -> dict:
        return {"eval_taskset": self.eval_taskset, "metric": self.metric, "value": self.value, "run": self.run_id,
                "run_name": self.run_name, "step": self.step, "source": "at save" if self.at_save else "bench"}


def evaluation(saved: SavedModel, preset: str | None = None) -> tuple[dict, str, str]:
    """(config, run name, what the launch form says of it) for "Evaluate": a mode-bench run of the
    model with the source run's model settings, explorer (prompt format, workflow, reward, lengths)
    and eval taskset over the schema's defaults, so no training key of the source is left to do
    nothing (config_rules refuses those). `preset` (a preset link on the Evaluate form) takes those
    from that preset instead, its eval taskset too: still a bench of the model, never a training run.
    Where the source had no eval taskset, the form leaves it empty for its user to pick (a launch
    refuses mode bench without one); a deleted source leaves CONTINUE_PRESET's prompt format, said."""
    source = None if preset else saved.run
    base = source.config if source is not None else PRESETS[preset or CONTINUE_PRESET].config
    defaults = RunConfig().to_dict()
    model = {**defaults["model"], **base.get("model", {}), "path": saved.model_path,
             "ref_path": None, "critic_path": None, "lora": None}  # bench loads the policy alone
    # One explorer in the run's own worker, every task once: no pipeline, no evals between steps.
    explorer = {**defaults["explorer"], **base.get("explorer", {}), "engine_num": 1, "pipeline": [],
                "eval_interval": 0}
    eval_taskset = (base.get("buffer") or {}).get("eval_taskset") if source is not None or preset else None
    buffer = {**defaults["buffer"], "taskset": eval_taskset or (base.get("buffer") or {}).get("taskset")
              or defaults["buffer"]["taskset"], "eval_taskset": eval_taskset}
    config = {**defaults, "mode": "bench", "seed": base.get("seed", defaults["seed"]), "model": model,
              "explorer": explorer, "buffer": buffer}
    name = f"eval {saved.name}" + (f" on {eval_taskset}" if eval_taskset else "")
    if preset:
        said = (f"Evaluates {saved.name}" + (f" on {isolate(eval_taskset)}" if eval_taskset else "")
                + f" (mode bench: it trains nothing) with the prompt format, workflow and reward of the "
                f"{PRESETS[preset].title} preset."
                + ("" if eval_taskset else " Pick buffer.eval_taskset: the held-out tasks it is scored on."))
    elif saved.run is None:
        said = (f"Evaluates {saved.name} (mode bench: it trains nothing). Run {isolate(saved.run_name)}, which it "
                f"was saved from, is deleted: the prompt format, workflow and reward are the "
                f"{PRESETS[CONTINUE_PRESET].title} preset's, not that run's. Pick buffer.eval_taskset: the held-out "
                "tasks it is scored on.")
    elif eval_taskset:
        said = (f"Evaluates {saved.name} on {isolate(eval_taskset)} (mode bench: it trains nothing) with the prompt "
                f"format, workflow and reward of run {isolate(source.name)}, which evaluated on it too: the score "
                "reads beside that run's at the checkpoint's step.")
    else:
        said = (f"Evaluates {saved.name} (mode bench: it trains nothing) with the prompt format, workflow and reward "
                f"of run {isolate(source.name)}, which had no eval taskset: pick buffer.eval_taskset, the held-out "
                "tasks it is scored on.")
    return config, name, said


def is_bench_of(run: Run, saved: SavedModel) -> bool:
    """Whether `run` (from services.runs_naming) is a bench run of the model as its policy."""
    config = run.config or {}
    return config.get("mode") == Run.Mode.BENCH and (config.get("model") or {}).get("path") in model_dirs(saved)


def scores(saved_models, naming: dict[int, list[Run]]) -> dict[int, list[Score]]:
    """{saved model id: its scores}: one for each completed bench run of it (newest first), then the
    source run's at the checkpoint's step if it evaluated then. `naming` is services.runs_naming's
    answer for these models. Two queries, however many models."""
    benches = {saved.pk: [run for run in naming.get(saved.pk, [])
                          if run.status == Run.Status.COMPLETED and is_bench_of(run, saved)]
               for saved in saved_models}
    run_ids = {run.pk for runs in benches.values() for run in runs}
    recorded = {}  # run id: {key: (latest, its step)}
    rows = MetricSummary.objects.filter(run_id__in=run_ids, role=MetricPoint.Role.EVAL, key__in=SCORE_KEYS)
    for run_id, key, latest, step in rows.values_list("run_id", "key", "latest", "latest_step"):
        recorded.setdefault(run_id, {})[key] = (latest, step)
    found = {saved.pk: [] for saved in saved_models}
    for saved in saved_models:
        for run in sorted(benches[saved.pk], key=lambda run: -run.pk):
            key = next((key for key in SCORE_KEYS if key in recorded.get(run.pk, {})), None)
            if key is not None:
                value, step = recorded[run.pk][key]
                found[saved.pk].append(Score(run.config["buffer"]["eval_taskset"], key, value, run.pk, run.name,
                                             step, at_save=False))
    for saved, score in _at_save(saved_models):
        found[saved.pk].append(score)
    return found


def _at_save(saved_models) -> list[tuple[SavedModel, Score]]:
    """(model, its source run's eval score at the checkpoint's step) where that run evaluated then."""
    sources = {}  # (run id, step): the models saved there (one checkpoint may be saved under several names)
    for saved in saved_models:
        if saved.run is not None and ((saved.run.config or {}).get("buffer") or {}).get("eval_taskset"):
            sources.setdefault((saved.run_id, saved.step), []).append(saved)
    if not sources:
        return []
    at = Q()
    for run_id, step in sources:
        at |= Q(run_id=run_id, step=step)
    points = MetricPoint.objects.filter(at, role=MetricPoint.Role.EVAL).values_list("run_id", "step", "values")
    found = []
    for run_id, step, values in points:
        recorded = numbers(values)
        key = next((key for key in SCORE_KEYS if key in recorded), None)
        for saved in sources[(run_id, step)] if key is not None else ():
            found.append((saved, Score(saved.run.config["buffer"]["eval_taskset"], key, recorded[key], run_id,
                                       saved.run.name, step, at_save=True)))
    return found


# A bench run that will score the model yet: waiting for its slot, or evaluating.
PENDING = (Run.Status.QUEUED, *Run.ACTIVE)


def pending(saved_models, naming: dict[int, list[Run]]) -> dict[int, dict[str, list[Run]]]:
    """{saved model id: {eval taskset: its bench runs not finished yet (PENDING), newest first}}, from
    services.runs_naming's answer: no query. A bench logs its one eval point when it has answered
    every task (Explorer.evaluate), so until then its status is all there is to say of it."""
    found = {}
    for saved in saved_models:
        for run in sorted(naming.get(saved.pk, []), key=lambda run: -run.pk):
            eval_taskset = ((run.config or {}).get("buffer") or {}).get("eval_taskset")
            if run.status in PENDING and eval_taskset and is_bench_of(run, saved):
                found.setdefault(saved.pk, {}).setdefault(eval_taskset, []).append(run)
    return found


def leaderboard(saved_models, found: dict[int, list[Score]], sort: str | None,
                waiting: dict[int, dict[str, list[Run]]] | None = None) -> tuple[list[str], list]:
    """(the eval tasksets any model has a score or a pending bench run on, by name; the models in
    order). Each model gets .scores ({eval taskset: (its newest bench score or None, the score at
    save or None)}), .pending (`waiting`'s, pending's answer: {eval taskset: its unfinished bench
    runs}) and .cells ((bench, at save, unfinished runs) in the tasksets' order, for the table's
    columns); sorted by `sort` (an eval taskset) its best first, by the newest bench score else the
    one at save, the models without one after them in their own order. Any other `sort` leaves the
    order as it is."""
    waiting = waiting or {}
    tasksets = sorted({score.eval_taskset for scores_of in found.values() for score in scores_of}
                      | {taskset for runs in waiting.values() for taskset in runs})
    for saved in saved_models:
        saved.scores = {}
        for score in found.get(saved.pk, []):
            bench, at_save = saved.scores.get(score.eval_taskset, (None, None))
            if score.at_save:
                at_save = at_save or score
            else:
                bench = bench or score  # the newest comes first
            saved.scores[score.eval_taskset] = (bench, at_save)
        saved.pending = waiting.get(saved.pk, {})
        saved.cells = [(*saved.scores.get(taskset, (None, None)), saved.pending.get(taskset, []))
                       for taskset in tasksets]
    ordered = list(saved_models)
    if sort in tasksets:
        def value(saved):
            bench, at_save = saved.scores.get(sort, (None, None))
            shown = bench or at_save
            return (0, -shown.value) if shown else (1, 0)
        ordered.sort(key=value)  # stable: the unscored keep their order
    return tasksets, ordered


def bench_config(config: dict) -> dict:
    """A bench run's config as its page shows it: without the training sections (Run.TRAINING_SECTIONS;
    its page listed trainer.lr and the algorithm it never ran), and without the synchronizer where it
    is memory's (only checkpoint sync gives a bench run more versions to score: Loop.bench). The API
    answers the whole config, as launched."""
    shown = {key: value for key, value in config.items() if key not in Run.TRAINING_SECTIONS}
    if (shown.get("synchronizer") or {}).get("method", "memory") == "memory":
        shown.pop("synchronizer", None)
    return shown


def evaluated_model(path: str) -> SavedModel | None:
    """The saved model a model.path names (as a launch stores it: models_root()/<name>, or a name it
    had before a rename), else None (a built-in model, a directory of RFTWEB_MODEL_DIRS)."""
    directory = Path(path or "")
    if not directory.is_absolute() or directory.parent != models_root():
        return None
    return SavedModel.objects.filter(name=directory.name).first() or renamed_from(directory.name)


def bench_results(run: Run) -> dict | None:
    """What a mode-bench run evaluated and what it scored, for its page and the API (an evaluation's
    page, as MLflow's and W&B's show one), or None for a run of another mode: {model_path (as a
    config writes it: models/<name> under the data dir), saved_model (its name, or None),
    eval_taskset, results}. `results` are its eval points in step
    order (Loop.bench: the starting model's at step 0, then each published version's), each
    {step, model_version, metric, score, tasks, failed_tasks, metrics}: `metric` the score's key
    (SCORE_KEYS' first it recorded, as the Models page ranks it), `metrics` every number it
    recorded. Each task's answer is not kept (Explorer.evaluate stores only these means)."""
    if run.mode != Run.Mode.BENCH:
        return None
    config = run.config or {}
    path = (config.get("model") or {}).get("path") or ""
    saved = evaluated_model(path)
    results = []
    points = run.metrics.filter(role=MetricPoint.Role.EVAL).order_by("step").values_list("step", "values")
    for step, values in points:
        recorded = numbers(values)
        metric = next((key for key in SCORE_KEYS if key in recorded), None)
        counts = {key: None if recorded.get(key) is None else int(recorded[key])  # counts, stored as numbers
                  for key in ("model_version", "tasks", "failed_tasks")}
        results.append({"step": step, "metric": metric, "score": recorded.get(metric), **counts,
                        "metrics": recorded})
    # As the runs list and the run page name it (models/warm): the launch stored it resolved, the
    # server's own layout, which the API showed (/srv/rftweb/data/models/warm).
    shown = shown_path(Path(path)) if Path(path).is_absolute() else path
    return {"model_path": shown, "saved_model": saved and saved.name,
            "eval_taskset": (config.get("buffer") or {}).get("eval_taskset"), "results": results}
