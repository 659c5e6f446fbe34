"""The explorer: pick tasks, roll them out with the workflow, run the experience pipeline, write
the buffer. One `explore_step` is one batch of tasks; steps are numbered from 0 and every
experience carries the step that made it and the model version that generated it.
"""
import time
import zlib

from .algorithms import GROUP_ADVANTAGE_FNS, resolve
from .engines import SamplingParams
from .experience import Task
from .pipelines import (
    EXPERIENCE_OPERATORS, TASK_OPERATORS, PipelineContext, build_operators, group_advantage,
    run_experience_operators, run_task_operators,
)

EVAL_CHUNK = 64  # eval prompts per engine call


class Explorer:
    def __init__(self, config, workflow, task_source, buffer, metrics=None, eval_source=None, step: int = 0):
        self.config = config
        self.workflow = workflow
        self.task_source = task_source
        self.buffer = buffer
        self.metrics = metrics
        self.eval_source = eval_source
        self.step = step
        self.seed = config.seed
        self.ctx = PipelineContext(workflow=workflow, task_source=task_source, buffer=buffer, seed=config.seed)
        self.task_ops = build_operators(TASK_OPERATORS, config.buffer.task_pipeline)
        self.experience_ops = build_operators(EXPERIENCE_OPERATORS, config.explorer.pipeline)
        spec, algo = resolve(config), config.algorithm
        if spec.advantage_fn in GROUP_ADVANTAGE_FNS:
            params = {} if spec.advantage_fn == "rloo" else {"epsilon": algo.epsilon}
            params |= {"fn": spec.advantage_fn, "drop_zero_std": algo.drop_zero_std_groups}
            # A multi-turn workflow storing one experience per step compares whole episodes.
            params["by_episode"] = getattr(workflow, "stepwise", False)
            self.experience_ops.append(("advantage", group_advantage, params))

    @property
    def engine(self):
        return self.workflow.engine

    def select_tasks(self) -> list[Task]:
        """The batch: highest priority first, then least sampled, ties in a seeded shuffle that
        changes every epoch. Depends only on the stored tasks, so a replayed step picks the same."""
        tasks = run_task_operators(self.task_ops, self.task_source.tasks(), self.ctx)

        def order(task: Task):
            shuffle = zlib.crc32(f"{self.seed}:{task.times_sampled}:{task.id}".encode())
            return (-task.priority, task.times_sampled, shuffle)

        return sorted(tasks, key=order)[: self.config.explorer.batch_size]

    def explore_step(self) -> dict:
        if self.buffer.has_explorer_step(self.step):
            # A restarted run replays the steps after its checkpoint; this one's rollouts are stored.
            self.step += 1
            return {"replayed": 1}
        started = time.perf_counter()
        explorer = self.config.explorer
        tasks = self.select_tasks()
        params = SamplingParams(
            n=self.config.algorithm.repeat_times,
            temperature=explorer.temperature,
            top_p=explorer.top_p,
            max_new_tokens=explorer.max_new_tokens,
            seed=self.seed * 1_000_003 + self.step,
        )
        experiences = self.workflow.run_batch(tasks, params, explorer_step=self.step)
        generated = time.perf_counter() - started
        metrics = rollout_metrics(experiences)
        metrics["tokens_per_s"] = sum(len(e.response_ids) for e in experiences) / generated

        for task in tasks:
            rewards = [e.reward for e in experiences if e.task_id == task.id]
            self.ctx.task_rewards[task.id] = sum(rewards) / len(rewards)
        experiences, pipeline_metrics = run_experience_operators(self.experience_ops, experiences, self.ctx)
        metrics |= pipeline_metrics
        metrics["written"] = self.buffer.write(experiences)
        self.task_source.mark_sampled([task.id for task in tasks])
        self.step += 1
        metrics |= {"model_version": self.engine.model_version, "seconds": time.perf_counter() - started}
        if self.metrics is not None:
            self.metrics.log("explorer", self.step, metrics)
        return metrics

    def evaluate(self, tasks: list[Task] | None = None) -> dict:
        """Greedy answers to every eval task; logged under role 'eval' at the current step."""
        tasks = self.eval_source.tasks() if tasks is None else tasks
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.config.explorer.max_new_tokens)
        experiences = []
        for i in range(0, len(tasks), EVAL_CHUNK):
            experiences += self.workflow.run_batch(tasks[i : i + EVAL_CHUNK], params, explorer_step=self.step)
        metrics = rollout_metrics(experiences) | {"model_version": self.engine.model_version, "tasks": len(tasks)}
        if self.metrics is not None:
            self.metrics.log("eval", self.step, metrics)
        return metrics


def rollout_metrics(experiences) -> dict:
    n = max(len(experiences), 1)
    rewards = [e.reward for e in experiences]
    mean = sum(rewards) / n
    metrics = {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "response_length": sum(len(e.response_ids) for e in experiences) / n,
        "truncated_frac": sum(e.metadata.get("finish_reason") == "length" for e in experiences) / n,
        "rollouts": len(experiences),
    }
    for name in experiences[0].reward_components if experiences else ():
        metrics[name] = sum(e.reward_components.get(name, 0.0) for e in experiences) / n
    # Multi-turn: per episode (each carries metadata.episode once, on its last step)
    episodes = [e.metadata["episode"] for e in experiences if "episode" in e.metadata]
    for name in ("return", "success", "turns", "invalid_actions"):
        if episodes:
            metrics[f"episode/{name}"] = sum(episode[name] for episode in episodes) / len(episodes)
    return metrics
