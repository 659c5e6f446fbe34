"""Curation jobs over a selection of the buffer that read every row in Python and change it:
re-score with a reward fn, promote to expert data, run an experience pipeline operator. Each is a
BufferJob kind (services says how such a job fixes its selection, reports progress and stops when
cancelled between two chunks). A re-score and a promotion commit a chunk at a time and can be run
again; a pipeline changes the buffer all or nothing (_run_pipeline says why)."""

import copy
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace

from django.db import transaction
from django.db.models import F
from django.db.models.functions import MD5

from apps.core import jobs
from apps.core.jobs import JobError
from apps.feedback import history as feedback_history
from apps.runs.config_checks import checked_reward_fn
from apps.runs.config_keys import stored_config
from apps.runs.models import Run
from apps.tasksets.store import to_task
from workers.rft.algorithms import group_advantage
from workers.rft.config import ConfigError
from workers.rft.experience import Experience as EngineExperience
from workers.rft.rewards import build_reward
from workers.rft.sampling import HUMAN_REWARD

from .models import BufferJob, Experience
from .services import selected_rows, start_selection_job
from .store import COPIED_FIELDS, to_experience, to_row


def start_rescore(queryset, *, reward_fn, user=None) -> BufferJob:
    """Queue re-scoring the selection with a reward fn spec (a name, or {name: weight}), checked as
    a launch checks explorer.reward_fn (its models confined and stored resolved); raises
    ConfigError naming each bad key."""
    spec = checked_reward_fn(reward_fn)
    return start_selection_job(BufferJob.Kind.RESCORE, queryset, {"reward_fn": spec}, user)


@jobs.register(f"buffer.{BufferJob.Kind.RESCORE}", cancellable=True)
def _rescore(job: BufferJob, progress) -> dict:
    """reward and reward_components from the reward fn, on the response and the row's task; the
    previous reward and components are kept in metadata['rescored'] (with the job's id), and the
    annotators' rating (the `human` component) stays: it is no reward fn's to replace. Rows without
    a task (imported data) have no answer to check and are skipped. The rescored rollouts' groups
    then get their advantages recomputed (_recompute_advantages).

    Each chunk is committed on its own, after its reward fn ran: one transaction over the whole
    job held SQLite's one write lock (and Postgres's row locks) for all of it, and an annotator's
    rating waited for its end (a 2,000-row re-score, 2 ms a row: 5-6 s, Postgres and SQLite;
    0.3-0.6 s a chunk at a time; past 30 s SQLite answers 'database is locked'). So a job stopped
    midway leaves the chunks before rescored, each row saying so; run again (Celery's redelivery,
    rerun_orphaned) it skips the rows its own id marks, whose previous reward is the original, and
    one that ends midway (cancelled, its reward fn failing) recomputes their groups' advantages
    before it ends (a failed one had left them as they were, saying nothing of the rows done)."""
    spec = job.params["reward_fn"]
    reward = build_reward(spec)
    counts = Counter(rescored=0, skipped_without_task=0)
    rows = Experience.objects.select_related("task").only(
        "response_text", "reward", "reward_components", "metadata", "task", "run", "group_id", "source"
    )
    groups = defaultdict(set)  # run id -> the ids of its groups with a rescored rollout
    try:
        for done, chunk in selected_rows(job, rows):
            scored = [row for row in chunk if row.task is not None]
            fresh = [row for row in scored if row.metadata.get("rescored", {}).get("job") != job.pk]
            for row in fresh:
                try:
                    total, components = reward(row.response_text, to_task(row.task))
                except Exception as exc:
                    raise JobError(f"the reward fn failed on experience {row.pk}: {exc!r}") from exc
                previous = {"reward_fn": spec, "previous_reward": row.reward,
                            "previous_components": row.reward_components, "job": job.pk}
                row.metadata = {**row.metadata, "rescored": previous}
                row.reward, row.reward_components = total, components
            for row in scored:
                if row.source == Experience.Source.ROLLOUT and row.run_id is not None:
                    groups[row.run_id].add(row.group_id)
            with transaction.atomic():
                _keep_ratings(fresh)
                Experience.objects.bulk_update(fresh, ["reward", "reward_components", "metadata"])
            counts.update(rescored=len(scored), skipped_without_task=len(chunk) - len(scored))
            progress(done)
    except Exception as exc:  # cancelled, the reward fn failing, anything: the committed chunks stay rescored
        _recompute_advantages(groups)  # their groups' advantages follow the new rewards
        if isinstance(exc, JobError) and counts["rescored"]:
            raise JobError(f"{exc}; the {counts['rescored']:,} rows before it were rescored (each says so in its "
                           "metadata) and their groups' advantages recomputed") from exc
        raise
    counts.update(_recompute_advantages(groups))
    return dict(counts)


