"""docs/api.md says what the API answers and takes: every field of a run, of a metric point and of
a judgement, every filter of the runs list, the metric roles (the system role's step is Unix
seconds, so a `since=` cursor is per role), the metrics' cap and cursors, the experiences' cursor,
the 403 for controlling someone else's run, and the pages scripts fetch with their token."""
from pathlib import Path

import pytest
from django.conf import settings

from apps.runs.api.schemas import (
    ExperienceFilters,
    ExperiencePage,
    FeedbackOut,
    MetricFilters,
    MetricPointOut,
    MetricsOut,
    RunFilters,
    RunOut,
)
from apps.runs.models import MetricPoint

DOC = (Path(settings.BASE_DIR) / "docs" / "api.md").read_text()


@pytest.mark.parametrize("field", list(RunOut.model_fields))
def test_every_field_of_a_run_is_documented(field):
    assert f'"{field}"' in DOC


@pytest.mark.parametrize("name", [name for name in RunFilters.model_fields if name not in ("page", "page_size")])
def test_every_filter_of_the_runs_list_is_documented(name):
    runs_line = next(line for line in DOC.splitlines() if line.startswith("| `GET /api/runs/` |"))
    assert f"`{name}`" in runs_line


def test_a_metric_point_and_its_roles_are_documented():
    metrics_line = endpoint_line("/api/runs/<id>/metrics/")
    assert all(f'"{field}"' in metrics_line for field in MetricPointOut.model_fields)
    assert all(f"`{role}`" in metrics_line for role in MetricPoint.Role.values)
    assert "Unix seconds" in metrics_line and "cursor per role" in metrics_line


def endpoint_line(path: str) -> str:
    return next(line for line in DOC.splitlines() if line.startswith(f"| `GET {path}` |"))


def test_the_metrics_cap_and_cursors_are_documented():
    metrics_line = endpoint_line("/api/runs/<id>/metrics/")
    assert all(f"`{name}" in metrics_line for name in MetricFilters.model_fields)
    assert all(f'"{name}"' in metrics_line for name in MetricsOut.model_fields)
    assert "5,000" in metrics_line


def test_the_experiences_cursor_and_every_field_of_a_judgement_are_documented():
    experiences_line = endpoint_line("/api/runs/<id>/experiences/")
    assert all(f"`{name}" in experiences_line for name in ExperienceFilters.model_fields if name != "page")
    assert all(f"`{name}" in experiences_line or f'"{name}"' in experiences_line
               for name in set(ExperiencePage.model_fields) - {"page", "pages", "results"})
    assert all(f'"{name}"' in DOC for name in FeedbackOut.model_fields)
    assert "follow_experiences" in DOC.split("## Following a run", 1)[1]


def test_the_403_for_someone_elses_run_is_documented():
    forbidden = next(line for line in DOC.splitlines() if line.startswith("| 403 |"))
    assert "someone else's run" in forbidden


@pytest.mark.parametrize("path", [
    "/runs/<id>/metrics.json", "/runs/compare/metrics.json", "/runs/<id>/logs.json",
    "/runs/<id>/checkpoints/<version>/download/", "/annotate/runs/<id>/feedback.jsonl",
    "/annotate/runs/<id>/summary.json", "/jobs/<label>/<id>/progress.json",
])
def test_the_pages_a_token_reaches_are_listed(path):
    downloads = DOC.split("## Downloads beyond /api/", 1)[1].split("\n## ", 1)[0]
    assert f"`GET {path}" in downloads
