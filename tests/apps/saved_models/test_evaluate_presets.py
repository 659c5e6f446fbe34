"""The Evaluate form's preset links: each keeps the form a bench run of the model (they had opened
a training run of the preset, the model gone), with that preset's prompt format, reward and eval
taskset."""
import pytest
from django.urls import reverse

from apps.runs.models import Run
from apps.runs.presets import PRESETS
from apps.saved_models import services
from tests.support import taskset_with_a_task

from .test_evaluation import launch_fields, source  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def test_the_evaluate_forms_preset_links_carry_the_model_and_stay_a_bench_run(researcher_client, source, researcher):  # noqa: F811
    taskset_with_a_task("arithmetic-eval")
    saved = services.save_model(source, 5, "warm", researcher)
    (services.model_dir(saved) / "config.json").write_text('{"model_type": "llama"}')  # what a launch checks
    for name, content in {"model.safetensors": "{}", "tokenizer_config.json": '{"chat_template": "{{ x }}"}'}.items():
        (services.model_dir(saved) / name).write_text(content)
    page = researcher_client.get(reverse("run-launch"), {"evaluate": "warm"})
    links = page.content.decode()
    for key in PRESETS:
        assert f'href="?preset={key}&amp;evaluate=warm"' in links

    chosen = researcher_client.get(reverse("run-launch"), {"preset": "smollm2-grpo", "evaluate": "warm"})
    form = chosen.context["form"]
    preset = PRESETS["smollm2-grpo"].config
    assert (form["mode"].value(), form["model.path"].value()) == ("bench", "models/warm")
    assert form["buffer.eval_taskset"].value() == preset["buffer"]["eval_taskset"] == "arithmetic-eval"
    assert form["explorer.reward_fn"].value() == preset["explorer"]["reward_fn"] == "exact_match"
    assert source.config["explorer"]["reward_fn"] == "numeric"  # the source's, which the preset replaced
    assert form["explorer.max_new_tokens"].value() == preset["explorer"]["max_new_tokens"]
    assert chosen.context["preset_name"] == "smollm2-grpo"
    assert form["name"].value() == "eval warm on arithmetic-eval"
    said = chosen.content.decode()
    assert "Evaluates warm on <bdi>arithmetic-eval</bdi> (mode bench: it trains nothing)" in said
    assert f"of the {PRESETS['smollm2-grpo'].title} preset" in said

    # Launched, it is a bench run of the model, not the preset's training run.
    launched = researcher_client.post(reverse("run-launch"), launch_fields(form))
    assert launched.status_code == 302, launched.context["form"].errors
    run = Run.objects.exclude(pk=source.pk).get()
    assert run.config["explorer"]["system_prompt"] == preset["explorer"]["system_prompt"]
    assert run.config["mode"] == "bench" and run.config["model"]["path"] == str(services.model_dir(saved))


def test_a_stale_evaluate_link_with_a_preset_says_the_model_is_gone(researcher_client, source):  # noqa: F811
    stale = researcher_client.get(reverse("run-launch"), {"preset": "sft", "evaluate": "gone"})
    assert stale.context["form"]["model.path"].value() == ""
    assert "No saved model named <bdi>gone</bdi> (deleted?)" in stale.content.decode()
