"""The engine's ExperienceBuffer protocol (workers/rft/protocols.py) over Postgres, for one run.

Sampling applies the run's `feedback` settings (docs/feedback.md): rated rollouts train with
their human reward and group advantages recomputed from it, human edits join the expert data,
flagged experiences are rejected and never sampled, and preference pairs feed DPO.
"""
import time
from collections import defaultdict
from collections.abc import Sequence
from functools import cache, cached_property

import psycopg
from django.core.exceptions import EmptyResultSet
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Exists, F, Func, IntegerField, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.feedback.models import Feedback, PairUse
from apps.runs.config_keys import stored_config
from workers.rft import stopping
from workers.rft.config import RunConfig
from workers.rft.experience import EXPERT_SOURCES, SOURCES, Experience, PreferencePair
from workers.rft.sampling import HUMAN_REWARD, USUAL_SOURCES, apply_human_feedback, sample_key

from .models import IMPORTED_PAIR_GROUP, USES_LEFT
from .models import Experience as ExperienceRow

STALE_SOURCES = ("rollout", "synthetic")  # expert and human data never go stale
RATING_POLL_S = 0.5  # how often a trainer step waiting for ratings looks again
COPIED_FIELDS = (
    "group_id", "rollout_index", "source", "prompt_text", "response_text", "messages", "prompt_ids",
    "response_ids", "action_mask", "logprobs", "reward", "reward_components", "advantage", "model_version",
    "priority", "use_count", "explorer_step", "metadata",
)


def _pair(chosen: ExperienceRow, rejected: ExperienceRow, pair_id: int) -> PreferencePair:
    return PreferencePair(
        prompt_ids=chosen.prompt_ids, chosen_ids=chosen.response_ids, rejected_ids=rejected.response_ids,
        task_id=chosen.task_id, id=pair_id, chosen_mask=chosen.action_mask, rejected_mask=rejected.action_mask,
    )


