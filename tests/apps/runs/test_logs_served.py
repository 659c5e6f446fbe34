"""A run's log as supervision.serve captures it: two runs served at once by threads of one process
(as the embedded demo server serves them), one of them overlapping explorer and trainer in two
threads (offset 1), each keep their own lines, the explorer thread's included; a failed duty's
error and traceback come first, with no secret of the run in any line."""
import logging
import threading

import pytest
from django.db import connections

from apps.runs import logs, services, supervision
from apps.runs.models import Run
from tests.support import make_taskset
from workers.rft.explorer import Explorer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def config(steps: int, offset: int) -> dict:
    return services.validate_config({
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 2, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "micro_batch_size": 4, "total_steps": steps, "save_interval": 100},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory", "interval": 1, "offset": offset},
    }).to_dict()


@pytest.fixture
def probe(monkeypatch):
    """Each explorer step logs which run it explores for and in which thread (the engine logs
    little at INFO on its own: the probe makes the explorer thread's lines certain)."""
    plain = Explorer.explore_step
    probe_log = logging.getLogger("workers.rft.explorer")

    def explore_step(self):
        probe_log.info("probe: explorer of run %s at step %s in %s", self.buffer.run_id, self.step,
                       threading.current_thread().name)
        return plain(self)

    monkeypatch.setattr(Explorer, "explore_step", explore_step)


def test_two_runs_served_by_threads_of_one_process_keep_their_own_lines(researcher, probe):
    make_taskset()
    runs = {}
    for name, offset in (("in-turn", 0), ("overlapped", 1)):
        runs[name] = Run.objects.create(name=name, owner=researcher, config=config(3, offset),
                                        status=Run.Status.STARTING)
    outcomes = {}

    def serve(run):
        try:
            outcomes[run.name] = supervision.serve(run.pk, "loop")
        finally:
            connections.close_all()  # this thread's own

    threads = [threading.Thread(target=serve, args=(run,)) for run in runs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert outcomes == {"in-turn": "completed", "overlapped": "completed"}

    for run in runs.values():
        run.refresh_from_db()
        lines = logs.read(supervision.run_dir(run), limit=2000)["lines"]
        probes = [line for line in lines if line["message"].startswith("probe: ")]
        assert len(probes) >= 3 and all(f"explorer of run {run.pk} " in line["message"] for line in probes), probes
        assert not any(f"run {other.pk} " in line["message"] for other in runs.values() if other != run
                       for line in lines)
        assert all(run.secret not in str(line) for line in lines)
    overlapped = logs.read(supervision.run_dir(runs["overlapped"]), limit=2000)["lines"]
    assert {line["thread"] for line in overlapped if line["message"].startswith("probe: ")} == {"rft-explorer"}


def test_a_failed_duty_logs_its_error_and_traceback_first(researcher, monkeypatch):
    make_taskset()
    run = Run.objects.create(name="fails", owner=researcher, config=config(2, 0), status=Run.Status.STARTING)

    def explode(self):
        raise RuntimeError(f"reward server refused the key {run.secret}")

    monkeypatch.setattr(Explorer, "explore_step", explode)
    assert supervision.serve(run.pk, "loop") == "failed"
    found = logs.read(supervision.run_dir(run))
    first = found["lines"][0]
    assert first["level"] == "ERROR" and first["message"] == f"run {run.pk} (loop) failed"
    assert "RuntimeError: reward server refused the key [redacted]" in first["traceback"]
    assert "<rftweb>/workers/rft/loop.py" in first["traceback"]  # the server's own paths cut
    assert found["counts"]["ERROR"] == 1 and found["counts"]["INFO"] >= 1  # the engine's own lines too


def test_the_log_says_where_a_run_stopped_resumed_and_completed(researcher, monkeypatch):
    """A stopped-and-resumed 300-step run had logged 3 INFO lines, none of its stop, its
    checkpoint or its end: the run page's Logs panel said nothing of the run's life."""
    make_taskset()
    run = Run.objects.create(name="stops", owner=researcher, config=config(4, 0), status=Run.Status.STARTING)
    plain = Explorer.explore_step

    def stop_after_two(self):
        if self.step == 2 and Run.objects.get(pk=run.pk).status == Run.Status.RUNNING:
            services.stop_run(run)  # as the run page's Stop: the loop saves a checkpoint at this step
        return plain(self)

    monkeypatch.setattr(Explorer, "explore_step", stop_after_two)
    assert supervision.serve(run.pk, "loop") == "stopped"
    run.refresh_from_db()
    stopped_at = run.trainer_step
    lines = [line["message"] for line in logs.read(supervision.run_dir(run))["lines"]]
    assert f"run {run.pk} (loop): stopped at trainer step {stopped_at}, checkpoint v{stopped_at}" in lines
    assert run.status == Run.Status.STOPPED and run.checkpoints.get().version == stopped_at

    Run.objects.filter(pk=run.pk).update(status=Run.Status.STARTING)  # resumed (services.resume_run queues it)
    assert supervision.serve(run.pk, "loop") == "completed"
    lines = [line["message"] for line in logs.read(supervision.run_dir(run))["lines"]]
    assert f"run {run.pk} (loop): resumed from checkpoint v{stopped_at} (trainer step {stopped_at})" in lines
    assert f"run {run.pk} (loop): completed at trainer step 4, checkpoint v4" in lines
