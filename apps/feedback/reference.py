"""Does an edit agree with the task's reference answer? Checked with the run's own answer check
(its `exact_match` or `numeric` reward fn, with the run's params), the same check the workflow
scores rollouts with, so an edit the run would score 0 is caught before it becomes expert data.
A run rewarded otherwise (a judge model, countdown) is checked with `exact_match`: the final
number, else the normalised final answer. Cheap: no model is loaded."""
from collections.abc import Mapping

from workers.rft.rewards.answer import exact_match, numeric, tagged_answer

ANSWER_CHECKS = {"exact_match": exact_match, "numeric": numeric}


def _checks(run) -> list:
    """(fn, params) for each answer check among the run's reward fns; exact_match if none."""
    # The config as launched (validated then): its reward spec, a name or {name: weight or params}.
    spec = (((run.config or {}).get("explorer") or {}) if run is not None else {}).get("reward_fn", "exact_match")
    spec = {spec: 1.0} if isinstance(spec, str) else spec if isinstance(spec, Mapping) else {}
    checks = []
    for name, value in spec.items():
        if name in ANSWER_CHECKS:
            params = {k: v for k, v in value.items() if k != "weight"} if isinstance(value, Mapping) else {}
            checks.append((ANSWER_CHECKS[name], params))
    return checks or [(exact_match, {})]


def reference_answer(experience) -> str:
    """The task's reference answer as the checks read it (a GSM8K answer's part after '####')."""
    answer = experience.task.answer if experience.task_id else ""
    tagged = tagged_answer(answer)
    return (answer if tagged is None else tagged).strip()


def contradiction(experience, text: str) -> str | None:
    """What to ask the annotator when the edit's answer disagrees with the reference; None when it
    agrees, or when the task has no reference answer."""
    reference = reference_answer(experience)
    if not reference:
        return None
    task = {"answer": experience.task.answer, "metadata": experience.task.metadata}
    if any(fn(text, task, **params) > 0 for fn, params in _checks(experience.run)):
        return None
    shown = reference if len(reference) <= 80 else reference[:77] + "..."
    return f"The reference answer is {shown}; your edit's answer differs. Save anyway?"
