"""Read-side helpers shared by the run pages and the JSON API: summaries, metrics, rollout groups."""

import math
from dataclasses import dataclass
from itertools import chain

from django.db.models import JSONField, OuterRef, Subquery
from django.db.models.functions import Length

from apps.buffer.models import Experience
from workers.rft.algorithms import ALGORITHMS
from workers.rft.config import TrainerConfig
from workers.rft.sampling import empty_batch_why

from .models import MetricPoint, Run

# The explorer's mean reward, under the names the engine has used for it (newest convention first).
REWARD_KEYS = ("reward/mean", "reward_mean", "reward")
# Reward fns that score 1 for a correct answer and 0 otherwise (workers/rft/rewards): the mean of
# one over the eval tasks is the held-out accuracy.
ACCURACY_KEYS = ("accuracy", "exact_match", "numeric", "countdown")
ROLE_ORDER = [role for role, _ in MetricPoint.Role.choices]
TOKEN_BYTES = Experience._meta.get_field("response_ids").dtype.itemsize


def with_latest_explorer_metrics(runs):
    """Annotate each run with `latest_explorer` (the values of its last explorer step), in one query."""
    last = MetricPoint.objects.filter(run=OuterRef("pk"), role=MetricPoint.Role.EXPLORER).order_by("-step")
    return runs.annotate(latest_explorer=Subquery(last.values("values")[:1], output_field=JSONField()))


def latest_reward(run: Run) -> float | None:
    values = getattr(run, "latest_explorer", None) or {}
    for key in REWARD_KEYS:
        value = values.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return value
    return None


@dataclass(frozen=True)
class Progress:
    done: int
    total: int

    @property
    def fraction(self) -> float | None:
        return min(self.done / self.total, 1.0) if self.total else None

    @property
    def percent(self) -> int:
        return round(100 * (self.fraction or 0))


def run_progress(run: Run) -> Progress:
    """Trainer steps out of trainer.total_steps (explorer steps for a run that only explores); a
    bench run's evaluation, done or not (it trains nothing: a completed one read "0 / 100")."""
    if run.mode == Run.Mode.BENCH:
        return Progress(int(run.status == Run.Status.COMPLETED), 1)
    total = (run.config.get("trainer") or {}).get("total_steps") or 0
    done = run.explorer_step if run.mode == Run.Mode.EXPLORE else run.trainer_step
    return Progress(done, total if isinstance(total, int) else 0)


def skipped_steps(run: Run) -> dict | None:
    """{count, all, why} of the run's trainer steps that found nothing to train on and changed
    nothing (their points say skipped; a replayed step's replaces its own), for the run page:
    a run of 100 of them read as plain "completed" at model v100. None where there are none."""
    count = run.metrics.filter(role=MetricPoint.Role.TRAINER, values__has_key="skipped").count()
    if not count:
        return None
    algorithm = ALGORITHMS.get((run.config.get("algorithm") or {}).get("name"))
    why = empty_batch_why(algorithm is None or algorithm.uses_rollouts)
    return {"count": count, "all": count >= run.trainer_step, "why": why}


# Where a run's held-out score and train reward are, first found first: (chart "role/key", label).
HELD_OUT = [(f"eval/{key}", "Held-out accuracy") for key in ACCURACY_KEYS] + [
    (f"eval/{key}", "Eval reward") for key in REWARD_KEYS
]
# A run that only trains (SFT, DPO) has no rollouts to reward: its loss is what it shows.
TRAIN_REWARD = [(f"{role}/{key}", "Train reward") for role in ("explorer", "trainer") for key in REWARD_KEYS] + [
    ("trainer/loss", "Train loss")
]
THROUGHPUT = [("trainer/tokens_per_s", "Throughput"), ("explorer/tokens_per_s", "Throughput")]


def overview_charts(*, bench: bool = False) -> list[list[str]]:
    """The chart groups the pages show first (static/js/charts.js adds loss, KL, entropy, length);
    a bench run's its score alone (it trains nothing)."""
    return [[chart for chart, _ in candidates] for candidates in ((HELD_OUT,) if bench else (HELD_OUT, TRAIN_REWARD))]


def key_figures(run: Run) -> list[dict]:
    """The figures atop the run page, each from the first of its candidate charts that the run
    reports, with that candidate's label. The page fills in values and sparklines from the live
    snapshot (static/js/run_page.js); "step" is the run's own counter, not a chart."""
    eval_interval = (run.config.get("explorer") or {}).get("eval_interval") or 0
    if run.mode == Run.Mode.BENCH:  # an evaluation: its score and whether it is done (no training figures)
        return [{"id": "heldout", "candidates": HELD_OUT, "format": "fraction",
                 "pending": "scored once every eval task is answered"}, {"id": "step"}]
    has_eval = eval_interval or run.metrics.filter(role="eval").exists()
    figures = [
        {
            "id": "heldout",
            "candidates": HELD_OUT,
            "format": "fraction",
            "pending": f"evaluated every {eval_interval} explorer steps" if eval_interval else "not evaluated yet",
        },
        {"id": "reward", "candidates": TRAIN_REWARD, "format": "fraction"},
        {"id": "step"},
        {"id": "throughput", "candidates": THROUGHPUT, "format": "rate", "unit": "tokens/s"},
    ]
    return [figure for figure in figures if figure["id"] != "heldout" or has_eval]