def _keep_ratings(rows: list[Experience]) -> None:
    """Give each row the `human` component (the annotators' rating, feedback.set_human_reward's)
    its stored row holds now, or none, locking the rows until the caller's transaction ends. A
    job writes reward_components whole; from the copy it read before its reward fn or operator ran,
    a rating saved meanwhile was overwritten (a 5/5 rating lost on Postgres,
    test_rescore_concurrency). A rating saves under the same row lock (feedback._locked_row): it
    was saved before this read, or it waits for the job's write and reads it."""
    ids = sorted(row.pk for row in rows)  # in id order, as feedback.compare locks two rows
    stored = dict(
        Experience.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", "reward_components")
    )
    for row in rows:
        components = {key: value for key, value in row.reward_components.items() if key != HUMAN_REWARD}
        if HUMAN_REWARD in stored.get(row.pk, {}):
            components[HUMAN_REWARD] = stored[row.pk][HUMAN_REWARD]
        row.reward_components = components


GROUPS_A_QUERY = 500  # group ids in one IN (...): SQLite's bound on query parameters is 32,766


def _recompute_advantages(groups: dict[int, set[str]]) -> Counter:
    """The advantages of these groups (run id -> group ids) from their rewards now, with the run's
    advantage fn as its explorer applies it, over the group's rollouts that are not rejected (as
    the buffer recomputes a rated group's), written to the rows no trainer step has consumed:
    `advantages_recomputed`. A consumed row keeps the advantage it trained with: training already
    done is not undone (`advantages_kept_as_trained`). A group that cannot be recomputed keeps
    advantages that are now stale, each row saying why in metadata['rescored']['advantage_stale']
    (`advantages_stale`). A run whose algorithm compares no groups (PPO, REINFORCE++ read the
    rewards in the trainer; SFT, DPO train on none) has nothing to recompute."""
    counts = Counter(advantages_recomputed=0, advantages_kept_as_trained=0, advantages_stale=0)
    for run in Run.objects.filter(pk__in=list(groups)).only("config"):
        try:
            advantage, stale = group_advantage(stored_config(run.config or {})), None
        except ConfigError as exc:
            advantage, stale = None, f"the run's config no longer reads: {exc}"
        if advantage is None and stale is None:
            continue
        ids = sorted(groups[run.pk])
        for i in range(0, len(ids), GROUPS_A_QUERY):
            with transaction.atomic():
                counts.update(_recompute_chunk(run, ids[i : i + GROUPS_A_QUERY], advantage, stale))
    return counts


def _recompute_chunk(run: Run, group_ids: list[str], advantage, stale: str | None) -> Counter:
    """_recompute_advantages for some of a run's groups, their rows locked from the read of their
    status to the write: a row a trainer step took meanwhile was given the advantage it did not
    train with (the step read the old one; the write, of a row read unconsumed, came after). A row
    a step has claimed and trains on now keeps its advantage as a consumed one does."""
    counts = Counter()
    members = defaultdict(list)
    rows = Experience.objects.filter(
        run=run, group_id__in=group_ids, source=Experience.Source.ROLLOUT
    ).exclude(status=Experience.Status.REJECTED)
    fields = ("group_id", "status", "claimed_by", "reward", "advantage", "metadata")
    for row in rows.select_for_update().only(*fields).order_by("pk"):
        members[row.group_id].append(row)
    changed = []
    for group in members.values():
        try:
            if stale:
                raise ValueError(stale)
            values = _advantages(group, *advantage)
        except ValueError as exc:
            for row in group:
                rescored = {**row.metadata.get("rescored", {}), "advantage_stale": str(exc)}
                row.metadata = {**row.metadata, "rescored": rescored}
            changed += group
            counts["advantages_stale"] += len(group)
            continue
        for row, value in zip(group, values):
            if row.status == Experience.Status.CONSUMED or row.claimed_by is not None:
                counts["advantages_kept_as_trained"] += 1
            else:
                row.advantage = value
                changed.append(row)
                counts["advantages_recomputed"] += 1
    Experience.objects.bulk_update(changed, ["advantage", "metadata"])
    return counts


