"""Prompt -> response -> reward, for every task of a step in one engine call."""
from ..engines import SamplingParams
from ..experience import Experience, Task
from ..stopping import StopRequested
from .base import WORKFLOWS, Workflow


@WORKFLOWS.register("single_turn")
class SingleTurnWorkflow(Workflow):
    def run_batch(self, tasks: list[Task], params: SamplingParams, explorer_step: int,
                  failed: dict | None = None) -> list[Experience]:
        failures, ready = {}, []  # ready: (task, messages, prompt) of the tasks whose prompt encodes
        for task in tasks:
            with self.isolated(task, failures):
                messages = self.messages(task)
                ready.append((task, messages, self.encode_task_prompt(task, messages)))
        generations = self.engine.generate([prompt.ids for *_, prompt in ready], params) if ready else []
        scores = iter(self.score_isolated(
            [c.text for completions in generations for c in completions],
            [task for (task, *_), completions in zip(ready, generations) for _ in completions],
            failures,
        ))
        experiences = []
        for (task, messages, prompt), completions in zip(ready, generations):
            for index, completion in enumerate(completions):
                reward, components = next(scores)
                if task.id in failures:
                    continue
                experiences.append(
                    Experience(
                        task_id=task.id,
                        group_id=f"{explorer_step}-{task.id}",
                        rollout_index=index,
                        prompt_ids=prompt.ids,
                        response_ids=completion.token_ids,
                        action_mask=[1] * len(completion.token_ids),
                        prompt_text=prompt.text,
                        response_text=completion.text,
                        messages=messages + [{"role": "assistant", "content": completion.text}],
                        logprobs=completion.logprobs,
                        reward=reward,
                        reward_components=components,
                        model_version=self.engine.model_version,
                        explorer_step=explorer_step,
                        metadata={"finish_reason": completion.finish_reason, "prompt_truncated": prompt.truncated},
                    )
                )
        return self.settle(experiences, failures, failed)

    def score_isolated(self, responses: list[str], tasks: list[Task], failures: dict) -> list:
        """score_batch; where it raises, each response alone, to tell whose it was: a failing
        response's task goes to `failures` and its score is (None, None)."""
        try:
            return self.score_batch(responses, tasks)
        except StopRequested:
            raise
        except Exception:  # noqa: BLE001 - the batch's fault or one task's: scored one by one
            scores = []
            for response, task in zip(responses, tasks):
                scores.append((None, None))
                with self.isolated(task, failures):
                    scores[-1] = self.score(response, task)
            return scores

    def run(self, task: Task, params: SamplingParams, explorer_step: int) -> list[Experience]:
        return self.run_batch([task], params, explorer_step)
