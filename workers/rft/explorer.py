"""The explorer: pick tasks, roll them out with the workflow, run the experience pipeline, write
the buffer. One `explore_step` is one batch of tasks; steps are numbered from 0 and every
experience carries the step that made it and the model version that generated it.

Explorers that are workers of their own (explorer.engine_num of them; more may join while the
run trains) share each step through `claims` (protocols.StepClaims): the first to open a step
picks its batch; each claims an even share of its groups (a task's rollouts: the unit the group
advantage needs whole), rolls them out and stores them; the one that finds every group done
finishes the step (tasks marked sampled, the step's metrics merged from each explorer's part) and
all move on to the next. The trainer sees what one explorer would have stored: the same natural
keys, the same groups.

A task that fails (workflows.TaskFailed: its metadata, environment, tool or reward fn) is logged
and left out of its step, counted in the step's `failed_tasks`; a step whose every task failed
fails the run, naming the first: a broken reward fn must not train on nothing.

Which tasks a step draws is the run's task selector's (task_selectors.py, buffer.task_selector), over
what the task pipeline leaves; it reads only what the run stored as of the step's start, so a
replayed step picks the same. A selector that learns is told each group's pass rate when the step
finishes, and what it learned is stored with the step's draws (TaskSource.mark_sampled).

Rollout metrics are per rollout, an episode however many experiences it was stored as.
"""
import logging
import math
import time

from . import algorithms
from .engines import SamplingParams
from .experience import Task
from .pipelines import (
    EXPERIENCE_OPERATORS,
    TASK_OPERATORS,
    PipelineContext,
    build_operators,
    episodes,
    group_advantage,
    run_experience_operators,
    run_task_operators,
)
from .stopping import stoppable
from .task_selectors import build_selector, pass_rate

log = logging.getLogger(__name__)
EVAL_CHUNK = 64  # eval prompts per engine call


NO_TASKS = "the run's taskset (buffer.taskset) has no tasks: it was emptied or deleted"
# An eval over none logged a held-out score of 0.0 at every eval, nothing saying why.
NO_EVAL_TASKS = "the run's held-out taskset (buffer.eval_taskset) has no tasks: it was emptied or deleted"