def storable(value):
    """Postgres text and jsonb cannot hold NUL, which a byte-level model can generate: it becomes
    U+FFFD in texts (the token ids keep the exact output)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value


TEXT_FIELDS = ("prompt_text", "response_text", "messages", "reward_components", "metadata")
ARRAY_FIELDS = ("prompt_ids", "response_ids", "action_mask", "logprobs")


def to_row(exp: Experience, run_id: int | None) -> ExperienceRow:
    fields = {name: getattr(exp, name) for name in COPIED_FIELDS}
    fields.update((name, storable(fields[name])) for name in TEXT_FIELDS)
    return ExperienceRow(run_id=run_id, task_id=exp.task_id, status=ExperienceRow.Status.READY, **fields)


def insert(experiences: Sequence[Experience], run_id: int | None) -> None:
    """Insert with a binary COPY on Postgres, each column prepared once for the batch (the arrays
    packed by PackedArrayField.pack). The text COPY it replaced prepared every field of every
    row through Django (get_db_prep_save: 2,816 calls for 128 rows) and hex-escaped the arrays:
    1,434 against 4,097 experiences/s (bench/README, issue #29). The other database the settings
    allow, embedded SQLite, has no COPY and takes bulk_create. A natural-key conflict raises
    IntegrityError on both."""
    if connection.vendor != "postgresql":
        ExperienceRow.objects.bulk_create([to_row(e, run_id) for e in experiences], batch_size=500)
        return
    columns = {name: [getattr(e, name) for e in experiences] for name in COPIED_FIELDS}
    for name in TEXT_FIELDS:
        columns[name] = [storable(value) for value in columns[name]]
    for name in ARRAY_FIELDS:
        field = ExperienceRow._meta.get_field(name)
        columns[name] = [field.pack(value) for value in columns[name]]
    count = len(experiences)
    columns |= {
        "run_id": [run_id] * count, "task_id": [e.task_id for e in experiences],
        "status": [ExperienceRow.Status.READY.value] * count, "created_at": [timezone.now()] * count,
    }
    names = list(columns)
    types = [column_types()[name] for name in names]  # before the COPY holds the connection
    sql = f"COPY {ExperienceRow._meta.db_table} ({', '.join(names)}) FROM STDIN (FORMAT BINARY)"
    # The raw psycopg cursor (Django's wrapper has no copy); errors still become Django's.
    with connection.cursor() as cursor, connection.wrap_database_errors, cursor.cursor.copy(sql) as copy:
        copy.set_types(types)
        for row in zip(*columns.values(), strict=True):
            copy.write_row(row)


def _first_of_each_key(experiences: Sequence[Experience], stored: set) -> list[Experience]:
    """All but the rollouts whose natural key is in `stored` or comes earlier in the batch, and
    the expert copies promoted from a stored rollout (a replayed step's copies were stored again)."""
    seen, first = set(stored), []
    for e in experiences:
        if e.source == "rollout":
            if e.key in seen:
                continue
            seen.add(e.key)
        elif e.promoted_from in stored:
            continue
        first.append(e)
    return first


@cache
def column_types() -> dict[str, int]:
    """The Postgres type of each column of the table, which a binary COPY must name: read from
    the catalogue, so it cannot drift from the migrations (built-in types have the same ids in
    every database)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
            [ExperienceRow._meta.db_table],
        )
        return dict(cursor.fetchall())


def to_experience(row: ExperienceRow) -> Experience:
    return Experience(task_id=row.task_id, id=row.pk, **{name: getattr(row, name) for name in COPIED_FIELDS})


def claim_statement(picks: Sequence[tuple], claimer: int) -> tuple[str, list] | None:
    """The SQL and parameters that claim the first n rows of each (query, n) in `picks` for run
    `claimer`, and name
    the pick each row came from (None: none can match anything). Compiled from the querysets, so
    the store and the rule it follows cannot drift; inside a transaction (FOR UPDATE compiles
    only there)."""
    table = ExperienceRow._meta.db_table
    columns = ["id", "task_id", *(ExperienceRow._meta.get_field(name).column for name in COPIED_FIELDS)]
    ctes, parts, params = [], [], []
    for part, (query, n, _) in enumerate(picks):
        try:
            locked = query.values("id").select_for_update(skip_locked=True, of=("self",))
            sql, pick_params = locked[:n].query.sql_with_params()
        except EmptyResultSet:  # no sources asked for, or n = 0
            continue
        ctes.append(f"pick{part} AS MATERIALIZED ({sql})")
        parts.append(f"SELECT id, {part} AS part FROM pick{part}")
        params += pick_params
    if not ctes:
        return None
    return (
        f"WITH {', '.join(ctes)}, picked AS ({' UNION ALL '.join(parts)}) "
        f"UPDATE {table} SET claimed_at = %s, claimed_by = %s FROM picked WHERE {table}.id = picked.id "
        f"RETURNING picked.part, {', '.join(f'{table}.{column}' for column in columns)}",
        [*params, timezone.now(), claimer],
    )


def claim(picks: Sequence[tuple], claimer: int) -> list[list[Experience]]:
    """For each (ordered query, n) in `picks`, its first n rows that no other transaction holds,
    all claimed for run `claimer` and read in one statement: each queryset's own SQL picks them (FOR UPDATE SKIP
    LOCKED, so two trainers never share a row), the UPDATE sets claimed_at and returns what an
    Experience needs, read into Experiences without model instances (Django's rows and converters
    were half the Python time of a 256-row sample). A MIX step's rollouts and expert data are one
    round trip. The picks' rows must not overlap (a row two picks name is claimed and returned once).

    The rows come back in binary, on a cursor of its own: Django's cursors bind on the client and
    read text, where each token array crosses as hex, twice its size, encoded by the server and
    decoded here (256 rows of 512-token arrays: 17 ms as text, 12.5 in binary; bench/README).
    JSON then arrives decoded, by psycopg instead of Django's converter."""
    fields = [ExperienceRow._meta.get_field(name) for name in COPIED_FIELDS]
    claimed = [[] for _ in picks]
    with transaction.atomic():  # FOR UPDATE compiles only in a transaction
        statement = claim_statement(picks, claimer)
        if statement is None:
            return claimed
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(*statement, binary=True)
            rows = cursor.fetchall()
    if not rows:
        return claimed
    # Column by column: the token arrays as numpy views of one buffer each (fields.unpack_many).
    columns = list(zip(*rows))
    values = {"id": columns[1], "task_id": columns[2]}
    for f, column in zip(fields, columns[3:], strict=True):
        values[f.name] = f.unpack_many(column) if f.name in ARRAY_FIELDS else column
    for part, row in zip(columns[0], zip(*values.values())):
        claimed[part].append(Experience(**dict(zip(values, row, strict=True))))
    for experiences, (_, _, newest_first) in zip(claimed, picks):  # RETURNING keeps no order
        experiences.sort(key=lambda e, newest_first=newest_first: sample_key(e, newest_first))
    return claimed


def judged_pairs(run_ids: Sequence[int], *, exclude_flagged: bool, per_item: dict[int, int] | None = None):
    """The annotators' preferences on the runs' experiences that a DPO step samples (and the run
    page counts as DPO pairs), one per pair of responses. A pair counts once its run's
    `judgements_per_item` annotators have compared it and none of their verdicts waits for a
    reviewer; of the verdicts that may reach training (a rejected one is left out), more than half
    must choose the same side, and the earliest of those stands for the pair. Ties and "both bad"
    choose no side, so opposite verdicts, or a verdict and a tie, make no pair (docs/feedback.md,
    "Several annotators per item"). With `feedback.exclude_flagged`, neither response flagged.
    `per_item`: {run id: its judgements_per_item} where the caller has read the runs' configs."""
    from apps.feedback.services import judgements_per_item  # apps.feedback imports this module
    from apps.runs.models import Run

    comparisons = Feedback.objects.filter(kind=Feedback.Kind.PREFERENCE)
    # The pair's verdicts each way round, counted apart: an OR of the two ways is no index lookup
    # (4,000 verdicts on 2,000 pairs: 5 s on SQLite, against 0.05 s so). Postgres, analyzed: 0.17 s
    # to count them or sample 16 (0.02 and 0.08 s when each verdict was a pair), beside a DPO step's seconds.
    ways = [comparisons.filter(experience=OuterRef("experience"), other=OuterRef("other")),
            comparisons.filter(experience=OuterRef("other"), other=OuterRef("experience"))]
    side = Q(value=1.0) | Q(value__isnull=True)  # a verdict for `experience`; ties and "both bad" are no pair
    trains = Q(review__in=Feedback.TRAINED)
    same_side = ways[0].filter(side, trains)
    if per_item is None:
        per_item = {run.pk: judgements_per_item(run) for run in Run.objects.filter(pk__in=run_ids)}
    enough = Q(pk__in=[])
    for run_id, places in per_item.items():
        enough |= Q(experience__run_id=run_id, compared__gte=places)
    prefs = (
        comparisons.filter(side, trains, experience__run_id__in=run_ids)
        .alias(compared=_count(ways[0]) + _count(ways[1]),
               decided=_count(ways[0].filter(trains)) + _count(ways[1].filter(trains)),
               agreeing=_count(same_side))
        .filter(enough, decided__lt=F("agreeing") * 2)  # a majority of the verdicts that train
        .exclude(Exists(ways[0].filter(review=Feedback.Review.PENDING)))
        .exclude(Exists(ways[1].filter(review=Feedback.Review.PENDING)))
        .exclude(Exists(same_side.filter(pk__lt=OuterRef("pk"))))  # the earliest stands for the pair
    )
    if exclude_flagged:
        rejected = ExperienceRow.Status.REJECTED
        prefs = prefs.exclude(experience__status=rejected).exclude(other__status=rejected)
    return prefs


def _count(rows):
    """How many of `rows` (a subquery on OuterRef), as a number the outer query filters on."""
    return Coalesce(Subquery(rows.order_by().values(n=Func(F("pk"), function="COUNT", output_field=IntegerField()))),
                    0)


def trained_ratings(rows):
    """Of `rows`, the rated ones whose human reward training reads: not rejected (an annotator's flag
    under feedback.exclude_flagged, a curator, a buffer operator), since a rejected row is never
    sampled nor compared in its group (DjangoExperienceBuffer._apply_feedback). The run page's
    rated count and human reward are these (feedback.stats.summary); a rated row flagged later
    counts apart, as rated but not trained on."""
    return rows.filter(reward_components__has_key=HUMAN_REWARD).exclude(status=ExperienceRow.Status.REJECTED)


class DjangoExperienceBuffer:
    """The experiences of one run (its rollouts, and the expert data the run seeded from its expert taskset)."""

    def __init__(self, run_id: int, explorer: str | None = None):
        self.run_id = run_id
        # The explorer duty writing (one of several: "explorer-1"): its rollouts say so in their
        # metadata, for the rollouts page (#42, finding 11).
        self.explorer = explorer

    @cached_property
    def config(self) -> RunConfig:
        from apps.runs.models import Run  # apps.runs imports this module

        return stored_config(Run.objects.get(pk=self.run_id).config or {})

    def _rows(self):
        return ExperienceRow.objects.filter(run_id=self.run_id)

    def write(self, experiences: Sequence[Experience]) -> int:
        """Store the experiences, but not the rollouts whose natural key (explorer step, task,
        rollout index) is stored already or comes earlier in the batch; returns how many were new.

        Where every rollout names its task, the table's unique constraint finds the stored ones: the
        COPY goes first, and only a step written before (a replay, which the constraint refuses)
        asks the table which rollouts are new. That question was one round trip of every write:
        1.9 of a 128-row write's 15 ms (bench/README, issue #29). Rollouts without a task (NULL
        never conflicts) are always asked about."""
        unknown = {e.source for e in experiences} - set(SOURCES)
        if unknown:
            raise ValueError(f"unknown experience source(s) {sorted(unknown)}")
        if self.explorer is not None:
            for e in experiences:
                if e.source == "rollout":
                    e.metadata = {**e.metadata, "explorer": self.explorer}
        new = _first_of_each_key(experiences, stored=set())
        if all(e.task_id is not None for e in new if e.source == "rollout"):
            try:
                with transaction.atomic():
                    insert(new, self.run_id)
                return len(new)
            except IntegrityError:
                pass  # the step was written before, in part or whole
        with transaction.atomic():
            new = self._new(new)
            try:
                with transaction.atomic():  # a savepoint: a failed COPY leaves nothing behind
                    insert(new, self.run_id)
            except IntegrityError:
                # A concurrent replay of the same step committed some of them first: it wins,
                # harmlessly, and what it stored is not new here (read committed: we now see it).
                new = self._new(new)
                rows = [to_row(e, self.run_id) for e in new]
                ExperienceRow.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
        return len(new)

    def _new(self, experiences: Sequence[Experience]) -> list[Experience]:
        """The experiences to store: all but the rollouts whose natural key is stored already or
        comes earlier in the same batch."""
        steps = {e.explorer_step for e in experiences if e.source == "rollout"}
        stored = set(
            self._rows().filter(source="rollout", explorer_step__in=steps)
            .values_list("explorer_step", "task_id", "rollout_index")
        ) if steps else set()
        return _first_of_each_key(experiences, stored)

    def count(self, *, sources: Sequence[str], group_prefix: str = "") -> int:
        return self._rows().filter(source__in=sources, group_id__startswith=group_prefix).count()

    def has_explorer_step(self, step: int) -> bool:
        return self._rows().filter(source="rollout", explorer_step=step).exists()

    def _sampleable(self, sources: Sequence[str], min_model_version: int | None):
        """Ready, unclaimed rows the trainer may take: the run's own, plus the human edits of the
        feedback source runs; with feedback.rated_only, rollouts only once rated."""
        feedback = self.config.feedback
        if not feedback.edits_as_expert:
            sources = [s for s in sources if s != "human_edit"]
        query = ExperienceRow.objects.filter(
            Q(run_id=self.run_id) | Q(run_id__in=feedback.source_runs, source="human_edit"),
            status=ExperienceRow.Status.READY, source__in=sources, claimed_at__isnull=True,
        )
        if min_model_version is not None:
            query = query.exclude(source__in=STALE_SOURCES, model_version__lt=min_model_version)
        if feedback.rated_only:
            query = query.exclude(Q(source__in=STALE_SOURCES) & ~Q(reward_components__has_key=HUMAN_REWARD))
        return query

    def sample(self, n: int, *, sources: Sequence[str], min_model_version: int | None = None) -> list[Experience]:
        """Claims the rows it returns (SKIP LOCKED), so concurrent trainers never share one."""
        return self._claim([(n, sources, min_model_version)])[0]

    def sample_mix(self, n: int, n_expert: int, *, min_model_version: int | None = None):
        """sample(n) of the usual sources and sample(n_expert) of expert data, in one claim."""
        usual, expert = self._claim([(n, USUAL_SOURCES, min_model_version), (n_expert, EXPERT_SOURCES, None)])
        return usual, expert

    def _claim(self, parts: Sequence[tuple]) -> list[list[Experience]]:
        """Each (n, sources, min_model_version) of `parts` as `sample` takes it, claimed together."""
        picks = []
        for n, sources, min_model_version in parts:
            query = self._sampleable(sources, min_model_version)
            if self.config.feedback.rated_only and set(sources) & set(STALE_SOURCES):
                self._wait_for_ratings(query, n, min_model_version)
            # sampling.sample_key's order, in SQL.
            newest_first = set(sources) <= set(EXPERT_SOURCES)
            step = F("explorer_step").desc() if newest_first else F("explorer_step").asc()
            picks.append((query.order_by(USES_LEFT, step, "id"), n, newest_first))
        if connection.vendor == "postgresql":
            claimed = claim(picks, self.run_id)
        else:  # embedded SQLite: one writer at a time, no row locks to skip
            with transaction.atomic():
                rows = [list(query[:n]) for query, n, _ in picks]
                ExperienceRow.objects.filter(pk__in=[r.pk for part in rows for r in part]).update(
                    claimed_at=timezone.now(), claimed_by=self.run_id
                )
            claimed = [[to_experience(row) for row in part] for part in rows]
        for experiences in claimed:
            self._apply_feedback([e for e in experiences if e.source in STALE_SOURCES])
        return claimed

    def _wait_for_ratings(self, rated, n: int, min_model_version: int | None) -> None:
        """Up to feedback.rating_wait_s, while fewer than n rated rollouts are ready and unrated
        ones are there that annotators may still rate (an item with fewer than its
        judgements_per_item ratings is unrated). A Stop ends the wait within a check
        (stopping.check: StopRequested, before anything is claimed, so the step is not counted);
        it ran to the end of the wait before, up to an hour, and then counted a step that trained
        on nothing. A Pause holds the wait where it is, and the paused time does not count."""
        deadline = time.monotonic() + self.config.feedback.rating_wait_s
        unrated = self._rows().filter(
            status=ExperienceRow.Status.READY, source__in=STALE_SOURCES, claimed_at__isnull=True
        ).exclude(reward_components__has_key=HUMAN_REWARD)
        if min_model_version is not None:
            unrated = unrated.exclude(model_version__lt=min_model_version)
        while time.monotonic() < deadline and rated.count() < n and unrated.exists():
            time.sleep(RATING_POLL_S)
            asked = time.monotonic()
            stopping.check()
            deadline += time.monotonic() - asked  # a paused run's check returns once it is resumed

    def _apply_feedback(self, rollouts: list[Experience]) -> None:
        """Human rewards and recomputed group advantages for the groups that have a rating: a
        group any of whose members is rated, sampled or not, so a group split over two batches
        trains under one rule."""
        feedback = self.config.feedback
        if not rollouts or (feedback.reward_mode == "none" and not feedback.rated_only):
            return
        in_groups = self._rows().filter(group_id__in={e.group_id for e in rollouts}, source__in=STALE_SOURCES)
        rated = trained_ratings(in_groups)
        members = in_groups.exclude(status=ExperienceRow.Status.REJECTED).filter(group_id__in=rated.values("group_id"))
        if feedback.rated_only:
            members = rated
        groups = defaultdict(list)
        # Source and episode too: step experiences of a multi-turn episode are rated and compared
        # by episode (sampling._episode); without them each step counted as a rollout of its own.
        for pk, group_id, reward, components, source, episode in members.values_list(
            "pk", "group_id", "reward", "reward_components", "source", "metadata__rollout"
        ):
            groups[group_id].append(Experience(
                None, group_id, 0, [], [], [], source=source, reward=reward, reward_components=components, id=pk,
                metadata={} if episode is None else {"rollout": episode},
            ))
        apply_human_feedback(rollouts, groups, self.config)

    def mark_used(self, *, consumed: Sequence[Experience] = (), reused: Sequence[Experience] = ()) -> None:
        """One UPDATE for the step's rows. A flag that came while the step held a row keeps it
        rejected: never sampled again."""
        consumed_ids, reused_ids = [e.id for e in consumed], [e.id for e in reused]
        # consumed_at on a reused row (expert data, which stays ready) is its last use: what a
        # resume's rewind gives back.
        changes = {"use_count": F("use_count") + 1, "claimed_at": None, "claimed_by": None,
                   "consumed_at": timezone.now()}
        if consumed_ids:
            consuming = ~Q(status=ExperienceRow.Status.REJECTED)
            if reused_ids:  # a MIX step: only its rollouts are consumed
                consuming &= Q(pk__in=consumed_ids)
            changes["status"] = Case(When(consuming, then=Value(ExperienceRow.Status.CONSUMED)), default=F("status"))
        ExperienceRow.objects.filter(pk__in=consumed_ids + reused_ids).update(**changes)

    def rewind(self, checkpoint_time) -> int:
        """Resuming from a checkpoint taken at `checkpoint_time` (None: from the start): rows the
        lost trainer steps consumed or claimed go back to the pool, so the replayed steps train on
        them again: the rows this run held, whichever run's they are (a source run's human edits),
        and none another run holds; the run's expert rows and imported pairs they used, one use
        fewer each (under algorithm.dpo.max_pair_uses 1, mode both's, a lost step's imported pairs
        were never trained on again); and the preference pairs they used, once more usable by this
        run (PairUse). Returns how many rows came back."""
        with transaction.atomic():
            released = ExperienceRow.objects.filter(claimed_by=self.run_id).update(claimed_at=None, claimed_by=None)
            since = {} if checkpoint_time is None else {"consumed_at__gt": checkpoint_time}
            lost = self._rows().filter(status=ExperienceRow.Status.CONSUMED, **since)
            returned = lost.update(status=ExperienceRow.Status.READY, consumed_at=None, use_count=F("use_count") - 1)
            # Reused rows stay ready: one use fewer (a row used more than once since the checkpoint
            # keeps the other uses, as a pair below does).
            self._rows().filter(status=ExperienceRow.Status.READY, consumed_at__isnull=False, **since).update(
                consumed_at=None, use_count=F("use_count") - 1)
            # The lost steps' preference pairs: one use fewer each (exact under max_pair_uses 1, mode
            # both's; a pair used more than once since the checkpoint keeps the other uses, which
            # only moves it back in the least-used-first order).
            pairs = PairUse.objects.filter(run_id=self.run_id)
            if checkpoint_time is None:
                pairs.update(uses=0)
            else:
                pairs.filter(last_used_at__gt=checkpoint_time).update(uses=F("uses") - 1)
        return released + returned

    def sample_pairs(self, n: int, *, max_uses: int | None = None) -> list[PreferencePair]:
        """Human preferences on this run's experiences and those of the feedback source runs, and
        the run's copies of an imported dataset's pairs (expert_data.py); least used by this run
        first (a use is counted per run and preference, PairUse, or on the copy of the chosen side),
        of those used fewer than `max_uses` times (None: any)."""
        judged = self._judged_pairs(n, max_uses)
        # Only a run that names a dataset has copies of one: the others' DPO steps ask nothing more.
        imported = self._imported_pairs(n, max_uses) if self.config.buffer.expert_dataset else []
        picked = sorted(judged + imported, key=lambda pick: pick[:3])[:n]
        self._count_pair_uses([pk for _, kind, pk, _ in picked if kind == 0])
        copies = [pk for _, kind, pk, _ in picked if kind == 1]
        ExperienceRow.objects.filter(pk__in=copies).update(use_count=F("use_count") + 1, consumed_at=timezone.now())
        return [pair for *_, pair in picked]

    def _count_pair_uses(self, preferences: list[int]) -> None:
        """One use more of each preference by this run (PairUse; a run's trainer samples one step
        at a time, so no other writer makes its rows)."""
        now = timezone.now()
        with transaction.atomic():
            counted = PairUse.objects.filter(run_id=self.run_id, preference_id__in=preferences)
            seen = set(counted.values_list("preference_id", flat=True))
            counted.update(uses=F("uses") + 1, last_used_at=now)
            PairUse.objects.bulk_create([PairUse(run_id=self.run_id, preference_id=pk, uses=1, last_used_at=now)
                                         for pk in preferences if pk not in seen])

    def _judged_pairs(self, n: int, max_uses: int | None) -> list[tuple]:
        """(uses, 0, id, pair): up to n of the annotators' preferences, least used by this run first."""
        feedback = self.config.feedback
        uses = PairUse.objects.filter(run_id=self.run_id, preference=OuterRef("pk")).values("uses")
        prefs = judged_pairs([self.run_id, *feedback.source_runs], exclude_flagged=feedback.exclude_flagged).annotate(
            run_uses=Coalesce(Subquery(uses), Value(0)))
        if max_uses is not None:
            prefs = prefs.filter(run_uses__lt=max_uses)
        prefs = prefs.select_related("experience", "other").order_by("run_uses", "id")[:n]
        return [(p.run_uses, 0, p.pk, _pair(p.experience, p.other, p.pk)) for p in prefs]

    def _imported_pairs(self, n: int, max_uses: int | None) -> list[tuple]:
        """(uses, 1, id, pair): up to n pairs of the imported dataset's copy, least used first.
        A curator's flag on either side (status rejected) leaves a pair out, as a judged one.
        No index of its own: 16 of 100,000 copied pairs took 0.10 s on Postgres, 0.2 s on SQLite
        (this 2-core machine), beside a DPO step's seconds."""
        pairs = self._rows().filter(group_id__startswith=IMPORTED_PAIR_GROUP)
        if self.config.feedback.exclude_flagged:
            flagged = pairs.filter(status=ExperienceRow.Status.REJECTED).values("group_id")
            pairs = pairs.exclude(group_id__in=flagged)
        chosen = pairs.filter(rollout_index=0)
        if max_uses is not None:
            chosen = chosen.filter(use_count__lt=max_uses)
        chosen = list(chosen.order_by("use_count", "id")[:n])
        partners = pairs.filter(rollout_index=1, group_id__in=[c.group_id for c in chosen])
        rejected = {row.group_id: row for row in partners}
        return [(c.use_count, 1, c.pk, _pair(c, rejected[c.group_id], c.pk)) for c in chosen if c.group_id in rejected]
