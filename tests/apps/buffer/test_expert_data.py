"""Imported expert datasets a run trains on (buffer.expert_dataset): the import names a dataset, a
run's trainer copies it in tokenized for its model (apps/buffer/expert_data.py), DPO samples the
copied pairs beside its annotators' preferences, a launch checks the name and the layout, and a
dataset a run still has to copy is not deleted. On Postgres and on SQLite (`make test-sqlite`)."""
import json
from io import StringIO

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.buffer import expert_data, expert_import, services
from apps.buffer.expert_data import DjangoExpertData
from apps.buffer.models import IMPORTED_GROUP, Experience, ExpertDataset
from apps.buffer.store import DjangoExperienceBuffer
from apps.core.files import FileImportError
from apps.feedback.edit_rows import _tokenizer
from apps.feedback.models import Feedback, PairUse
from apps.runs.models import Run
from apps.runs.services import validate_config
from tests.support import taskset_with_a_task
from workers.rft.config import ConfigError, RunConfig
from workers.rft.rewards import build_reward
from workers.rft.workflows import WORKFLOWS

CHAT = [{"role": "system", "content": "Terse."}, {"role": "user", "content": "What is 2 + 2?"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def taskset(db):
    return taskset_with_a_task("arithmetic")  # the config's default


@pytest.fixture
def flow():
    """The run's prompt format and tokenizer: what the trainer hands the copy."""
    return WORKFLOWS.get("single_turn")(None, build_reward("exact_match"), tokenizer=_tokenizer("tiny"),
                                        system_prompt="Be brief.")


def make_run(owner, name="sft on imports", *, algorithm="sft", dataset="expert", status=Run.Status.RUNNING, **buffer):
    config = RunConfig.from_dict({
        "mode": "train", "algorithm": {"name": algorithm},
        "buffer": {"expert_dataset": dataset, **buffer}, "trainer": {"total_steps": 4},
    }).to_dict()
    return Run.objects.create(name=name, owner=owner, config=config, mode="train", status=status)


def copies(run) -> list[Experience]:
    return list(Experience.objects.filter(run=run, group_id__startswith=IMPORTED_GROUP).order_by("pk"))


@pytest.fixture
def sft_dataset(tmp_path, db):
    path = write_jsonl(tmp_path / "expert.jsonl", [
        {"prompt": "What is 1 + 1?", "response": "2"},
        {"messages": [*CHAT, {"role": "assistant", "content": "4"}], "reward": 1},
        # An exported multi-turn episode: its environment's tokens (mask 0) cannot be re-tokenized apart.
        {"prompt": "Play.", "response": "left\nboard\nright", "prompt_ids": [1], "response_ids": [2, 3, 4],
         "action_mask": [1, 0, 1]},
        {"prompt": "What is 3 + 3?", "response": "6", "metadata": {"source": "book"}},
    ])
    expert_import.import_expert_data(path)
    rejected = Experience.objects.get(response_text="6")  # a curator took it out
    services.set_status(Experience.objects.filter(pk=rejected.pk), Experience.Status.REJECTED)
    return ExpertDataset.objects.get(name="expert")


def test_an_sft_dataset_is_copied_into_the_run_tokenized_for_its_model(sft_dataset, researcher, flow):
    run = make_run(researcher)
    assert DjangoExpertData(run.pk, "expert").seed(flow.written_experience) == 2
    text, chat = copies(run)
    originals = {row.response_text: row for row in sft_dataset.experiences.all()}
    tokenizer = flow.tokenizer
    assert text.prompt_text.startswith("<|im_start|>system\nBe brief.") and text.prompt_text.endswith("assistant\n")
    assert text.prompt_ids == tokenizer(text.prompt_text, add_special_tokens=False)["input_ids"]
    assert text.response_ids == tokenizer("2", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert "Be brief" not in chat.prompt_text and chat.prompt_text.startswith("<|im_start|>system\nTerse.")
    assert [m["content"] for m in chat.messages] == ["Terse.", "What is 2 + 2?", "4"]
    for copy in (text, chat):
        original = originals[copy.response_text]
        assert (copy.source, copy.status, copy.parent_id, copy.dataset_id, copy.task_id) == (
            "expert", "ready", original.pk, None, None)
        assert copy.group_id == f"imported-{original.pk}" and copy.metadata["expert_dataset"] == "expert"
        assert copy.action_mask == [1] * len(copy.response_ids)
    assert chat.reward == 1.0
    # The trainer samples the copies as its expert data, and a second start copies nothing again.
    sampled = DjangoExperienceBuffer(run.pk).sample(5, sources=("expert", "human_edit"))
    assert sorted(e.id for e in sampled) == [text.pk, chat.pk]
    assert DjangoExpertData(run.pk, "expert").seed(flow.written_experience) == 0
    assert len(copies(run)) == 2
    # Another run has its own copy, tokenized for its own format.
    other = make_run(researcher, "another")
    plain = WORKFLOWS.get("single_turn")(None, build_reward("exact_match"), tokenizer=tokenizer,
                                         use_chat_template=False)
    assert DjangoExpertData(other.pk, "expert").seed(plain.written_experience) == 2
    assert copies(other)[0].prompt_text == "What is 1 + 1?"


def test_a_response_longer_than_the_model_may_write_is_cut_there_and_counted(tmp_path, researcher, caplog):
    """A 3,000,000-character response imported and copied whole: one row far past the model's
    context and any micro-batch. Cut at explorer.max_new_tokens, as a rollout that long is (no
    end-of-text token), its text what is kept; a response that fits still ends with one."""
    long = "1 + 1 = 2. " * 300_000
    expert_import.import_expert_data(write_jsonl(tmp_path / "long.jsonl", [
        {"prompt": "Count.", "response": long}, {"prompt": "What is 1 + 1?", "response": "2"}]))
    tokenizer = _tokenizer("tiny")
    flow = WORKFLOWS.get("single_turn")(None, build_reward("exact_match"), tokenizer=tokenizer, max_response_tokens=8)
    run = make_run(researcher, dataset="long")
    with caplog.at_level("INFO", logger="apps.buffer.expert_data"):
        assert DjangoExpertData(run.pk, "long").seed(flow.written_experience) == 2
    cut, fits = copies(run)
    assert len(cut.response_ids) == 8 and cut.response_ids[-1] != tokenizer.eos_token_id
    assert cut.response_text == tokenizer.decode(cut.response_ids) and long.startswith(cut.response_text.strip())
    assert cut.metadata["response_truncated"] is True
    assert fits.response_ids[-1] == tokenizer.eos_token_id and "response_truncated" not in fits.metadata
    assert "1 responses cut to explorer.max_new_tokens" in caplog.text


def test_trl_conversational_files_train_as_the_same_chat_rows_do(tmp_path, researcher, curator, flow):
    """A conversation is stored as its turns, and the run's chat template formats them when it
    copies the dataset: TRL's implicit-prompt pairs and `messages` rows give the run the very tokens
    of the same rows written as prompt turns and text replies."""
    reply = {"role": "assistant", "content": "4"}
    layouts = {
        "sft": [{"prompt": CHAT, "response": "4"}, {"messages": [*CHAT, reply]},
                {"prompt": CHAT, "completion": [reply]}],
        "dpo": [{"prompt": CHAT, "chosen": "4", "rejected": "5"},
                {"chosen": [*CHAT, reply], "rejected": [*CHAT, {"role": "assistant", "content": "5"}]}],
    }
    for layout, rows in layouts.items():
        for number, row in enumerate(rows):
            expert_import.import_expert_data(write_jsonl(tmp_path / f"{layout}{number}.jsonl", [row]), layout=layout,
                                        user=curator)
        tokens = []
        for number in range(len(rows)):
            run = make_run(researcher, f"{layout} {number}", algorithm=layout, dataset=f"{layout}{number}")
            DjangoExpertData(run.pk, f"{layout}{number}").seed(flow.written_experience)
            tokens.append([(copy.prompt_text, copy.prompt_ids, copy.response_ids) for copy in copies(run)])
        assert tokens[0][0][0].startswith("<|im_start|>system\nTerse.")  # the template, the row's system turn
        assert all(copied == tokens[0] for copied in tokens), layout


def test_a_copy_that_fails_names_the_row_and_a_restart_carries_it_on(tmp_path, researcher, flow, monkeypatch):
    expert_import.import_expert_data(write_jsonl(tmp_path / "many.jsonl", [
        {"prompt": f"What is {i} + {i}?", "response": str(2 * i)} for i in range(7)
    ]))
    monkeypatch.setattr(expert_data, "BATCH_ROWS", 2)
    run = make_run(researcher, dataset="many")
    bad = Experience.objects.get(dataset__name="many", response_text="8")

    def refuses_one(prompt, response):
        if response == "8":
            raise RuntimeError("Conversation roles must alternate")
        return flow.written_experience(prompt, response)

    with pytest.raises(ValueError, match=f"expert dataset 'many', experience {bad.pk}: RuntimeError: Conversation"):
        DjangoExpertData(run.pk, "many").seed(refuses_one)
    assert [c.response_text for c in copies(run)] == ["0", "2", "4", "6"]  # the whole batches before its own
    assert DjangoExpertData(run.pk, "many").seed(flow.written_experience) == 3
    assert sorted(c.response_text for c in copies(run)) == sorted(str(2 * i) for i in range(7))


def test_a_dataset_a_resumable_run_has_not_copied_is_kept_and_one_its_runs_have_copied_is_not(
        sft_dataset, researcher, flow):
    """A stopped or failed run that never copied the dataset copies it when resumed: deleted, its
    Resume failed for good ("no expert dataset is named 'expert'"). One with a copy trains on the
    copy, and a completed run is never resumed."""
    copied, waiting = make_run(researcher, "copied"), make_run(researcher, "waiting", status=Run.Status.STOPPED)
    failed = make_run(researcher, "failed", status=Run.Status.FAILED)
    make_run(researcher, "done", status=Run.Status.COMPLETED)
    DjangoExpertData(copied.pk, "expert").seed(flow.written_experience)
    Run.objects.filter(pk=copied.pk).update(status=Run.Status.STOPPED)
    with pytest.raises(services.DatasetInUse) as refused:
        services.delete_datasets(ExpertDataset.objects.all())
    assert str(refused.value) == (
        f"Not deleted: run waiting (#{waiting.pk}) names 'expert', which it has not copied, and is stopped: it can be "
        f"resumed; delete the run first; run failed (#{failed.pk}) names 'expert', which it has not copied, and is "
        "failed: it can be resumed; delete the run first.")
    assert sft_dataset.experiences.count() == 4
    Run.objects.filter(pk__in=[waiting.pk, failed.pk]).delete()
    assert services.delete_datasets(ExpertDataset.objects.all()) == 4
    assert not ExpertDataset.objects.exists() and len(copies(copied)) == 2  # the run's copy stays
    assert all(copy.parent_id is None for copy in copies(copied))
    assert DjangoExpertData(copied.pk, "expert").seed(flow.written_experience) == 0
    # A run that had not copied it, had the dataset gone another way, says so on its start.
    with pytest.raises(ValueError, match="no expert dataset is named 'expert' .deleted since the run was launched"):
        DjangoExpertData(make_run(researcher, "late", status=Run.Status.STOPPED).pk, "expert").seed(
            flow.written_experience)


def test_a_dataset_a_queued_or_running_run_names_is_not_deleted(sft_dataset, researcher, curator):
    queued = make_run(researcher, "queued", status=Run.Status.QUEUED)
    with pytest.raises(services.DatasetInUse, match=f"run queued \\(#{queued.pk}\\) names 'expert'"):
        services.delete_datasets(ExpertDataset.objects.all())
    assert sft_dataset.experiences.count() == 4


def test_dpo_samples_the_copied_pairs_beside_its_annotators_least_used_first(tmp_path, researcher, curator, flow):
    expert_import.import_expert_data(write_jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."},
        {"prompt": CHAT, "chosen": "4", "rejected": "5"},
    ]), layout="dpo", user=curator)
    run = make_run(researcher, "dpo", algorithm="dpo", dataset="prefs")
    assert DjangoExpertData(run.pk, "prefs").seed(flow.written_experience) == 4
    first_chosen, first_rejected, second_chosen, second_rejected = copies(run)
    assert (first_chosen.group_id, first_chosen.rollout_index, second_rejected.rollout_index) == (
        first_rejected.group_id, 0, 1)
    assert first_chosen.prompt_ids == first_rejected.prompt_ids
    assert (first_chosen.metadata["preference"], first_rejected.metadata["preference"]) == ("chosen", "rejected")
    # An annotator's comparison of two of the run's rollouts, once used already.
    a, b = (Experience.objects.create(run=run, source="rollout", group_id="g", rollout_index=i, prompt_ids=[1],
                                      response_ids=[2 + i], action_mask=[1], response_text=str(i)) for i in range(2))
    judged = Feedback.objects.create(experience=a, other=b, user=curator, kind="preference", value=1.0)
    PairUse.objects.create(run=run, preference=judged, uses=1, last_used_at=timezone.now())
    buffer = DjangoExperienceBuffer(run.pk)
    pairs = buffer.sample_pairs(2)
    assert [p.chosen_ids for p in pairs] == [first_chosen.response_ids, second_chosen.response_ids]
    assert pairs[0].rejected_ids == first_rejected.response_ids and pairs[0].prompt_ids == first_chosen.prompt_ids
    # Each used once now: the judged pair first, then the copies by id.
    assert [p.chosen_ids for p in buffer.sample_pairs(3)] == [
        [2], first_chosen.response_ids, second_chosen.response_ids]
    first_chosen.refresh_from_db()
    rejected_uses = Experience.objects.get(pk=first_rejected.pk).use_count
    assert (PairUse.objects.get(preference=judged).uses, first_chosen.use_count, rejected_uses) == (
        2, 2, 0)
    # A curator's flag on a copy leaves its pair out.
    services.set_status(Experience.objects.filter(pk=second_rejected.pk), Experience.Status.REJECTED)
    assert [p.chosen_ids for p in buffer.sample_pairs(5)] == [[2], first_chosen.response_ids]


def test_a_resume_gives_back_the_imported_pairs_its_lost_steps_used(tmp_path, researcher, curator, flow):
    """Under algorithm.dpo.max_pair_uses 1 (mode both's default) a pair trains once: the pairs a
    step lost to a crash used must be usable again by the replayed step, as judged pairs are."""
    expert_import.import_expert_data(write_jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": f"Say {word}", "chosen": word, "rejected": "no"} for word in ("hi", "yo", "hey")
    ]), layout="dpo", user=curator)
    run = make_run(researcher, "dpo", algorithm="dpo", dataset="prefs")
    DjangoExpertData(run.pk, "prefs").seed(flow.written_experience)
    buffer = DjangoExperienceBuffer(run.pk)
    first, _, third = [c.response_ids for c in copies(run) if c.rollout_index == 0]
    assert [p.chosen_ids for p in buffer.sample_pairs(1, max_uses=1)] == [first]
    checkpoint_time = timezone.now()
    [lost] = buffer.sample_pairs(1, max_uses=1)
    buffer.rewind(checkpoint_time)
    assert [p.chosen_ids for p in buffer.sample_pairs(3, max_uses=1)] == [lost.chosen_ids, third]
    buffer.rewind(None)  # from the start: every pair usable again
    assert len(buffer.sample_pairs(3, max_uses=1)) == 3


