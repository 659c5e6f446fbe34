"""What the API answers and takes, as ninja Schemas (so /api/openapi.json documents real bodies),
and the functions that build those answers from the models.

Ninja checks each answer against its schema, so a key added to a builder and not here is dropped:
add it to both. Times the workers report (`DutyOut`) are ISO strings as stored. The workers' own
answers: worker_schemas.py."""

from datetime import datetime
from typing import Annotated, Any

from django.urls import reverse
from ninja import Field, Schema
from pydantic import BeforeValidator, ConfigDict

from apps.core.numbers import whole_number
from apps.saved_models.evaluation import bench_results
from workers.rft.config_docs import json_schema as config_schema

from .. import notes, queries, waits
from ..models import Run
from .bodies import MAX_NAME
from .judgements import judgements_json
from .paging import MAX_METRIC_POINTS

# A run config as a body takes it: every key typed, bounded, defaulted and described (docs/config.md),
# or the same as YAML text. The routes read it themselves, with the config's own messages.
CONFIG_IN = {"anyOf": [config_schema(), {"type": "string", "description": "the same as YAML or JSON text"}]}

# ---- errors ------------------------------------------------------------------------------------


class ConfigProblem(Schema):
    key: str = Field(description="dotted config path, `<config>` for the document itself, or `name`")
    message: str


class ErrorOut(Schema):
    error: str = Field(description="what went wrong, for a person")
    errors: list[ConfigProblem] | dict[str, list[str]] | None = Field(
        None, description="an invalid config: one entry per problem; invalid filters: messages by filter"
    )
    status: str | None = Field(None, description="a refused control (409): the run's status")


# ---- what the API takes ------------------------------------------------------------------------
# Query parameters are text the views check themselves (the same forms as the pages), so that a
# bad one is a 400 naming it, as everywhere else in the API.


def _whole(sent):
    number = whole_number(sent)
    if number is None:
        raise ValueError("not a whole number")
    return number


# A path id: ASCII digits, as the pages' <int:pk> (pydantic alone read "1.0" and "1_0" as ids 1 and
# 10). Anything else is a missing object (auth.invalid_request).
Id = Annotated[int, BeforeValidator(_whole)]

PAGE = Field(None, description="page number, from 1 (a page past the last gives the last; 0 or not a number: 400)")
PAGE_SIZE = Field(None, description="rows per page, 1 to 500 (default 50; more reads as 500; 0 or not a number: 400)")


class RunFilters(Schema):
    q: str | None = Field(None, description="the name contains this (any case)")
    status: str | None = Field(None, description=f"one of: {', '.join(Run.Status.values)}")
    owner: str | None = Field(None, description="the owner's username")
    tag: str | None = Field(None, description="runs carrying this tag")
    page: str | None = PAGE
    page_size: str | None = PAGE_SIZE


class ExperienceFilters(Schema):
    step: str | None = Field(None, description="explorer step")
    min_reward: str | None = Field(None, description="reward at least")
    max_reward: str | None = Field(None, description="reward at most")
    source: str | None = Field(None, description="rollout, expert, human_edit or synthetic")
    q: str | None = Field(None, description="the prompt or the response contains this")
    after_id: str | None = Field(None, description="a cursor, for polling: the experiences with a higher id, "
                                                   "in id order, page_size of them; send the answer's "
                                                   "next_after_id next (not with page)")
    page: str | None = PAGE
    page_size: str | None = PAGE_SIZE


class MetricFilters(Schema):
    role: str | None = Field(None, description="keep one role: explorer, trainer, eval or system")
    since: str | None = Field(None, description="the steps after this one (for polling, one role at a time: "
                                                "a system point's step is Unix seconds); the answer's "
                                                "next_since[role] continues it")
    limit: str | None = Field(None, description=f"at most this many points per role, 1 to {MAX_METRIC_POINTS:,} "
                                                f"(the default; more is read as {MAX_METRIC_POINTS:,})")
    keys: str | None = Field(None, description="comma-separated metric names: each point keeps only these values, "
                                               "and points with none of them are left out; step and time stay")