class Explorer:
    def __init__(self, config, workflow, task_source, buffer, metrics=None, eval_source=None, step: int = 0,
                 claims=None):
        self.config = config
        self.claims = claims  # protocols.StepClaims when explorers are workers of their own
        self.workflow = workflow
        self.task_source = task_source
        self.buffer = buffer
        self.metrics = metrics
        self.eval_source = eval_source
        self.step = step
        self.seed = config.seed
        # The run's should_stop, asked inside a step by its long loops (stopping.py); the loop sets it.
        self.stopping = None
        # Where this explorer's time goes, for idle_share and sync_seconds: the loop adds the time
        # it spends loading weights for a step (Loop.explore), evaluate() its own; the end of the
        # last step or part.
        self.sync_seconds = 0.0
        self._eval_seconds = 0.0
        self._last_end: float | None = None
        self.ctx = PipelineContext(workflow=workflow, task_source=task_source, buffer=buffer, seed=config.seed)
        self.task_ops = build_operators(TASK_OPERATORS, config.buffer.task_pipeline)
        self.selector = build_selector(config)
        self.experience_ops = build_operators(EXPERIENCE_OPERATORS, config.explorer.pipeline)
        if (advantage := algorithms.group_advantage(config)) is not None:
            fn, params = advantage
            params = {**params, "fn": fn, "drop_zero_std": config.algorithm.drop_zero_std_groups}
            # A multi-turn workflow storing one experience per step compares whole episodes.
            params["by_episode"] = getattr(workflow, "stepwise", False)
            self.experience_ops.append(("advantage", group_advantage, params))

    @property
    def engine(self):
        return self.workflow.engine

    def select_tasks(self) -> list[Task]:
        """The batch, as the run's task selector picks it for this step. Depends only on the stored
        tasks, draws and stats, so a replayed step picks the same. Without a task pipeline only the
        tasks' ordering keys are read (their stats too for a selector that learns), then the batch's
        rows: a step read every row of the taskset, prompts and metadata. At 90,000 tasks, 2.2 s a
        pick became 0.43 (Postgres) and 0.46 (SQLite) on this 2-core machine, the same 16 tasks;
        difficulty_based's pick of 90,000 keys adds 0.13 s to the default's 0.04."""
        if not self.task_ops:
            keys = self.task_source.task_keys(with_stats=self.selector.learns)
            if not keys:
                raise ValueError(NO_TASKS)
            picked = self.selector.select(keys, self.step)
            return self.task_source.tasks_with_ids([key.id for key in picked])
        stored = self.task_source.tasks()
        if not stored:
            raise ValueError(NO_TASKS)
        tasks = run_task_operators(self.task_ops, stored, self.ctx)
        if not tasks:
            names = ", ".join(op for op, _, _ in self.task_ops)
            raise ValueError(f"buffer.task_pipeline ({names}) left none of the taskset's {len(stored):,} tasks: "
                             "loosen its filters")
        return self.selector.select(tasks, self.step)

    def explore_step(self) -> dict | None:
        """One step: its metrics, and self.step moves on. Shared with other explorers, one call
        does one part of it: rolls out a share of its groups ({"groups": n}), or finishes the
        step (its metrics; {} when another explorer finished it), or finds only other
        explorers' groups left running (None: call again in a moment). StopRequested when the
        run stops meanwhile: nothing of the step (or part) is stored, and self.step stays."""
        with stoppable(self.stopping):
            return self._explore_step()

    def _explore_step(self) -> dict | None:
        if self.claims is not None:
            return self._explore_shared_step()
        if self.buffer.has_explorer_step(self.step):
            # A restarted run replays the steps after its checkpoint; this one's rollouts are stored.
            self.step += 1
            if self.metrics is not None:
                # the weights it holds now: the trainer publishes them again as it replays
                self.metrics.replayed("explorer", self.step, self.engine.model_version)
            return {"replayed": 1}
        started = time.perf_counter()
        tasks = self.select_tasks()
        part = self._roll_out(tasks, shared=False)
        metrics = part["means"] | part["counts"] | {
            "rollouts": part["rollouts"], "tokens_per_s": part["tokens"] / part["generate_seconds"],
        }
        metrics |= self._record_draws(self.step, [task.id for task in tasks], part["groups"], picked=tasks)
        self.step += 1
        metrics |= {"model_version": self.engine.model_version, "seconds": time.perf_counter() - started}
        metrics |= self._timing(started)
        if self.metrics is not None:
            self.metrics.log("explorer", self.step, metrics)
        return metrics

    def _explore_shared_step(self) -> dict | None:
        step = self.step
        task_ids = self.claims.open(step, lambda: [task.id for task in self.select_tasks()])
        mine = set(self.claims.claim(step))
        if mine:
            started = time.perf_counter()
            part = self._roll_out(self.task_source.tasks_with_ids([i for i in task_ids if i in mine]), shared=True)
            self.claims.done(step, sorted(mine), part | self._timing(started))
            return {"groups": len(mine)}
        merged = {}

        def finish(parts: list[dict]) -> None:  # the one explorer that finishes the step
            if sum(part["counts"].get("failed_tasks", 0) for part in parts) == len(task_ids):
                first = next(part["task_failed"] for part in parts if "task_failed" in part)
                raise RuntimeError(f"explorer step {step}: every task failed; the first: {first}")
            # A part stored before parts carried groups (a run upgraded mid-step) has none to learn from.
            groups = [group for part in parts for group in part.get("groups", ())]
            merged.update(merge_parts(parts) | self._record_draws(step, task_ids, groups),
                          model_version=self.engine.model_version)
            if self.metrics is not None:
                self.metrics.log("explorer", step + 1, merged)

        if not self.claims.finish(step, finish):
            return None
        self.step += 1
        return merged

    def _record_draws(self, step: int, task_ids: list[int], groups: list, picked: list[Task] | None = None) -> dict:
        """The step's tasks drawn once more, with what a learning selector learned from its
        `groups` ([task id, pass rate, rollouts], from the parts) in the same call; returns the
        selector's metrics, the step's and the run's so far (read back from the task source: a
        resumed run and explorers sharing steps count what the run stored). `picked`: the step's
        tasks as selected (as of the step's start); a shared step reads them back, unchanged
        since: only this, its finish, writes draws."""
        if not self.selector.learns:
            self.task_source.mark_sampled(task_ids)
            return {}
        picked = self.task_source.tasks_with_ids(task_ids) if picked is None else picked
        stats, metrics = self.selector.learn(picked, {task_id: (rate, n) for task_id, rate, n in groups}, step)
        self.task_source.mark_sampled(task_ids, stats)
        return metrics | self.selector.totals(self.task_source)

    def _timing(self, started: float) -> dict:
        """Since this explorer's last step (or part of one) ended: the share of the time it waited
        (for a version, or for other explorers' groups) rather than loading weights or rolling
        out, and the seconds it loaded weights (sync_seconds). No idle_share on its first."""
        now = time.perf_counter()
        busy = now - started + self.sync_seconds + self._eval_seconds
        timing = {"sync_seconds": self.sync_seconds}
        if self._last_end is not None:
            timing["idle_share"] = max(0.0, 1.0 - busy / max(now - self._last_end, 1e-9))
        self._last_end, self.sync_seconds, self._eval_seconds = now, 0.0, 0.0
        return timing

    def _roll_out(self, tasks: list[Task], shared: bool) -> dict:
        """Roll the tasks out at this step, run the experience pipeline, store what it keeps.
        Returns the part of the step's metrics these tasks make (merge_parts), with the first
        failed task's error in `task_failed`. Where every task failed, a step of its own
        (not `shared`) fails the run; a shared one leaves that to whoever finishes the step."""
        started = time.perf_counter()
        explorer = self.config.explorer
        params = SamplingParams(
            n=self.config.algorithm.repeat_times,
            temperature=explorer.temperature,
            top_p=explorer.top_p,
            max_new_tokens=explorer.max_new_tokens,
            seed=self.seed * 1_000_003 + self.step,
        )
        failed = {}
        experiences = self.workflow.run_batch(tasks, params, explorer_step=self.step, failed=failed)
        report_failures(failed, len(tasks), f"explorer step {self.step}", raise_all=not shared)
        generated = time.perf_counter() - started
        means = rollout_metrics(experiences)
        rollouts = means.pop("rollouts")
        rewards = group_rewards(experiences)
        self.ctx.task_rewards |= {task_id: sum(values) / len(values) for task_id, values in rewards.items()}
        tokens = sum(sum(e.action_mask) for e in experiences)  # the model's: not a trajectory's environment text
        experiences, counts = run_experience_operators(self.experience_ops, experiences, self.ctx)
        counts["written"] = self.buffer.write(experiences)
        counts["failed_tasks"] = len(failed)
        # What a learning selector reads, before any operator dropped rollouts: JSON, as a shared
        # step's parts are stored.
        groups = [[task_id, pass_rate(values), len(values)] for task_id, values in rewards.items()]
        part = {"rollouts": rollouts, "means": means, "counts": counts, "tokens": tokens,
                "generate_seconds": generated, "groups": groups}
        if failed:
            part["task_failed"] = str(next(iter(failed.values())))
        return part

    def evaluate(self, tasks: list[Task] | None = None) -> dict:
        """Greedy answers to every eval task; logged under role 'eval' at the current step
        (StopRequested, logging nothing, when the run stops meanwhile)."""
        with stoppable(self.stopping):
            return self._evaluate(tasks)

    def _evaluate(self, tasks: list[Task] | None) -> dict:
        started = time.perf_counter()
        tasks = self.eval_source.tasks() if tasks is None else tasks
        if not tasks:
            raise ValueError(NO_EVAL_TASKS)
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.config.explorer.max_new_tokens)
        experiences, failed = [], {}
        for i in range(0, len(tasks), EVAL_CHUNK):
            experiences += self.workflow.run_batch(tasks[i : i + EVAL_CHUNK], params, explorer_step=self.step,
                                                   failed=failed)
        report_failures(failed, len(tasks), f"eval at step {self.step}", raise_all=True)
        metrics = rollout_metrics(experiences) | {
            "model_version": self.engine.model_version, "tasks": len(tasks), "failed_tasks": len(failed),
        }
        if self.metrics is not None:
            self.metrics.log("eval", self.step, metrics)
        self._eval_seconds += time.perf_counter() - started
        return metrics


