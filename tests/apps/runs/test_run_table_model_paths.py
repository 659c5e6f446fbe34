"""A model directory in the runs table as people wrote it: a launch stores model.path (ref_path,
critic_path) resolved and absolute (config_checks.model_issues: the workers load what was checked),
while the config said `models/con` (a saved model, apps/saved_models). The list, its CSV and its
groups show the written form, and ?where= matches it (and the stored absolute form, and ./models/con/).
The stored config is left as the engine resolved it. On Postgres and SQLite alike."""

import json
from urllib.parse import parse_qs

import pytest
from django.urls import reverse

from apps.runs.config_checks import model_issues
from workers.rft.config import RunConfig

from .test_run_table import listed, read_csv


@pytest.fixture
def data_dir(settings, tmp_path):
    """The data dir through a symlink, as a deployment may mount it: the stored path is the real one."""
    real = tmp_path / "real-data"
    (real / "models").mkdir(parents=True)
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.symlink_to(real)
    return real


def model_dir(directory):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        (directory / name).write_bytes(b"\0")
    return directory


def launched(make_run, name, path, **model):
    """A run whose config is stored as a launch stores it: each model directory resolved (model_issues)."""
    parsed = RunConfig.from_dict({"model": {"path": path, **model}})
    issues, resolved = model_issues(parsed)
    assert issues == []
    config = parsed.to_dict()
    for key, directory in resolved.items():
        config["model"][key.removeprefix("model.")] = directory
    return make_run(name, config=config)


@pytest.fixture
def runs(make_run, data_dir):
    model_dir(data_dir / "models" / "con")
    model_dir(data_dir / "models" / "other")
    made = {"con": launched(make_run, "con", "models/con", ref_path="models/other"),
            "other": launched(make_run, "other", "./models/other/"),
            "tiny": launched(make_run, "tiny", "tiny")}
    assert made["con"].config["model"]["path"] == str(data_dir / "models" / "con")  # stored absolute
    return made


def test_the_list_and_its_csv_show_the_path_as_written(researcher_client, runs):
    response = researcher_client.get(reverse("run-list"), {"cols": "model.path,model.ref_path", "sort": "name"})
    cells = {run.name: [cell["text"] for _, cell in run.columns_and_cells] for run in response.context["runs"]}
    assert cells == {"con": ["models/con", "models/other"], "other": ["models/other", None], "tiny": ["tiny", None]}
    assert str(runs["con"].config["model"]["path"]) not in response.content.decode()
    rows = read_csv(researcher_client.get(reverse("run-list-csv"), {"cols": "model.path", "sort": "name"}))
    assert [row["model.path"] for row in rows] == ["models/con", "models/other", "tiny"]


@pytest.mark.parametrize("where, expected", [
    ("model.path = models/con", {"con"}),
    ("model.path = ./models/con/", {"con"}),
    ('model.path = "models/con"', {"con"}),
    ("model.path != models/con", {"other", "tiny"}),
    ("model.path = models/other", {"other"}),
    ("model.ref_path = models/other", {"con"}),
    ("model.path = tiny", {"tiny"}),  # a built-in's name is stored as it is
    ("model.path = {data}/models/con", {"con"}),  # the stored absolute form too
    ("model.path = models/co", set()),
])
def test_where_matches_the_path_as_written(researcher_client, runs, data_dir, where, expected):
    assert set(listed(researcher_client, where=where.format(data=data_dir))) == expected


def test_groups_by_a_model_path_as_written_and_list_each_alone(researcher_client, runs):
    response = researcher_client.get(reverse("run-list"), {"group": "model.path", "sort": "name", "cols": "status"})
    groups = response.context["groups"]
    assert [group.values for group in groups] == [("models/con",), ("models/other",), ("tiny",)]
    alone = groups[0].listed
    assert parse_qs(alone)["where"] == ["model.path = models/con"]
    assert [run.name for run in researcher_client.get(f"{reverse('run-list')}?{alone}").context["runs"]] == ["con"]