class LaunchIn(Schema):
    """Documents the launch body; the view reads it itself, so that every problem (not JSON, too
    big, an unknown field, a NUL in the name, an invalid config) gets its own message rather than
    pydantic's. Its fields are the ones the view takes (bodies.known_fields)."""

    model_config = ConfigDict(extra="forbid")  # documented: the view refuses any other field

    name: str = Field("api run", max_length=MAX_NAME, description=f"at most {MAX_NAME} characters (longer is refused)")
    config: dict[str, Any] | str = Field(
        description="the run config (docs/config.md) as a mapping, or as YAML text; {} for the defaults",
        json_schema_extra=CONFIG_IN,
    )


# ---- runs --------------------------------------------------------------------------------------


class RunOut(Schema):
    id: int
    name: str
    owner: str = Field(description="the owner's username")
    status: str = Field(description=f"one of: {', '.join(Run.Status.values)}")
    shown_status: str = Field(description="queued or waiting while a duty waits for a worker, else status")
    mode: str
    explorer_step: int
    trainer_step: int
    model_version: int
    total_steps: int
    progress: float | None = Field(description="0 to 1, null without total_steps")
    latest_reward: float | None
    error: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    tags: list[str] = Field(description="lowercase words, set on the run's page by its owner or a curator")
    notes: str
    url: str = Field(description="the run's page")


class CheckpointOut(Schema):
    version: int
    step: int
    created_at: datetime
    download_url: str = Field(description="a tar stream; takes the same token")


class DutyOut(Schema):
    duty: str
    queue: str
    state: str = Field(
        description="waiting, starting, running, paused, handing back, handed over, lost, stopping or ended")
    node: str | None = Field(description="the worker holding it")
    since: str | None
    detail: str
    doing: list[dict[str, Any]] = Field(description='a running duty: what its engine did at its last heartbeat, '
                                        'each part {"role", "what", "since": Unix seconds}; the start of detail')
    where: str = Field(description="a running duty: its detail after what it does (the worker, the checkpoint "
                                   "it went on from)")
    node_url: str | None = Field(description="the page of the worker holding it (/workers/<name>/)")


class BenchResultOut(Schema):
    step: int = Field(description="0 for the model as loaded; with checkpoint sync, each published version's")
    model_version: int | None
    metric: str | None = Field(description="the score's key: the held-out accuracy's (exact_match, numeric...) "
                                           "where the reward fn scores 1 or 0, else reward_mean")
    score: float | None
    tasks: int | None = Field(description="eval tasks answered")
    failed_tasks: int | None
    metrics: dict[str, float] = Field(description="every number the eval recorded (role eval in /metrics/)")


class BenchOut(Schema):
    model_path: str = Field(description="model.path as a config writes it: a saved model's models/<name> "
                                        "(under the data dir), a built-in model's name")
    saved_model: str | None = Field(description="the saved model it names (/api/models/), or null")
    eval_taskset: str | None
    results: list[BenchResultOut] = Field(description="each eval point in step order; empty until it has answered "
                                                      "every task")


class RunDetailOut(RunOut):
    duties: list[DutyOut]
    config: dict[str, Any] = Field(description="the run config as launched (docs/config.md)",
                                   json_schema_extra=config_schema())
    resumes: list[dict[str, Any]] = Field(description='each {"at", "after", "error", "checkpoint"}')
    checkpoints: list[CheckpointOut]
    buffer_retired: dict[str, Any] | None = Field(
        description='{"at", "action": archive or drop, "job": its buffer job, "state"} once buffer retention '
                    'takes the ended run\'s buffer: it cannot be resumed. state: "in progress" while the job runs '
                    '(cancelling it puts the run back), "partial" when the job stopped after deleting some rows '
                    '(with "deleted" and "archive"), else done'
    )
    evaluation: BenchOut | None = Field(description="a mode bench run's: the model it scores, on which tasks, and "
                                                    "its scores; null for a run that trains")


class LaunchedOut(RunDetailOut):
    warnings: list[str] = Field(description="what the run will wait for, given the workers' free slots")


class ResumedOut(RunDetailOut):
    message: str = Field(description="where the run continues from")


class RunPage(Schema):
    count: int
    page: int
    pages: int
    results: list[RunOut]


class DutiesOut(Schema):
    status: str
    shown_status: str
    explorers: int
    explorers_running: int
    poll_s: float = Field(description="how often a page should ask again")
    doing_long_s: float = Field(description="a phase of a duty's engine running this long says how long it has")
    duties: list[DutyOut]