def merge_parts(parts: list[dict]) -> dict:
    """A shared step's explorer metrics from its explorers' parts (Explorer._roll_out with
    Explorer._timing): the same keys one explorer logs, plus each explorer's own tokens/s
    (tokens_per_s/<explorer>, where several took part), idle share and sync seconds
    (idle_share/<explorer>, sync_seconds/<explorer>). Means weighted by rollouts, the reward std
    over all rollouts (the law of total variance), counts summed, tokens/s over the slowest
    explorer's time, sync_seconds the slowest explorer's, idle_share the mean of the explorers'."""
    total = sum(part["rollouts"] for part in parts) or 1
    means = {key for part in parts for key in part["means"]}
    merged = {key: sum(part["rollouts"] * part["means"].get(key, 0.0) for part in parts) / total for key in means}
    square = sum(part["rollouts"] * (part["means"]["reward_std"] ** 2 + part["means"]["reward_mean"] ** 2)
                 for part in parts) / total
    merged["reward_std"] = math.sqrt(max(0.0, square - merged["reward_mean"] ** 2))
    for part in parts:
        for key, value in part["counts"].items():
            merged[key] = merged.get(key, 0) + value
    merged = algorithms.zero_variance_share(merged, prefix="advantage/")  # a share of the sums, not a sum
    seconds, tokens, synced, idle = {}, {}, {}, {}
    for part in parts:
        name = part.get("explorer", part.get("worker"))
        seconds[name] = seconds.get(name, 0.0) + part["generate_seconds"]
        tokens[name] = tokens.get(name, 0) + part["tokens"]
        synced[name] = synced.get(name, 0.0) + part.get("sync_seconds", 0.0)
        if "idle_share" in part:
            idle.setdefault(name, []).append(part["idle_share"])
    merged |= {
        "rollouts": sum(part["rollouts"] for part in parts),
        "tokens_per_s": sum(tokens.values()) / max(max(seconds.values()), 1e-9),
        "explorers": len(seconds),
    }
    if len(seconds) > 1:
        merged |= {f"tokens_per_s/{name}": tokens[name] / max(seconds[name], 1e-9) for name in seconds}
    merged |= {f"sync_seconds/{name}": value for name, value in synced.items()}
    merged |= {f"idle_share/{name}": sum(shares) / len(shares) for name, shares in idle.items()}
    merged["sync_seconds"] = max(synced.values(), default=0.0)
    if idle:
        merged["idle_share"] = sum(merged[f"idle_share/{name}"] for name in idle) / len(idle)
    return merged