def test_an_import_adds_to_a_dataset_of_its_own_layout_only(tmp_path, curator):
    path = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "p", "response": "r"}])
    expert_import.import_expert_data(path, dataset="shared")
    expert_import.import_expert_data(path, dataset="shared", append=True)
    assert ExpertDataset.objects.get().experiences.count() == 2
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    with pytest.raises(FileImportError, match="the dataset 'shared' holds SFT data, and this file is a DPO import"):
        expert_import.import_expert_data(pairs, dataset="shared", layout="dpo", user=curator, append=True)
    assert Experience.objects.count() == 2 and ExpertDataset.objects.count() == 1


@pytest.mark.parametrize(("algorithm", "layout", "problem"), [
    ("sft", None, "no expert dataset named 'expert': curators import one"),
    ("sft", "dpo", "'expert' holds DPO data, and algorithm 'sft' trains on responses to imitate: name an SFT"),
    ("dpo", "sft", "'expert' holds SFT data, and algorithm 'dpo' trains on preference pairs: name a DPO dataset"),
    ("grpo", "sft", "has no effect with algorithm 'grpo'"),
    ("sft", "sft", None),
    ("dpo", "dpo", None),
])
def test_a_launch_checks_the_dataset_and_that_the_algorithm_reads_its_layout(taskset, algorithm, layout, problem):
    if layout:
        ExpertDataset.objects.create(name="expert", layout=layout)
    config = {"mode": "train" if algorithm in ("sft", "dpo") else "both", "algorithm": {"name": algorithm},
              "buffer": {"expert_dataset": "expert"}}
    if problem is None:
        assert validate_config(config).buffer.expert_dataset == "expert"
        return
    with pytest.raises(ConfigError) as refused:
        validate_config(config)
    assert [issue.key for issue in refused.value.errors] == ["buffer.expert_dataset"]
    assert problem in str(refused.value)