class MetricPointOut(Schema):
    step: int = Field(description="the role's step; for role system (a worker's heartbeat) Unix seconds")
    time: float | None = Field(description="when it was recorded, Unix seconds")
    values: dict[str, Any]


class MetricsOut(Schema):
    run: int
    name: str
    metrics: dict[str, list[MetricPointOut]] = Field(
        description=f"by role, each in step order, at most `limit` ({MAX_METRIC_POINTS:,} by default) points a "
                    "role; a role with no point after `since` is left out")
    next_since: dict[str, int] = Field(
        description="per role in metrics: the step of its last point, the `since` to send (with role=) for the "
                    "points after it")
    more: dict[str, bool] = Field(
        description="per role in metrics: true when points after next_since exist already (the limit cut the "
                    "answer: ask again at once), false when this is all there is so far")


class AnnotatorWorkOut(Schema):
    annotator: str
    kind: str
    count: int
    mean_seconds: float | None = Field(description="mean seconds spent on an item")
    pending: int = Field(description="waiting for review (a run with feedback.require_review)")
    accepted: int
    rejected: int


class ReviewerWorkOut(Schema):
    reviewer: str
    decisions: int = Field(description="judgements the reviewer decides now (a changed decision counts as it is)")
    accepted: int
    rejected: int
    accept_rate: float = Field(description="accepted / decisions")


class AnnotationOut(Schema):
    run: int
    judgements: dict[str, int] = Field(description="by kind: rating, edit, preference (a comparison), flag")
    rated_experiences: int = Field(description="rated rollouts whose human reward training reads (on a run that "
                                               "requires review: from accepted ratings): not flagged")
    rated_waiting: int = Field(description="rollouts rated, but judged by fewer annotators than judgements_per_item "
                                           "so far: no human reward until the rest have judged them")
    judgements_per_item: int = Field(description="how many annotators judge each item (feedback.judgements_per_item)")
    rated_flagged: int = Field(description="rated rollouts flagged since (by an annotator, a curator or a buffer "
                                           "operator): kept out of training, in no other rated figure")
    flagged_experiences: int = Field(description="rollouts flagged, each once whatever flagged it (flagged_by)")
    flagged_by: dict[str, int] = Field(
        description="the flagged rollouts by what flagged them: judgement (a flag judgement: an annotator's, or a "
                    "bulk flag's in its owner's or curator's name; it keeps the rollout out of training unless "
                    "feedback.exclude_flagged is off), pipeline (a buffer operator dropped it), admin (a curator set "
                    "it rejected); one flagged two ways counts under each")
    human_edits: int = Field(description="edits that are expert data: accepted where the run requires review, "
                                         "not flagged")
    dpo_pairs: int = Field(description="comparisons with a verdict that a DPO step samples: accepted where the run "
                                       "requires review, neither response flagged")
    dpo_pairs_flagged: int = Field(description="comparisons with a verdict (accepted where the run requires "
                                               "review) that a flag on either response keeps out of training")
    waiting_for_review: dict[str, int] = Field(
        description="by kind (rating, edit, preference): judgements waiting for a reviewer, in no count above yet")
    human_reward: float | None = Field(description="the mean normalised rating of the rated experiences that "
                                                   "training reads (rated_experiences)")
    per_annotator: list[AnnotatorWorkOut] = Field(description="judgements and mean seconds, per annotator and kind")
    per_reviewer: list[ReviewerWorkOut] = Field(description="on a run that requires review: decisions per reviewer "
                                                            "and their accept rate")
    agreement: dict[str, float | int | None] = Field(
        description="over the items rated more than once: their count, percent agreement and Krippendorff's "
                    "alpha (interval metric); over the pairs compared more than once: their count, percent "
                    "agreement and the mean of the annotator pairs' Cohen's kappas (apps/feedback/stats.py)")
    pairwise: dict[str, list[dict[str, Any]]] = Field(
        description="per pair of annotators: `ratings` (items, percent_agreement, krippendorff_alpha) and "
                    "`comparisons` (pairs, percent_agreement, cohen_kappa)")


