"""A run's work dir is its own: ids come back after a database reset, old files must not."""
from apps.runs.models import Run
from apps.runs.supervision import run_dir


def test_run_dir_is_named_by_id_and_creation_time(researcher, settings):
    run = Run.objects.create(name="r", owner=researcher, config={})
    assert run_dir(run) == settings.DATA_DIR / "runs" / f"{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def test_a_reused_run_id_gets_a_fresh_work_dir(researcher):
    old = Run.objects.create(name="before the reset", owner=researcher, config={})
    old_dir = run_dir(old)
    pk = old.pk
    old.delete()  # what a flush or a restored backup does: the id is free again
    new = Run.objects.create(pk=pk, name="after the reset", owner=researcher, config={})
    assert new.pk == pk
    assert run_dir(new) != old_dir