def checkpoint_schedule(run: Run) -> str:
    """When the trainer saves checkpoints (trainer.save_interval, save_interval_s, keep_checkpoints),
    in words, for the run page's empty checkpoint table."""
    trainer = {**TrainerConfig().model_dump(), **(run.config.get("trainer") or {})}
    every = []
    if trainer["save_interval"]:
        every.append(f"every {trainer['save_interval']} trainer steps")
    if trainer["save_interval_s"]:
        seconds = trainer["save_interval_s"]
        every.append(f"every {seconds / 60:g} min" if seconds >= 60 else f"every {seconds:g} s")
    when = " and ".join(every) + ", and at the end" if every else "only at the end"
    kept = trainer["keep_checkpoints"]
    return f"one is saved {when}; the newest {kept} {'is' if kept == 1 else 'are'} kept"


def metrics_by_role(run: Run, *, role: str | None = None, since: int | None = None, keys: list[str] | None = None,
                    limit: int | None = None) -> dict:
    """{role: [{step, time, values}]} in step order, time in Unix seconds (when the point was
    recorded: the charts' time axes); `since` keeps the steps after it. `keys` keeps those values of
    each point, and only the points holding one of them (a key logged every tenth step fills a page
    with its own points, not with nine empty ones in ten). `limit` keeps each role's first `limit`
    points, a query a role, each served from `since` on by the (run, role, step) index however long
    the run (the API's answer; the live page's snapshot takes every point)."""
    points = run.metrics.all()
    if role:
        points = points.filter(role=role)
    if since is not None:
        points = points.filter(step__gt=since)
    if keys:
        points = points.filter(values__has_any_keys=keys)
    columns = ("role", "step", "time", "values")
    if limit is None:
        rows = points.order_by("role", "step").values_list(*columns)
    else:
        each = [role] if role else ROLE_ORDER
        rows = chain.from_iterable(points.filter(role=r).order_by("step").values_list(*columns)[:limit] for r in each)
    metrics = {}
    for point_role, step, time, values in rows:
        if keys:
            values = {key: values[key] for key in keys if key in values}
        metrics.setdefault(point_role, []).append({"step": step, "time": unix_time(time), "values": values})
    return dict(sorted(metrics.items(), key=lambda item: _role_rank(item[0])))


def unix_time(time) -> float:
    """A point's time as the live path carries it: Unix seconds, to the millisecond."""
    return round(time.timestamp(), 3)


def _role_rank(role: str) -> int:
    return ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)


def experiences_for_browsing(experiences):
    """Experiences without their token arrays (a page needs only their length)."""
    return experiences.defer("prompt_ids", "response_ids", "action_mask", "logprobs").annotate(
        response_bytes=Length("response_ids")
    )


def response_tokens(experience) -> int | None:
    size = getattr(experience, "response_bytes", None)
    return None if size is None else size // TOKEN_BYTES


@dataclass
class RolloutGroup:
    """The responses to one task at one explorer step; `matched` are the ones the filters picked."""

    explorer_step: int
    group_id: str
    experiences: list
    matched: set

    @property
    def prompt(self) -> str:
        return self.experiences[0].prompt_text if self.experiences else ""

    @property
    def explorer(self) -> str:
        """The explorer duty that rolled the group out, where the run has several ("explorer-1")."""
        return self.experiences[0].metadata.get("explorer", "") if self.experiences else ""

    @property
    def rewards(self) -> list[float]:
        return [e.reward for e in self.experiences if e.reward is not None]

    @property
    def reward_mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    @property
    def reward_std(self) -> float | None:
        mean = self.reward_mean
        return None if mean is None else (sum((r - mean) ** 2 for r in self.rewards) / len(self.rewards)) ** 0.5


def group_keys(matching):
    """The (explorer_step, group_id) of every group with a matching experience, newest step first.
    Within a step, shorter ids first: ids are "<step>-<task id>", and as text 72-22 came before 72-3.
    The length is a key after the step, so Postgres still sorts each step's groups incrementally on
    the step index, as it did by id alone."""
    return (
        matching.order_by("-explorer_step", Length("group_id"), "group_id")
        .values_list("explorer_step", "group_id")
        .distinct()
    )


def rollout_groups(run: Run, keys, matching) -> list[RolloutGroup]:
    """Whole groups for the given keys (a page of group_keys), with the matching members marked."""
    keys = list(keys)
    if not keys:
        return []
    steps = {step for step, _ in keys}
    members = experiences_for_browsing(
        run.experiences.filter(explorer_step__in=steps, group_id__in={group for _, group in keys})
    ).order_by("rollout_index", "pk")
    matched = set(matching.filter(explorer_step__in=steps).values_list("pk", flat=True))
    groups = {key: RolloutGroup(key[0], key[1], [], set()) for key in keys}
    for experience in members:
        group = groups.get((experience.explorer_step, experience.group_id))
        if group is not None:
            experience.response_tokens = response_tokens(experience)
            group.experiences.append(experience)
            if experience.pk in matched:
                group.matched.add(experience.pk)
    return list(groups.values())
