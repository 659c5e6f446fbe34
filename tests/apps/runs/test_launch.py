"""The launch page: form and YAML editors over one run config, presets, key-level errors."""

import pytest
import yaml
from django.urls import reverse

from apps.runs import duties, services
from apps.runs.forms import LaunchForm, RewardFnField, dump_config_yaml
from apps.runs.models import Run
from apps.runs.presets import PRESETS, preset_config
from workers.rft.config import RunConfig, parse_config_text

URL = reverse("run-launch")


def posted(form: LaunchForm, **changes) -> dict:
    """What a browser posts for an unbound form as shown, with some fields changed."""
    data = {}
    for field in form:
        value = field.value()
        if field.widget_type == "checkbox":
            if value:
                data[field.name] = "on"
        else:
            data[field.name] = "" if value is None else str(value)
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def config_form(config=None, **kwargs) -> LaunchForm:
    return LaunchForm.for_config(config or preset_config("quick-demo"), **kwargs)


def test_the_page_opens_on_the_quick_demo(researcher_client, tasksets):
    response = researcher_client.get(URL)
    assert response.status_code == 200
    form = response.context["form"]
    assert form["algorithm.name"].value() == "mix" and form["model.path"].value() == "tiny"
    assert form["buffer.taskset"].value() == "addition"
    for preset in PRESETS.values():
        assert preset.title in response.content.decode()


def test_a_preset_fills_the_form(researcher_client, tasksets):
    form = researcher_client.get(URL, {"preset": "smollm2-grpo"}).context["form"]
    assert form["model.path"].value() == "smollm2-135m" and form["algorithm.name"].value() == "grpo"


def test_every_preset_is_a_valid_config(tasksets):
    for name in PRESETS:
        services.validate_config(preset_config(name))


def test_a_data_parallel_trainer_launches_on_one_machine_and_on_several(tasksets):
    """A worker starts the ranks of its own machine (tests/workers/test_ddp_worker.py); each further
    machine is a duty of the run that another train worker serves (tests/journeys/test_recovery.py)."""
    config = preset_config("quick-demo")
    config["trainer"] = {**config.get("trainer", {}), "strategy": "ddp", "num_processes": 2}
    assert services.validate_config(config).trainer.num_processes == 2
    config["trainer"]["num_nodes"] = 3
    run = Run(config=services.validate_config(config).to_dict())
    assert duties.duties_of_run(run) == ("loop", "trainer-node-1", "trainer-node-2")