def report_failures(failed: dict, tasks: int, where: str, raise_all: bool) -> None:
    """Each failed task (workflows.TaskFailed by task id) in the run's log, once; with
    `raise_all`, the run fails where all `tasks` failed."""
    for error in failed.values():
        log.warning("%s: %s (its rollouts are left out)", where, error)
    if raise_all and failed and len(failed) == tasks:
        first = next(iter(failed.values()))
        raise RuntimeError(f"{where}: every task failed; the first: {first}") from first


def rollout_metrics(experiences) -> dict:
    """Means over rollouts: an episode stored step by step (experience: step) counts once, with
    its reward, its last reply's finish and its model's tokens over all its steps (response_length
    counts the model's tokens, action_mask: a trajectory's environment text is not its length).
    Reward components are averaged over every rollout, 0 where one has none (a tool episode that
    never answered has no exact_match)."""
    rollouts = episodes(experiences)
    n = max(len(rollouts), 1)
    last = [steps[-1] for steps in rollouts]  # its reward, components and finish are the episode's
    rewards = [e.reward for e in last]
    mean = sum(rewards) / n
    metrics = {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "response_length": sum(sum(e.action_mask) for e in experiences) / n,
        "truncated_frac": sum(e.metadata.get("finish_reason") == "length" for e in last) / n,
        "prompt_truncated": sum(bool(e.metadata.get("prompt_truncated")) for e in last) / n,
        "rollouts": len(rollouts),
    }
    for name in dict.fromkeys(name for e in last for name in e.reward_components):
        metrics[name] = sum(e.reward_components.get(name, 0.0) for e in last) / n
    # Multi-turn: per episode (each carries metadata.episode once, on its last step)
    facts = [e.metadata["episode"] for e in last if "episode" in e.metadata]
    for name in ("return", "success", "turns", "invalid_actions"):
        if facts:
            metrics[f"episode/{name}"] = sum(episode[name] for episode in facts) / len(facts)
    return metrics


def group_rewards(experiences) -> dict[int, list[float]]:
    """Each task's rewards, one per rollout (an episode, not its steps): its group's. Their mean is
    what synthesize_harder reads (PipelineContext.task_rewards), their pass rate what a learning
    task selector does. Rollouts of no task have no group here."""
    rewards = {}
    for steps in episodes(experiences):
        if steps[-1].task_id is not None:
            rewards.setdefault(steps[-1].task_id, []).append(steps[-1].reward or 0.0)
    return rewards