def test_mix_takes_an_imported_dataset_in_place_of_an_expert_taskset(taskset):
    ExpertDataset.objects.create(name="expert", layout="sft")
    config = {"algorithm": {"name": "mix"}, "buffer": {"expert_dataset": "expert"}}
    assert validate_config(config).buffer.expert_taskset is None
    with pytest.raises(ConfigError, match="or buffer.expert_dataset: imported expert data"):
        validate_config({"algorithm": {"name": "mix"}})


# ---- the admin ----


def test_the_datasets_page_lists_rows_and_runs_and_asks_before_deleting(sft_dataset, researcher, client, curator):
    client.force_login(curator)
    run = make_run(researcher, "trains on it", status=Run.Status.QUEUED)
    listing = client.get(reverse("admin:buffer_expertdataset_changelist")).content.decode()
    assert "expert" in listing and ">4 rows<" in listing and "trains on it" in listing
    delete = reverse("admin:buffer_expertdataset_delete", args=[sft_dataset.pk])
    refused = client.get(delete).content.decode()
    assert "Cannot delete expert dataset" in refused
    assert f"Run trains on it (#{run.pk}) names &#x27;expert&#x27; and has not ended" in refused
    assert "Cannot delete expert dataset" in client.post(delete, {"post": "yes"}).content.decode()
    assert sft_dataset.experiences.count() == 4
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    assert "expert: 4 experiences and the preferences between them" in client.get(delete).content.decode()
    done = client.post(delete, {"post": "yes"})
    assert done.status_code == 302 and not Experience.objects.exists() and not ExpertDataset.objects.exists()
    listed = client.get(reverse("admin:buffer_experience_changelist") + "?dataset__id__exact=1")
    assert listed.status_code in (200, 302)