def test_a_valid_form_launches_the_validated_config(
    researcher_client, researcher, tasksets, worker_queue, django_capture_on_commit_callbacks
):
    data = posted(
        config_form(), name="demo", **{"trainer.total_steps": "7", "algorithm.kl.fn": "k3", "algorithm.kl.coef": "0.01"}
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = researcher_client.post(URL, data)
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
    expected = preset_config("quick-demo")
    expected["trainer"]["total_steps"] = 7
    expected["algorithm"]["kl"] = {"fn": "k3", "coef": 0.01}
    assert run.config == RunConfig.from_dict(expected).to_dict()
    assert (run.name, run.owner, run.mode) == ("demo", researcher, "both")
    assert worker_queue == [run.pk]


def test_the_form_scales_the_trainer_out(researcher_client, tasksets, worker_queue):
    data = posted(config_form(), name="wide",
                  **{"trainer.strategy": "ddp", "trainer.num_processes": "2", "trainer.num_nodes": "2"})
    researcher_client.post(URL, data)
    trainer = Run.objects.get().config["trainer"]
    assert (trainer["strategy"], trainer["num_processes"], trainer["num_nodes"]) == ("ddp", 2, 2)
    # One rank is 'single', and the form says so next to the field.
    response = researcher_client.post(URL, posted(config_form(), **{"trainer.strategy": "ddp"}))
    (error,) = response.context["form"].errors["trainer.strategy"]
    assert "set trainer.num_processes (ranks per node) above 1" in error


def test_an_empty_name_is_made_from_the_config(researcher_client, tasksets, worker_queue):
    researcher_client.post(URL, posted(config_form(), name=""))
    assert Run.objects.get().name == "mix on addition"


def test_a_bad_value_shows_next_to_its_field_and_creates_nothing(researcher_client, tasksets, worker_queue):
    response = researcher_client.post(URL, posted(config_form(), **{"algorithm.kl.coef": "-1"}))
    assert response.status_code == 200
    assert response.context["form"].errors == {"algorithm.kl.coef": ["must be >= 0, got -1.0"]}
    html = response.content.decode()
    field = html[html.index('data-key="algorithm.kl.coef"') :]
    assert field.index("must be &gt;= 0, got -1.0") < field.index('data-key="algorithm.mix.mu"')
    assert not Run.objects.exists() and worker_queue == []


def test_a_value_of_the_wrong_type_is_refused_by_the_form(researcher_client, tasksets, worker_queue):
    response = researcher_client.post(URL, posted(config_form(), **{"trainer.lr": "fast"}))
    assert response.status_code == 200 and "trainer.lr" in response.context["form"].errors
    assert not Run.objects.exists()


def test_a_missing_taskset_is_reported_on_its_field(researcher_client, tasksets, worker_queue):
    config = preset_config("quick-demo")
    tasksets[1].delete()  # addition-eval, the demo's eval taskset
    response = researcher_client.post(URL, posted(config_form(config), **{"buffer.eval_taskset": "addition-eval"}))
    assert "buffer.eval_taskset" in response.context["form"].errors
    assert not Run.objects.exists()


def test_cross_key_rules_land_on_the_key_they_blame(researcher_client, tasksets, worker_queue):
    response = researcher_client.post(URL, posted(config_form(), **{"buffer.expert_taskset": ""}))
    assert list(response.context["form"].errors) == ["buffer.expert_taskset"]  # mix needs expert data


def test_a_fields_error_is_also_listed_by_the_launch_button(researcher_client, tasksets, worker_queue):
    """A walkthrough set explorer.engine_num 2 with memory sync: the page came back at its top with
    the only error 3,000 pixels down, by the field."""
    html = researcher_client.post(URL, posted(config_form(), **{"explorer.engine_num": "2"})).content.decode()
    top = html.index('id="launch-problems"')
    assert top < html.index('name="explorer.engine_num"')
    assert 'href="#id_explorer.engine_num"' in html[top:top + 2000]
    assert not Run.objects.exists()


def test_errors_of_keys_without_a_field_show_at_the_top(researcher_client, tasksets, worker_queue):
    config = preset_config("quick-demo")
    config["explorer"]["pipeline"] = "dedupe"  # must be a list; the form has no field for it
    response = researcher_client.post(URL, posted(config_form(config)))
    form = response.context["form"]
    assert form.non_field_errors() == ["explorer.pipeline: expected a list, got a string"]
    assert "The config has problems" in response.content.decode()
    assert not Run.objects.exists()


def test_keys_without_a_field_survive_the_form(researcher_client, tasksets, worker_queue):
    config = preset_config("quick-demo")
    config["explorer"]["system_prompt"] = "Answer with a number."
    researcher_client.post(URL, posted(config_form(config)))
    assert Run.objects.get().config["explorer"]["system_prompt"] == "Answer with a number."


def test_form_to_yaml_and_back(researcher_client, tasksets, worker_queue):
    data = posted(
        config_form(),
        name="round trip",
        switch="",
        **{"explorer.temperature": "0.7", "explorer.reward_fn": "{exact_match: 1, format: 0.2}"},
    )
    as_yaml = researcher_client.post(URL, data).context["form"]
    assert as_yaml.current_editor == "yaml" and "algorithm.name" not in as_yaml.fields
    config = yaml.safe_load(as_yaml["yaml"].value())
    assert config["explorer"]["temperature"] == 0.7
    assert config["explorer"]["reward_fn"] == {"exact_match": 1, "format": 0.2}
    assert RunConfig.from_dict(config).to_dict() == config  # the YAML is the whole config

    text = as_yaml["yaml"].value().replace("max_new_tokens: 4", "max_new_tokens: 12")
    as_form = researcher_client.post(URL, {"editor": "yaml", "name": "round trip", "yaml": text, "switch": ""}).context[
        "form"
    ]
    assert as_form.current_editor == "form" and as_form["name"].value() == "round trip"
    assert as_form["explorer.max_new_tokens"].value() == 12 and as_form["explorer.temperature"].value() == 0.7
    assert as_form["explorer.reward_fn"].value() == "{exact_match: 1, format: 0.2}"

    researcher_client.post(URL, posted(as_form))
    launched = Run.objects.get().config
    assert launched["explorer"]["max_new_tokens"] == 12 and launched["explorer"]["reward_fn"] == {
        "exact_match": 1,
        "format": 0.2,
    }


def test_launch_from_yaml_reads_floats_like_the_cli(researcher_client, tasksets, worker_queue):
    text = yaml.safe_dump(preset_config("quick-demo")).replace("lr: 0.001", "lr: 1e-4")
    assert "lr: 1e-4" in text
    researcher_client.post(URL, {"editor": "yaml", "name": "y", "yaml": text})
    assert Run.objects.get().config["trainer"]["lr"] == 1e-4


@pytest.mark.parametrize(("written", "read"), [
    ("010", 10), ("+010", 10), ("08", 8), ("00", 0), ("0o10", 8), ("0x10", 16), ("-0x10", -16), ("0b101", 5),
    ("1_000", 1000), ("1:30", "1:30"), ("12:30:00", "12:30:00"), ("0o8", "0o8"), ("1e-5", 1e-5), ("1.5e3", 1500.0),
    ("09.5", 9.5), ("1:30.5", "1:30.5"), ("'010'", "010"),
])
def test_yaml_numbers_are_read_by_yaml_1_2s_rules(written, read):
    """PyYAML's YAML 1.1 read `seed: 010` as 8 (octal) and `seed: 1:30` as 90 (base 60), silently."""
    value = parse_config_text(f"seed: {written}")["seed"]
    assert (value, type(value)) == (read, type(read))


def test_a_seed_written_with_leading_zeros_or_a_colon_launches_as_written_or_not_at_all(
        researcher_client, tasksets, worker_queue):
    text = yaml.safe_dump({**preset_config("quick-demo"), "seed": 0})
    researcher_client.post(URL, {"editor": "yaml", "name": "zeros", "yaml": text.replace("seed: 0", "seed: 010")})
    assert Run.objects.get().config["seed"] == 10
    colon = text.replace("seed: 0", "seed: 1:30")
    form = researcher_client.post(URL, {"editor": "yaml", "yaml": colon}).context["form"]
    assert form.errors["yaml"] == ["seed: expected an integer, got a string"]
    assert Run.objects.count() == 1


def test_the_yaml_box_quotes_a_string_it_would_read_back_as_a_number():
    """PyYAML's dumper quotes by YAML 1.1's rules: it wrote the system prompt "08" bare, which the
    box then read back as the number 8."""
    config = RunConfig.from_dict({"explorer": {"system_prompt": "08", "reward_fn": {"exact_match": 1}}}).to_dict()
    for prompt in ("08", "0o10", "1:30", "1e5", "010"):
        config["explorer"]["system_prompt"] = prompt
        assert parse_config_text(dump_config_yaml(config)) == config
    assert parse_config_text(RewardFnField().prepare_value({"0o7": 1})) == {"0o7": 1}


def test_yaml_errors_show_by_the_yaml_box(researcher_client, tasksets, worker_queue):
    text = yaml.safe_dump(preset_config("quick-demo")) + "trainr: {}\n"
    form = researcher_client.post(URL, {"editor": "yaml", "yaml": text}).context["form"]
    assert form.errors["yaml"] == ["trainr: unknown key; did you mean 'trainer'?"]
    broken = researcher_client.post(URL, {"editor": "yaml", "yaml": "model: [unclosed"}).context["form"]
    assert broken.errors["yaml"][0].startswith("not valid YAML")
    assert not Run.objects.exists()


@pytest.mark.parametrize("text", ["", "  \n\t\n"])
def test_an_emptied_yaml_box_launches_nothing(researcher_client, tasksets, worker_queue, text):
    """The box opens holding the preset's config; clearing it launched a run of every default."""
    form = researcher_client.post(URL, {"editor": "yaml", "name": "cleared", "yaml": text}).context["form"]
    assert form.errors["yaml"] == ["the YAML box is empty: write the run's config in it, or start from a preset"]
    assert not Run.objects.exists()


def test_yaml_text_is_never_taken_for_a_file_name(researcher_client, tasksets, worker_queue):
    form = researcher_client.post(URL, {"editor": "yaml", "yaml": "/etc/hostname.yaml"}).context["form"]
    assert form.errors["yaml"] == ["expected a mapping, got a string"]


def test_launch_again_copies_a_run(researcher_client, make_run, tasksets):
    run = make_run("first", config=preset_config("sft"))
    form = researcher_client.get(URL, {"from": run.pk}).context["form"]
    assert form["name"].value() == "first (again)" and form["algorithm.name"].value() == "sft"


def test_launch_again_of_a_run_from_before_a_rule_launches_as_it_ran(researcher_client, make_run, tasksets,
                                                                      worker_queue):
    """A mode-explore run launched with the quick demo's trainer settings, before config_rules
    refused them (they did nothing): its form opens with them at their defaults, and launches."""
    config = preset_config("quick-demo")
    config["mode"], config["explorer"]["eval_interval"] = "explore", 0
    run = make_run("explores", config=RunConfig.model_validate(config).to_dict())
    form = researcher_client.get(URL, {"from": run.pk}).context["form"]
    assert form["trainer.lr"].value() == RunConfig().trainer.lr and form["trainer.total_steps"].value() == 1000
    response = researcher_client.post(URL, posted(form))
    assert response.status_code == 302, response.context["form"].errors
    assert Run.objects.latest("pk").config["trainer"]["lr"] == RunConfig().trainer.lr


def test_annotators_cannot_launch(annotator_client, tasksets):
    assert annotator_client.get(URL).status_code == 403


@pytest.mark.parametrize("algorithm, shown", [("mix", "algorithm.mix.mu"), ("dpo", "algorithm.dpo.beta")])
def test_algorithm_specific_fields_are_marked(researcher_client, tasksets, algorithm, shown):
    html = researcher_client.get(URL).content.decode()
    assert f'data-key="{shown}" data-algorithms="{algorithm}"' in html


def test_a_hidden_field_the_algorithm_would_not_read_launches_at_its_default(researcher_client, tasksets, worker_queue):
    """The quick demo is mix (mix.mu 0.5): picking grpo hides mix's fields, which keep their values
    on the page, and the run launches with grpo's reading of them: none, so the defaults. The same
    keys in YAML are refused (test_option_matrix)."""
    data = posted(config_form(), **{"algorithm.name": "grpo", "buffer.expert_taskset": ""})
    assert data["algorithm.mix.mu"] == "0.5"
    response = researcher_client.post(URL, data)
    assert response.status_code == 302, response.context["form"].errors
    mix = Run.objects.get().config["algorithm"]["mix"]
    assert mix == RunConfig().algorithm.mix.model_dump()


def test_trainer_fields_are_marked_for_the_modes_that_train(researcher_client, tasksets):
    html = researcher_client.get(URL).content.decode()
    assert 'data-key="trainer.lr" data-modes="both train"' in html
    assert 'data-key="trainer.total_steps" data-modes' not in html  # mode explore's count of explorer steps
    assert 'data-key="explorer.eval_interval" data-modes="both bench"' in html


@pytest.mark.parametrize("mode", ["explore", "bench"])
def test_the_quick_demo_switched_to_a_mode_without_a_trainer_launches_with_trainer_defaults(
    researcher_client, tasksets, worker_queue, mode
):
    """The page hides what only a trainer reads in modes explore and bench; the quick demo's
    trainer.lr, micro_batch_size and save_interval, hidden there, launch at their defaults (they
    were refused as set and read by nothing). The same keys in YAML are refused (test_option_matrix)."""
    data = posted(config_form(), mode=mode)
    assert data["trainer.lr"] == "0.001"
    response = researcher_client.post(URL, data)
    assert response.status_code == 302, response.context["form"].errors
    config, defaults = Run.objects.get().config, RunConfig()
    assert config["mode"] == mode
    assert config["trainer"]["lr"] == defaults.trainer.lr
    assert config["trainer"]["micro_batch_size"] == defaults.trainer.micro_batch_size
    assert config["trainer"]["save_interval"] == defaults.trainer.save_interval
    assert config["trainer"]["total_steps"] == 1000  # read: the explorer steps of mode explore
    assert config["explorer"]["eval_interval"] == (10 if mode == "bench" else 0)  # read by bench alone


def test_a_hidden_field_the_configs_own_loss_reads_is_kept(researcher_client, tasksets, worker_queue):
    """grpo with policy_loss mix reads mix.mu, though the page hides it for grpo."""
    data = posted(config_form(), **{"algorithm.name": "grpo", "algorithm.policy_loss": "mix"})
    response = researcher_client.post(URL, data)
    assert response.status_code == 302, response.context["form"].errors
    assert Run.objects.get().config["algorithm"]["mix"] == {"mu": 0.5, "expert_data_ratio": 0.5}


def test_the_same_key_in_yaml_is_refused_naming_why(researcher_client, tasksets, worker_queue):
    config = preset_config("quick-demo")
    config["algorithm"]["name"] = "grpo"
    config["buffer"]["expert_taskset"] = None
    response = researcher_client.post(URL, {"editor": "yaml", "yaml": yaml.safe_dump(config)})
    assert response.status_code == 200 and not Run.objects.exists()
    errors = " ".join(response.context["form"].errors["yaml"])
    assert "algorithm.mix.mu: has no effect with policy loss 'ppo'" in errors


def test_a_tasksets_page_opens_the_launch_form_on_it(researcher_client, tasksets, worker_queue):
    """The taskset page's link: GRPO's preset on that taskset, its workflow and reward, no evals of
    the preset's held-out taskset (another kind of task); it launches as shown."""
    taskset = tasksets[0]
    page = researcher_client.get(reverse("taskset-detail", args=[taskset.name])).content.decode()
    link = f'{URL}?taskset={taskset.name}'
    assert f'href="{link}"' in page
    form = researcher_client.get(link).context["form"]
    assert form["buffer.taskset"].value() == taskset.name and form["buffer.eval_taskset"].value() is None
    assert form["explorer.workflow"].value() == taskset.default_workflow
    assert form["explorer.reward_fn"].value() == taskset.default_reward_fn
    assert (form["algorithm.name"].value(), form["explorer.eval_interval"].value()) == ("grpo", 0)
    response = researcher_client.post(URL, posted(form))
    assert response.status_code == 302, response.context["form"].errors
    assert Run.objects.get().name == f"grpo on {taskset.name}"
    # Another preset keeps the taskset; one that reads expert data reads it from this taskset.
    form = researcher_client.get(URL, {"taskset": taskset.name, "preset": "quick-demo"}).context["form"]
    assert form["buffer.expert_taskset"].value() == taskset.name == form["buffer.taskset"].value()
