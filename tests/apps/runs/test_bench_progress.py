"""A bench run (mode bench: it evaluates a model and trains nothing) reads its evaluation as its
progress: a completed one said "0 / 100" on the runs list, "Trainer step 0 / 100" on its page and
progress 0.0 in the API (it counted trainer steps of trainer.total_steps)."""
import pytest

from apps.runs.models import Run
from apps.runs.queries import run_progress

pytestmark = pytest.mark.django_db


def bench_run(owner, status):
    return Run.objects.create(name=f"eval {status}", owner=owner, mode=Run.Mode.BENCH, status=status,
                              config={"mode": "bench", "trainer": {"total_steps": 100}})


def test_a_bench_runs_progress_is_its_evaluation(researcher, researcher_client):
    running, done = bench_run(researcher, Run.Status.RUNNING), bench_run(researcher, Run.Status.COMPLETED)
    assert (run_progress(running).done, run_progress(running).total) == (0, 1)
    assert (run_progress(done).done, run_progress(done).total, run_progress(done).percent) == (1, 1, 100)
    page = researcher_client.get(f"/runs/{done.pk}/").content.decode()
    assert '<div class="label">Evaluation</div>' in page and "Trainer step" not in page
    assert '<span data-state="evaluation">1</span><span class="of"> / 1</span>' in page
    api = {run["id"]: run for run in researcher_client.get("/api/runs/").json()["results"]}
    assert (api[done.pk]["progress"], api[running.pk]["progress"]) == (1.0, 0.0)