def test_the_datasets_page_reads_every_rows_runs_at_once(researcher, client, curator):
    """Each row names the five newest runs that name its dataset and how many more: in as many
    queries for 30 datasets as for 3 (each row cost two of its own)."""
    client.force_login(curator)
    url = reverse("admin:buffer_expertdataset_changelist")

    def listing(datasets: int) -> tuple[str, int]:
        for i in range(ExpertDataset.objects.count(), datasets):
            ExpertDataset.objects.create(name=f"set{i:02}", layout="sft")
            make_run(researcher, f"only on set{i:02}", dataset=f"set{i:02}")
        with CaptureQueriesContext(connection) as captured:
            page = client.get(url).content.decode()
        return page, len(captured)

    ExpertDataset.objects.create(name="set00", layout="sft")
    busy = [make_run(researcher, f"busy {i}", dataset="set00") for i in range(7)]
    make_run(researcher, "no dataset", algorithm="grpo", dataset=None)
    three, queries = listing(3)
    assert listing(30)[1] == queries, queries
    row = three[three.index(">set00<"):three.index(">set01<")]
    newest = [f'href="{reverse("run-detail", args=[run.pk])}">{run.name}<' for run in busy[::-1][:5]]
    assert [link in row for link in newest] == [True] * 5 and "busy 1<" not in row and "and 2 more" in row
    assert ">only on set01<" in three[three.index(">set01<"):] and "no dataset" not in three
    one = client.get(reverse("admin:buffer_expertdataset_change", args=[ExpertDataset.objects.get(name="set00").pk]))
    assert newest[0] in one.content.decode() and "and 2 more" in one.content.decode()


