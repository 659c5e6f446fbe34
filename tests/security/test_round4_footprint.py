"""Issue #41, findings 3 and 15: keys each within its limit that add up to a run no worker can hold.

Finding 3: 8 tasks x 16 rollouts x 32,768 new tokens was accepted without a word; each train pool
process passed 3 GB within seconds and was killed, 7 kills in 58 s. Finding 15: 16 trainer ranks
on a 2-core machine without a GPU were accepted. A launch now estimates what the run's processes
hold (workers/rft/footprint.py) and checks it, and the ranks a machine runs, against the live
workers that would serve it (apps/runs/config_fit.fit_issues, in services.validate_config):
refused naming the keys with the figure; warned (waits.launch_warnings) past 70 % of a worker's
memory, when only some of the workers could host it, and, with none live, against this machine.

The workers here register as a real one does (capacity.register), then take the figures of the
finding's machine: 2 cores, 24 GiB, no GPU.
"""
from pathlib import Path

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from apps.runs import capacity, hosts
from apps.runs.config_fit import fit_issues, fit_warnings
from apps.runs.forms import LaunchForm
from apps.runs.models import Run, Worker
from apps.runs.presets import PRESETS, preset_config
from tests.support import api_launcher, browser_client, taskset_with_a_task
from tests.workers.rft.test_option_matrix import BASE, MIX, SFT, merged
from workers.rft.config import RunConfig, load_config, parse_config_text
from workers.rft.footprint import BUILTIN_SHAPES, GB, run_footprint

LAUNCH = reverse("run-launch")
# The finding's launch, in the launch page's YAML box: 8 tasks x 16 rollouts x 32,768 new tokens.
FINDING = """\
mode: both
model: {path: tiny}
algorithm: {name: grpo, repeat_times: 16}
explorer: {batch_size: 8, max_new_tokens: 32768}
trainer: {total_steps: 100}
buffer: {taskset: arithmetic}
"""
TASKSETS = ("addition", "addition-eval", "arithmetic", "arithmetic-eval")
EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "rft" / "examples"


def needs(text: str) -> int:
    """The estimate of a `loop` process of this config on CPU, in bytes."""
    config = RunConfig.from_dict(parse_config_text(text))
    return run_footprint(config, BUILTIN_SHAPES["tiny"], on_gpu=False).process(True, True, on_gpu=False).total


def worker(name: str, *, memory_gb: float = 24.0, cpus: int = 2, gpus: tuple[float, ...] = ()) -> Worker:
    """A live worker of both run queues as capacity.register records it, on a machine of these figures."""
    capacity.register(name, ["explore", "train"], 2)
    Worker.objects.filter(name=name).update(
        memory_gb=memory_gb, cpus=cpus, gpus=[{"name": "H100", "memory_gb": size, "used_gb": 0.0} for size in gpus])
    return Worker.objects.get(name=name)


@pytest.fixture
def tasksets(db):
    return [taskset_with_a_task(name) for name in TASKSETS]


@pytest.fixture
def api(researcher, tasksets):
    return api_launcher(researcher, "big")


@pytest.fixture
def page(researcher, tasksets):
    return browser_client(researcher)


def refusal(response) -> dict[str, str]:
    assert response.status_code == 400, response.content[:500]
    return {error["key"]: error["message"] for error in response.json()["errors"]}


def launched(response) -> list[str]:
    """The warnings of an API launch that created its run."""
    assert response.status_code == 201, response.content[:1000]
    return response.json()["warnings"]


def test_a_worker_registers_the_memory_and_cores_of_its_machine(db):
    capacity.register("runs@here", ["train"], 1)
    row = Worker.objects.get(name="runs@here")
    assert row.cpus == hosts.cpu_count() >= 1
    assert row.memory_gb == round(hosts.memory_bytes() / GB, 1) > 0


def test_the_findings_launch_is_refused_with_the_figure_by_the_form_and_the_api(page, api):
    worker("train@box-1")
    worker("train@box-2")  # the finding's two train workers
    figure = f"about {needs(FINDING) / GB:.1f} GB"  # 67.8 GB, of which the explorer's KV cache 8.1 GB
    assert len(FINDING) < 400 and needs(FINDING) > 2 * 24 * GB

    yaml_box = page.post(LAUNCH, {"name": "big", "editor": "yaml", "yaml": FINDING})
    assert yaml_box.status_code == 200
    (said,) = yaml_box.context["form"].errors["yaml"]
    assert said.startswith("explorer.max_new_tokens: this run's `loop` duty would take " + figure)
    assert "train@box-1 has 24.0 GB" in said and "nor could the other 1 live `train` worker" in said
    assert "explorer KV cache 8.1 GB" in said
    assert "Lower explorer.max_new_tokens, trainer.micro_batch_size or explorer.batch_size x algorithm.repeat_times" \
        in said

    config = parse_config_text(FINDING)
    fields = {key: value for key, value in LaunchForm.for_config(config).initial.items()
              if value is not None and value is not False}
    form = page.post(LAUNCH, {**fields, "name": "big", "editor": "form"})
    (by_its_field,) = form.context["form"].errors["explorer.max_new_tokens"]
    assert figure in by_its_field

    errors = refusal(api(FINDING))
    assert list(errors) == ["explorer.max_new_tokens"] and figure in errors["explorer.max_new_tokens"]
    assert not Run.objects.exists()


def test_sixteen_ranks_on_a_two_core_worker_are_refused(api):
    worker("train@box")
    config = merged(parse_config_text(FINDING), {"explorer": {"max_new_tokens": 32},
                                                 "trainer": {"strategy": "ddp", "num_processes": 16}})
    errors = refusal(api(config))
    assert errors["trainer.num_processes"].startswith("16 ranks on train@box, which has 2 cores: at most 2")
    assert errors["trainer.num_processes"].count("ranks") == 1
    two = merged(config, {"trainer": {"num_processes": 2}})
    assert not [w for w in launched(api(two)) if "ranks" in w]