def _advantages(rows: list[Experience], fn: str, params: dict) -> list[float]:
    """One group's advantages from its rewards, as the explorer's last operator gives them (whole
    episodes compared where the rows are steps of one); ValueError where the steps of an episode,
    rescored each on its own text, now carry different rewards."""
    from workers.rft.pipelines import group_advantage as advantage_op  # as check_operator: where it is needed

    experiences = [
        EngineExperience(None, row.group_id, 0, [], [], [], reward=row.reward or 0.0, metadata=row.metadata)
        for row in rows
    ]
    advantage_op(experiences, None, fn=fn, by_episode=all("rollout" in row.metadata for row in rows), **params)
    return [experience.advantage for experience in experiences]


def start_promotion(queryset, *, user=None) -> BufferJob:
    return start_selection_job(BufferJob.Kind.PROMOTE, queryset, {}, user)


@jobs.register(f"buffer.{BufferJob.Kind.PROMOTE}", cancellable=True)
def _promote(job: BufferJob, progress) -> dict:
    """An expert copy of each selected experience (MIX and SFT imitate expert data), ready, in
    the same run, with the original as its parent. Expert rows, and rows promoted before, are
    skipped, so the job commits a chunk at a time: stopped midway, it keeps the copies made, and run
    again it makes the rest."""
    counts = Counter(promoted=0, skipped=0)
    for done, chunk in selected_rows(job, Experience.objects.all()):
        with transaction.atomic():  # a chunk at a time, as _rescore: a re-run skips what is copied
            promoted_before = set(
                Experience.objects.filter(
                    parent_id__in=[row.pk for row in chunk], source=Experience.Source.EXPERT
                ).values_list("parent_id", flat=True)
            )
            copies = [
                _expert_copy(row)
                for row in chunk
                if row.source != Experience.Source.EXPERT and row.pk not in promoted_before
            ]
            Experience.objects.bulk_create(copies)
        counts.update(promoted=len(copies), skipped=len(chunk) - len(copies))
        progress(done)
    return dict(counts)


def _expert_copy(row: Experience) -> Experience:
    fields = {name: getattr(row, name) for name in COPIED_FIELDS if name != "use_count"}
    fields |= {
        "source": Experience.Source.EXPERT,
        "group_id": f"promoted-{row.group_id}"[:100],
        "advantage": None,  # expert data is imitated, not weighted
    }
    return Experience(
        **fields, run_id=row.run_id, task_id=row.task_id, status=Experience.Status.READY, parent_id=row.pk
    )


def check_operator(name: str, params: dict):
    """The experience pipeline operator `name` (workers.rft.pipelines) if `params` are what it
    declares, checked as a run config's pipeline is (config.operator_issues: names, types, bounds);
    raises ConfigError naming each bad one otherwise."""
    from workers.rft.config import ConfigError, operator_issues
    from workers.rft.pipelines import EXPERIENCE_OPERATORS  # imports torch: only where an operator is asked for

    issues = operator_issues([{"name": name, **params}], EXPERIENCE_OPERATORS, "operator")
    if issues:
        raise ConfigError(issues)
    return EXPERIENCE_OPERATORS.get(name)


def start_pipeline(queryset, *, operator: str, params: dict, user=None) -> BufferJob:
    """Queue running an experience pipeline operator over the selection; raises ConfigError for an
    unknown operator or parameters it does not declare."""
    check_operator(operator, params)
    # Operators compare experiences within a task (dedupe) or a group (group_std_filter): the
    # rows are processed in task and group order, never splitting a task between chunks.
    order = (F("task_id").asc(nulls_last=True), MD5("prompt_text"), "group_id", "pk")
    return start_selection_job(
        BufferJob.Kind.PIPELINE, queryset, {"operator": operator, "params": params}, user, order=order
    )