@pytest.mark.parametrize("role", ["annotator", "researcher"])
def test_only_curators_reach_the_datasets(sft_dataset, client, request, role):
    client.force_login(request.getfixturevalue(role))
    for url in (reverse("admin:buffer_expertdataset_changelist"),
                reverse("admin:buffer_expertdataset_delete", args=[sft_dataset.pk])):
        assert client.get(url).status_code in (302, 403)
    assert ExpertDataset.objects.exists()


def test_the_import_command_names_the_dataset_and_refuses_what_the_page_refuses(tmp_path, curator):
    from django.core.management import CommandError, call_command

    path = write_jsonl(tmp_path / "answers.jsonl", [{"prompt": "p", "response": "r"}] * 3)
    call_command("import_expert_data", str(path), verbosity=0)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    call_command("import_expert_data", str(pairs), "--dataset", "prefs", "--layout", "dpo", "--user", "cur",
                 verbosity=0)
    assert dict(ExpertDataset.objects.values_list("name", "layout")) == {"answers": "sft", "prefs": "dpo"}
    assert Feedback.objects.get().user == curator
    out = StringIO()
    with pytest.raises(CommandError, match="the dataset 'prefs' exists and holds 1 pair: name a new one, or ask "
                                           r"to add this file's rows to it \('Add to an existing dataset'; "
                                           r"import_expert_data --append\)"):
        call_command("import_expert_data", str(pairs), "--dataset", "prefs", "--layout", "dpo", "--user", "cur",
                     verbosity=0)
    call_command("import_expert_data", str(pairs), "--dataset", "prefs", "--append", "--layout", "dpo", "--user",
                 "cur", stdout=out, verbosity=0)
    assert "Added 1 pair to the existing dataset 'prefs', which now holds 2 pairs." in out.getvalue()
    call_command("import_expert_data", str(pairs), "--dataset", "more-prefs", "--append", "--layout", "dpo", "--user",
                 "cur", stdout=out, verbosity=0)  # --append: add to it if it is there, else make it
    assert "Imported 1 pair into the new dataset 'more-prefs'." in out.getvalue()
    with pytest.raises(CommandError, match="a DPO import needs a user"):
        call_command("import_expert_data", str(pairs), "--layout", "dpo", verbosity=0)
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("import_expert_data", str(pairs), "--layout", "dpo", "--user", "nobody", verbosity=0)
    with pytest.raises(CommandError, match="the dataset 'answers' holds SFT data"):
        call_command("import_expert_data", str(pairs), "--dataset", "answers", "--layout", "dpo", "--user", "cur",
                     verbosity=0)
    assert Experience.objects.count() == 9
