"""docs/api.md describes /api/workers/ whole: every field of a worker and of a hold, and every
top-level key (it described a worker without cpus, memory_gb, usage, restarted_at and stopped_at,
and the answer without housekeeping)."""
from pathlib import Path

import pytest
from django.conf import settings

from apps.runs.api.worker_schemas import HoldOut, WorkerOut, WorkersOut

DOC = (Path(settings.BASE_DIR) / "docs" / "api.md").read_text()
WORKERS_LINE = next(line for line in DOC.splitlines() if line.startswith("| `GET /api/workers/` |"))


@pytest.mark.parametrize("field", [*WorkerOut.model_fields, *HoldOut.model_fields])
def test_every_field_of_a_worker_and_its_holds_is_documented(field):
    assert f'"{field}"' in DOC.split("A worker is", 1)[1]


@pytest.mark.parametrize("key", list(WorkersOut.model_fields))
def test_every_key_of_the_workers_answer_is_documented(key):
    assert f'"{key}"' in WORKERS_LINE