class FeedbackOut(Schema):
    kind: str = Field(description="rating, edit, preference (a comparison of two responses, listed under both) "
                                  "or flag")
    value: float | None = Field(description="a rating normalised to [0, 1]; a preference from this experience's "
                                            "side: 1 it won, 0 it lost, 0.5 a tie, 0 both bad")
    label: str = Field(description="the scale point, the flag's reason, or the comparison's verdict as the "
                                   "annotator gave it: a_better, b_better (naming `a` and `b`), tie or both_bad")
    edited_text: str
    other: int | None = Field(description="a preference's other experience")
    preferred: bool | None = Field(description="a preference: true when this experience won, false when the other "
                                                "did, null for a tie or both bad (and for the other kinds)")
    a: int | None = Field(description="a preference: the experience the annotator saw as A (the feedback export's `a`)")
    b: int | None = Field(description="a preference: the experience the annotator saw as B")
    comment: str
    annotator: str
    created_at: datetime
    review: str | None = Field(description="on a run with feedback.require_review: pending, accepted (it trains) or "
                                           "rejected (never trained on); null where no review is asked (it counts "
                                           "as it is; flags act at once)")


class ExperienceOut(Schema):
    id: int
    explorer_step: int
    group_id: str
    rollout_index: int
    source: str
    status: str
    prompt: str
    response: str
    reward: float | None
    reward_components: dict[str, Any]
    advantage: float | None
    model_version: int
    response_tokens: int | None
    task_id: int | None
    annotate_url: str
    feedback: list[FeedbackOut] = Field(description="the human judgements of it, oldest first")


class ExperiencePage(Schema):
    count: int = Field(description="the experiences matching; with after_id, those after it (this page's included)")
    page: int = Field(description="with after_id always 1")
    pages: int
    results: list[ExperienceOut] = Field(description="newest step first; with after_id in id order")
    next_after_id: int | None = Field(
        description="with after_id: the after_id to send next (this page's last id, or the one sent when the page "
                    "is empty); null without")


def run_json(run: Run, *, detail: bool = False) -> dict:
    progress = queries.run_progress(run)
    data = {
        "id": run.pk,
        "name": run.name,
        "owner": run.owner.username,
        "status": run.status,
        "shown_status": waits.shown_status(run),
        "mode": run.mode,
        "explorer_step": run.explorer_step,
        "trainer_step": run.trainer_step,
        "model_version": run.model_version,
        "total_steps": progress.total,
        "progress": progress.fraction,
        "latest_reward": queries.latest_reward(run),
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "tags": notes.shown_tags(run.tags),
        "notes": run.notes,
        "url": reverse("run-detail", args=[run.pk]),
    }
    if detail:
        data["duties"] = waits.duties_json(run)["duties"]
        data["config"] = run.config
        data["resumes"] = run.resumes
        data["buffer_retired"] = run.buffer_retired_at and {"at": run.buffer_retired_at.isoformat(),
                                                            **run.buffer_retirement}
        data["checkpoints"] = [
            {
                "version": checkpoint.version,
                "step": checkpoint.step,
                "created_at": checkpoint.created_at,
                "download_url": reverse("checkpoint-download", args=[run.pk, checkpoint.version]),
            }
            for checkpoint in run.checkpoints.order_by("version")
        ]
        data["evaluation"] = bench_results(run)
    return data


def experience_json(experience) -> dict:
    return {
        "id": experience.pk,
        "explorer_step": experience.explorer_step,
        "group_id": experience.group_id,
        "rollout_index": experience.rollout_index,
        "source": experience.source,
        "status": experience.status,
        "prompt": experience.prompt_text,
        "response": experience.response_text,
        "reward": experience.reward,
        "reward_components": experience.reward_components,
        "advantage": experience.advantage,
        "model_version": experience.model_version,
        "response_tokens": queries.response_tokens(experience),
        "task_id": experience.task_id,
        "annotate_url": f"/annotate/experience/{experience.pk}/",
        "feedback": judgements_json(experience),
    }


class IndexOut(Schema):
    docs: str = Field(description="the live documentation")
    schema_url: str = Field(alias="schema", description="this API's OpenAPI document")
    token: str = Field(description="where a logged-in researcher finds their token")
    endpoints: dict[str, str] = Field(description="each path, with what each method does")