@jobs.register(f"buffer.{BufferJob.Kind.PIPELINE}", cancellable=True)
def _run_pipeline(job: BufferJob, progress) -> dict:
    """Run the operator as the explorer would, over the selection one whole task at a time, and
    store the outcome: rows it drops become `rejected` (metadata['rejected_by'] names it), changed
    fields are saved, experiences it adds (promote_to_expert's copies) are inserted with the row
    they came from as parent. Rows without token ids (text-only imported data) are skipped: the
    operators measure and compare responses by their tokens.

    Unlike a re-score, it changes the buffer in one transaction: run again after a partial commit
    (Celery's redelivery, rerun_orphaned) it would run the operator over its own output (a reward
    shaping applied twice, a dedupe that had rejected rows comparing the rest again), and nothing
    in a row says which operator run made it so. On SQLite annotators' saves wait for it. Its
    counts commit with its changes: run again after that (its process killed, or its end not
    saved: jobs.run_job lets such a job go), it returns them and changes nothing."""
    if job.result:
        return job.result
    from workers.rft.pipelines import EXPERIENCE_OPERATORS, PipelineContext, build_operators, run_experience_operators

    name = job.params["operator"]
    ops = build_operators(EXPERIENCE_OPERATORS, [{"name": name, **job.params["params"]}])
    context = PipelineContext()
    counts = Counter(kept=0, changed=0, rejected=0, added=0, skipped_without_tokens=0)
    with transaction.atomic():
        for done, rows in _whole_tasks(selected_rows(job, Experience.objects.all())):
            usable = [row for row in rows if row.response_ids is not None]
            counts["skipped_without_tokens"] += len(rows) - len(usable)
            try:
                outcome, metrics = run_experience_operators(ops, [_engine_experience(row) for row in usable], context)
            except Exception as exc:
                raise JobError(
                    f"operator {name!r} failed on experiences {usable[0].pk}…{usable[-1].pk}: {exc!r}"
                ) from exc
            counts.update(_store_outcome(usable, outcome, name))
            counts.update({key: value for key, value in metrics.items() if isinstance(value, int)})
            progress(done)
        BufferJob.objects.filter(pk=job.pk).update(result=dict(counts))
    return dict(counts)


def _task_key(row: Experience):
    """What the operators take for the row's task: the task, or for a row without one, its prompt."""
    return row.task_id if row.task_id is not None else ("prompt", row.prompt_text)


def _engine_experience(row: Experience):
    """The row as the engine's Experience, with copies of everything an operator might change in place."""
    experience = to_experience(row)
    return replace(
        experience,
        task_id=_task_key(row),
        prompt_ids=list(row.prompt_ids or []),
        response_ids=list(row.response_ids),
        action_mask=list(row.action_mask or []),
        messages=copy.deepcopy(row.messages),
        reward_components=copy.deepcopy(row.reward_components),
        metadata=copy.deepcopy(row.metadata),
    )


def _store_outcome(rows: list[Experience], outcome: list, operator: str) -> Counter:
    by_id = {row.pk: row for row in rows}
    kept, changed, changed_fields, added = set(), [], set(), []
    for experience in outcome:
        row = by_id.get(experience.id)
        if row is None:
            raise JobError(
                f"operator {operator!r} made an experience from none of the selected ones; the admin cannot place it"
            )
        if experience.id in kept:  # a second experience from the same row: a new one
            new = to_row(experience, row.run_id)
            new.task_id, new.parent_id = row.task_id, row.pk  # the operator saw a stand-in task key
            added.append(new)
            continue
        kept.add(experience.id)
        fields = [name for name in COPIED_FIELDS if not _same(getattr(row, name), getattr(experience, name))]
        for name in fields:
            setattr(row, name, getattr(experience, name))
        if fields:
            changed.append(row)
            changed_fields.update(fields)
    rejected = [row for row in rows if row.pk not in kept]
    for row in rejected:
        row.status, row.metadata = Experience.Status.REJECTED, {**row.metadata, "rejected_by": operator}
    if "reward_components" in changed_fields:
        _keep_ratings(changed)
    if changed:
        Experience.objects.bulk_update(changed, sorted(changed_fields))
    Experience.objects.bulk_update(rejected, ["status", "metadata"])
    feedback_history.status_decided([row.pk for row in rejected])
    Experience.objects.bulk_create(added)
    return Counter(kept=len(kept), changed=len(changed), rejected=len(rejected), added=len(added))


def _same(stored, produced) -> bool:
    # A missing token array reaches the operators as an empty list.
    return stored == produced or (stored is None and produced == [])


def _whole_tasks(chunks: Iterator[tuple[int, list]]) -> Iterator[tuple[int, list]]:
    """Re-cut (rows read, rows) chunks so that no task's experiences are split between two."""
    pending, done = [], 0
    for done, rows in chunks:
        rows = pending + rows
        cut = len(rows)
        while cut and _task_key(rows[cut - 1]) == _task_key(rows[-1]):
            cut -= 1
        pending = rows[cut:]
        if cut:
            yield done, rows[:cut]
    if pending:
        yield done, pending
