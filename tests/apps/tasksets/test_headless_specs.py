"""A run config names its tasksets as the headless engine reads them (`arithmetic:n=1000,...,split=train`,
every shipped example does) or as the server holds them (a name): `manage.py rft_run
workers/rft/examples/tiny_mix_arithmetic.yaml` answered `no taskset named 'arithmetic:n=1000,...'`
and nothing more, though the README says the web takes the same file. The refusal now names what to
name instead: the built-in taskset holding the spec's tasks, or those its generator makes."""
from pathlib import Path

import pytest
from django.conf import settings

from apps.runs.services import validate_config
from apps.tasksets.models import Taskset
from apps.tasksets.services import BUILTIN_TASKSETS, load_builtin_tasksets
from workers.rft.config import ConfigError, parse_config_text
from workers.rft.memory import load_tasks

EXAMPLES = sorted((Path(settings.BASE_DIR) / "workers" / "rft" / "examples").glob("*.yaml"))
SAME_TASKS = {  # the examples' specs and the built-in tasksets that hold their tasks
    "arithmetic:n=1000,max_operand=9,ops=+,split=train": "addition",
    "arithmetic:n=1000,max_operand=9,ops=+,split=eval": "addition-eval",
}


def buffer_issues(config: dict) -> dict[str, str]:
    try:
        validate_config(config)
    except ConfigError as err:
        return {issue.key: issue.message for issue in err.errors if issue.key.startswith("buffer.")}
    return {}


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_each_shipped_example_is_refused_naming_what_to_name_instead(db, example):
    config = parse_config_text(example.read_text())
    issues = buffer_issues(config)
    assert issues, "every example names its tasksets by generator spec"
    for key, message in issues.items():
        spec = config["buffer"][key.removeprefix("buffer.")]
        assert "a generator spec, which only the headless engine reads; name" in message, message
        if spec in SAME_TASKS:
            assert f"name the built-in taskset '{SAME_TASKS[spec]}' instead" in message
        else:
            generator = spec.partition(":")[0]
            made_by = [each.name for each in BUILTIN_TASKSETS if each.generator == generator]
            assert f"a built-in one made by '{generator}' ({', '.join(made_by)})" in message


@pytest.mark.parametrize("spec, name", SAME_TASKS.items())
def test_the_named_builtin_holds_the_tasks_of_the_spec(db, spec, name):
    load_builtin_tasksets()
    stored = Taskset.objects.get(name=name).own_tasks.order_by("index").values_list("prompt", "answer")
    assert list(stored) == [(task.prompt, task.answer) for task in load_tasks(spec)]


def test_the_example_launches_with_the_names_the_refusal_gives(db):
    load_builtin_tasksets()
    text = (Path(settings.BASE_DIR) / "workers" / "rft" / "examples" / "tiny_mix_arithmetic.yaml").read_text()
    for spec, name in SAME_TASKS.items():
        text = text.replace(f'"{spec}"', name)
    assert buffer_issues(parse_config_text(text)) == {}


def test_a_builtin_not_loaded_yet_says_how_to_load_it(db):
    issues = buffer_issues({"buffer": {"taskset": "addition"}})
    assert issues == {"buffer.taskset": "no taskset named 'addition': it is built in but not loaded on this server "
                                        "yet (`python manage.py load_builtin_tasksets` loads it; `make demo` does)"}


def test_any_other_name_gets_the_message_it_had(db):
    assert buffer_issues({"buffer": {"taskset": "gsm"}}) == {
        "buffer.taskset": "no taskset named 'gsm': upload it, or pick one the Tasksets page lists"}
