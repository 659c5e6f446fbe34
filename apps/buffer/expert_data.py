"""A run's copy of an imported expert dataset (buffer.expert_dataset): the engine's ExpertData
protocol (workers/rft/protocols.py).

Imported rows hold text, and token ids of no model or of another one, so a run trains on a copy
made when its trainer starts: each prompt and response formatted and tokenized as the run's
workflow asks its own prompts (Workflow.written_experience: system prompt, chat template,
max_prompt_tokens). The copies are the run's rows: the trainer claims, counts and consumes them as
its own, and what a curator changes in the dataset later does not reach a run that has copied it.

An SFT dataset's ready rows become expert experiences (group `imported-<row id>`), which SFT
imitates and MIX mixes in. A DPO dataset's pairs whose chosen side is ready become two rows each
(group `imported-pair-<chosen id>`, chosen at rollout index 0), which the run's sample_pairs
serves beside its annotators' preferences (store.py). A row whose action mask has environment
tokens (an exported multi-turn episode) is left out: its turns cannot be re-tokenized apart.

The copy goes by id, a batch a transaction: a trainer that dies in the middle carries it on from
the last whole batch when the run resumes. Rows added to the dataset after a copy join the run at
its next start: their ids are higher, since one import at a time adds to a dataset
(expert_import.being_imported; two at once could show the later one's rows first).
"""
import logging
from collections import Counter
from collections.abc import Callable

import numpy as np
from django.db.models import Max

from apps.feedback.models import Feedback

from .models import IMPORTED_GROUP, IMPORTED_PAIR_GROUP, ExpertDataset, expert_copies
from .models import Experience as ExperienceRow
from .store import to_row

log = logging.getLogger(__name__)

# What a copy cut to the run's lengths says in its metadata (Workflow.written_experience), counted.
CUT = {"prompt_truncated": "prompts cut to model.max_prompt_tokens",
       "response_truncated": "responses cut to explorer.max_new_tokens"}
BATCH_ROWS = 500  # rows a transaction: a restart loses at most this many rows' tokenizing
ROW_FIELDS = ("pk", "prompt_text", "response_text", "messages", "action_mask", "reward", "reward_components",
              "priority", "metadata")


class DjangoExpertData:
    def __init__(self, run_id: int, name: str):
        self.run_id, self.name = run_id, name

    def seed(self, to_experience: Callable) -> int:
        copies = expert_copies(self.run_id)
        dataset = ExpertDataset.objects.filter(name=self.name).first()
        if dataset is None:
            if copies.exists():
                return 0  # copied before the dataset was deleted: the copy is the run's
            raise ValueError(f"buffer.expert_dataset: no expert dataset is named {self.name!r} (deleted since the "
                             "run was launched?): import it again under that name, or launch without it")
        after = copies.aggregate(last=Max("parent_id"))["last"] or 0
        copy = self._copy_pairs if dataset.layout == ExpertDataset.Layout.DPO else self._copy_responses
        written, left_out, cut = copy(dataset, after, to_experience)
        if written:
            said = [f"{cut[key]:,} {what}" for key, what in CUT.items() if cut[key]]
            log.info("expert dataset %s: %s experiences copied into the run and tokenized for its model%s",
                     self.name, f"{written:,}", f" ({', '.join(said)})" if said else "")
        if left_out:
            log.warning("expert dataset %s: %s multi-turn episodes left out: their environment turns cannot be "
                        "told apart once tokenized again for this model", self.name, f"{left_out:,}")
        return written

    def _copy_responses(self, dataset, after: int, to_experience) -> tuple[int, int, Counter]:
        rows = dataset.experiences.filter(status=ExperienceRow.Status.READY).order_by("pk").only(*ROW_FIELDS)
        written = left_out = 0
        cut = Counter()
        while batch := list(rows.filter(pk__gt=after)[:BATCH_ROWS]):
            after = batch[-1].pk
            copies = []  # bulk_create writes them in one transaction
            for row in batch:
                if _multi_turn(row):
                    left_out += 1
                    continue
                copy = self._copy(row, *_prompt_and_response(row), to_experience, f"{IMPORTED_GROUP}{row.pk}")
                cut.update(CUT.keys() & copy.metadata.keys())
                copies.append(copy)
            ExperienceRow.objects.bulk_create(copies)
            written += len(copies)
        return written, left_out, cut

    def _copy_pairs(self, dataset, after: int, to_experience) -> tuple[int, int, Counter]:
        prefs = (
            Feedback.objects.filter(
                kind=Feedback.Kind.PREFERENCE, value=1.0, experience__dataset=dataset,
                experience__status=ExperienceRow.Status.READY,
            )
            .select_related("experience", "other").order_by("experience_id")
        )
        written = left_out = 0
        cut = Counter()
        while batch := list(prefs.filter(experience_id__gt=after)[:BATCH_ROWS]):
            after = batch[-1].experience_id
            copies = []
            for pref in batch:
                chosen, rejected = pref.experience, pref.other
                if _multi_turn(chosen) or _multi_turn(rejected):
                    left_out += 1
                    continue
                prompt, response = _prompt_and_response(chosen)
                group = f"{IMPORTED_PAIR_GROUP}{chosen.pk}"
                copies += [
                    self._copy(chosen, prompt, response, to_experience, group, 0),
                    self._copy(rejected, prompt, _prompt_and_response(rejected)[1], to_experience, group, 1),
                ]
                cut.update(CUT.keys() & (copies[-2].metadata.keys() | copies[-1].metadata.keys()))
            ExperienceRow.objects.bulk_create(copies)
            written += len(copies)
        return written, left_out, cut

    def _copy(self, row, prompt, response: str, to_experience, group_id: str, rollout_index: int = 0) -> ExperienceRow:
        """The row's copy in the run, `response` to `prompt` as the run's model reads them."""
        try:
            experience = to_experience(prompt, response)
        except Exception as err:  # noqa: BLE001 - a chat template may refuse a conversation in any way
            raise ValueError(f"expert dataset {self.name!r}, experience {row.pk}: {type(err).__name__}: {err} "
                             "(mark it rejected in the admin, and resume the run)") from err
        experience.group_id, experience.rollout_index = group_id, rollout_index
        experience.reward, experience.reward_components = row.reward, row.reward_components
        experience.priority = row.priority
        experience.metadata = {**row.metadata, **experience.metadata, "expert_dataset": self.name}
        copy = to_row(experience, self.run_id)
        copy.parent_id = row.pk
        return copy


def _multi_turn(row) -> bool:
    return row.action_mask is not None and not np.all(np.asarray(row.action_mask))


def _prompt_and_response(row) -> tuple[str | list[dict], str]:
    """What the row asked and answered: its chat messages but the reply where it has them (an
    imported conversation, an exported rollout), else its prompt text."""
    messages = row.messages or []
    if messages and messages[-1].get("role") == "assistant":
        return messages[:-1] or row.prompt_text, messages[-1]["content"]
    return messages or row.prompt_text, row.response_text