def test_ranks_beyond_a_workers_gpus_and_cuda_on_a_worker_without_one_are_refused(api):
    worker("train@gpu", memory_gb=256.0, cpus=32, gpus=(80.0, 80.0))
    small = merged(parse_config_text(FINDING), {"explorer": {"max_new_tokens": 32}})
    four = merged(small, {"trainer": {"strategy": "ddp", "num_processes": 4}})
    assert refusal(api(four)) == {"trainer.num_processes": "4 ranks need a GPU each, and train@gpu has 2"}
    assert launched(api(merged(small, {"trainer": {"strategy": "ddp", "num_processes": 2}}))) == []
    Worker.objects.filter(name="train@gpu").update(gpus=[])
    assert refusal(api(merged(small, {"model": {"device": "cuda"}}))) == {
        "model.device": "is cuda, and train@gpu has no GPU"}


def test_embedded_the_server_checks_its_own_machine(api, settings):
    """Embedded, this machine serves every duty: ranks past its cores (or GPUs) are refused."""
    settings.RFTWEB_EMBEDDED = True
    here = hosts.this_machine()
    limit = len(here.gpus) if here.gpus else here.cpus
    if limit >= 16:
        pytest.skip(f"this machine takes 16 ranks ({limit} {'GPUs' if here.gpus else 'cores'})")
    config = merged(parse_config_text(FINDING), {"explorer": {"max_new_tokens": 32},
                                                 "trainer": {"strategy": "ddp", "num_processes": limit + 1}})
    said = refusal(api(config))["trainer.num_processes"]
    assert hosts.THIS_MACHINE in said and f"has {limit}" in said


def test_with_no_live_worker_this_machine_stands_in_with_a_warning(api):
    """No worker is live yet: one may start on a larger machine, so this is a warning, not a refusal."""
    here = hosts.this_machine()
    limit = len(here.gpus) if here.gpus else here.cpus
    if limit >= 16:
        pytest.skip(f"this machine takes 16 ranks ({limit} {'GPUs' if here.gpus else 'cores'})")
    config = merged(parse_config_text(FINDING), {"explorer": {"max_new_tokens": 32},
                                                 "trainer": {"strategy": "ddp", "num_processes": limit + 1}})
    warnings = launched(api(config))
    (stands_in,) = [w for w in warnings if "stands in" in w]
    assert stands_in.startswith(f"No live `train` worker to check this run against, so {hosts.THIS_MACHINE} "
                                f"stands in: trainer.num_processes: {limit + 1} ranks")
    assert any("No live worker takes the `train` queue" in w for w in warnings)  # the slots' own warning


def test_a_launch_near_the_limit_is_warned_and_launched(page, api):
    near = FINDING.replace("32768", "4096")
    worker("train@box", memory_gb=needs(near) / GB / 0.8)  # the run would take 80 % of it
    (warning,) = launched(api(near))
    assert warning.startswith(f"This run's `loop` duty would take up to about {needs(near) / GB:.1f} GB, 80% of ")
    assert "Lower explorer.max_new_tokens" in warning

    response = page.post(LAUNCH, {"name": "near", "editor": "yaml", "yaml": near})
    assert response.status_code == 302
    shown = [str(message) for message in get_messages(response.wsgi_request)]
    assert shown[0].startswith("Launched") and shown[1] == warning


def test_a_run_only_some_workers_can_hold_is_launched_with_a_warning_naming_the_others(api):
    near = FINDING.replace("32768", "4096")
    worker("train@big", memory_gb=64.0)
    worker("train@small", memory_gb=4.0)
    (warning,) = launched(api(near))
    assert warning.startswith(f"explorer.max_new_tokens: this run's `loop` duty would take about "
                              f"{needs(near) / GB:.1f} GB, and train@small has 4.0 GB")
    assert warning.endswith("Celery hands a duty to whichever worker of its queue takes it first.")


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_launches_on_this_machine_without_a_word_on_memory(api, name):
    """On this 24 GiB, 2-core machine: the largest preset, SmolLM2 GRPO, is estimated at 14.1 GB (60 %)."""
    worker("train@box")
    assert launched(api(preset_config(name), name=name)) == []


OPTION_MATRIX = {  # tests/workers/rft/test_option_matrix.py's configs, one of each kind
    "grpo": {}, "sft": SFT, "mix": {**MIX, "algorithm": {"name": "mix"}}, "ppo": {"algorithm": {"name": "ppo"}},
    "dpo": {"mode": "train", "algorithm": {"name": "dpo"}},
    "kl": {"algorithm": {"kl": {"fn": "low_var_kl", "coef": 0.1}}},
    "lora": {"model": {"lora": {"r": 8}}},
    "ddp": {"trainer": {"micro_batch_size": 4, "strategy": "ddp", "num_processes": 2}},
    "fsdp": {"trainer": {"micro_batch_size": 4, "strategy": "fsdp", "num_processes": 2}},
    "checkpoint sync": {"synchronizer": {"method": "checkpoint"}},
}


def test_ordinary_configs_fit_this_machine(db):
    """The option matrix's configs and the engine's examples, against a 24 GiB, 2-core worker."""
    worker("train@box")
    configs = {name: RunConfig.from_dict(merged(BASE, patch)) for name, patch in OPTION_MATRIX.items()}
    configs |= {path.name: load_config(path) for path in sorted(EXAMPLES.glob("*.yaml"))}
    for name, config in configs.items():
        assert (fit_issues(config), fit_warnings(config)) == ([], []), name
