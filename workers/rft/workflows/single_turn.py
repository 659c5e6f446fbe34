"""Prompt -> response -> reward, for every task of a step in one engine call."""
from ..engines import SamplingParams
from ..experience import Experience, Task
from .base import WORKFLOWS, Workflow


@WORKFLOWS.register("single_turn")
class SingleTurnWorkflow(Workflow):
    def run_batch(self, tasks: list[Task], params: SamplingParams, explorer_step: int) -> list[Experience]:
        conversations = [self.messages(task) for task in tasks]
        prompts = [self.encode_prompt(messages) for messages in conversations]
        generations = self.engine.generate([ids for _, ids in prompts], params)
        scores = iter(self.score_batch(
            [c.text for completions in generations for c in completions],
            [task for task, completions in zip(tasks, generations) for _ in completions],
        ))
        experiences = []
        for task, messages, (prompt_text, prompt_ids), completions in zip(tasks, conversations, prompts, generations):
            for index, completion in enumerate(completions):
                reward, components = next(scores)
                experiences.append(
                    Experience(
                        task_id=task.id,
                        group_id=f"{explorer_step}-{task.id}",
                        rollout_index=index,
                        prompt_ids=prompt_ids,
                        response_ids=completion.token_ids,
                        action_mask=[1] * len(completion.token_ids),
                        prompt_text=prompt_text,
                        response_text=completion.text,
                        messages=messages + [{"role": "assistant", "content": completion.text}],
                        logprobs=completion.logprobs,
                        reward=reward,
                        reward_components=components,
                        model_version=self.engine.model_version,
                        explorer_step=explorer_step,
                        metadata={"finish_reason": completion.finish_reason},
                    )
                )
        return experiences

    def run(self, task: Task, params: SamplingParams, explorer_step: int) -> list[Experience]:
        return self.run_batch([task], params, explorer_step)
