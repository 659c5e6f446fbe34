"""The run row's locks that number live updates (live.next_seq) and move a run's status
(services.set_status): writers of the same run still take turns, and on Postgres neither lock
blocks the foreign-key check of a metric point or an experience being written for the run
meanwhile (FOR NO KEY UPDATE: the row's key never changes; FOR UPDATE held every such insert until
the lock's transaction ended)."""

import threading

import pytest
from django.db import connection, transaction

from apps.buffer.models import Experience
from apps.runs import holding, services
from apps.runs.live import next_seq
from apps.runs.models import MetricPoint, Run

WRITERS, SEQS = 2, 40


@pytest.mark.django_db(transaction=True)
def test_two_writers_numbering_one_run_take_turns(make_run):
    """Each number is taken once: without the lock, read-committed writers read the same live_seq
    and both wrote it plus one."""
    run = make_run(status=Run.Status.RUNNING)
    taken, failed, start = [], [], threading.Barrier(WRITERS)

    def number():
        try:
            start.wait()
            for _ in range(SEQS):
                taken.append(next_seq(run.pk))
        except Exception as err:  # noqa: BLE001 - the test says it
            failed.append(err)
        finally:
            connection.close()

    writers = [threading.Thread(target=number) for _ in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert not failed, failed
    assert sorted(taken) == list(range(1, WRITERS * SEQS + 1))
    run.refresh_from_db()
    assert run.live_seq == WRITERS * SEQS


def _while_locked(lock, write) -> None:
    """Run `lock` in a transaction held open while another connection runs `write`, which must not
    wait for it: a lock wait past 2 s is an error there (lock_timeout), not a hang."""
    locked, done, failed = threading.Event(), threading.Event(), []

    def hold():
        try:
            with transaction.atomic():
                lock()
                locked.set()
                done.wait(timeout=30)
        except Exception as err:  # noqa: BLE001 - the test says it
            failed.append(err)
            locked.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        assert not failed, failed

        def other():
            try:
                with transaction.atomic():
                    with connection.cursor() as cursor:
                        cursor.execute("SET LOCAL lock_timeout = '2s'")
                    write()
            except Exception as err:  # noqa: BLE001 - the test says it
                failed.append(err)
            finally:
                connection.close()

        writer = threading.Thread(target=other)
        writer.start()
        writer.join(timeout=30)
    finally:
        done.set()
        holder.join(timeout=30)
    assert not failed, "\n".join(f"{type(err).__name__}: {err}" for err in failed)


def _point(run):
    return lambda: MetricPoint.objects.create(run=run, role="trainer", step=1, values={"loss": 1.0})


def _experience(run):
    return lambda: Experience.objects.create(run=run, source="rollout", group_id="g", rollout_index=0, prompt_ids=[1],
                                             response_ids=[2], action_mask=[1], response_text="2")


@pytest.mark.postgres("row lock strengths: SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", [_point, _experience], ids=["metric point", "experience"])
def test_numbering_a_runs_update_never_holds_its_writers(make_run, write):
    run = make_run(status=Run.Status.RUNNING)
    _while_locked(lambda: next_seq(run.pk), write(run))
    assert Run.objects.get(pk=run.pk).live_seq == 1


@pytest.mark.postgres("row lock strengths: SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", [_point, _experience], ids=["metric point", "experience"])
def test_moving_a_runs_status_never_holds_its_writers(make_run, write):
    run = make_run(status=Run.Status.RUNNING)
    _while_locked(lambda: services.set_status(run, Run.Status.PAUSED), write(run))
    assert Run.objects.get(pk=run.pk).status == Run.Status.PAUSED



@pytest.mark.postgres("row lock strengths: SQLite locks the whole database")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", [_point, _experience], ids=["metric point", "experience"])
def test_a_heartbeat_never_holds_the_runs_writers(make_run, write):
    """Every duty beats every few seconds: under FOR UPDATE a beat and an explorer's write of its
    experiences waited on each other, the beat for the write's whole transaction."""
    run = make_run(status=Run.Status.RUNNING, heartbeats={"trainer": {"worker": "w@h"}})
    beats = []
    _while_locked(lambda: beats.append(holding.heartbeat(run, "trainer", "w@h")), write(run))
    assert beats == [True]


@pytest.mark.django_db(transaction=True)
def test_two_status_changes_of_one_run_take_turns(make_run):
    """A pause sent while a completion holds the run's row reads the run completed once it may go
    on, and is refused; without the lock it read the run running and paused a completed run."""
    run = make_run(status=Run.Status.RUNNING)
    locked, commit, refused, failed = threading.Event(), threading.Event(), [], []

    def complete():
        try:
            with transaction.atomic():
                services.set_status(run, Run.Status.COMPLETED)
                locked.set()
                commit.wait(timeout=30)
        except Exception as err:  # noqa: BLE001 - the test says it
            failed.append(err)
            locked.set()
        finally:
            connection.close()

    def pause():
        try:
            services.set_status(Run.objects.get(pk=run.pk), Run.Status.PAUSED)
        except services.InvalidTransition as err:
            refused.append(err)
        except Exception as err:  # noqa: BLE001 - the test says it
            failed.append(err)
        finally:
            connection.close()

    completing = threading.Thread(target=complete)
    completing.start()
    assert locked.wait(timeout=30)
    pausing = threading.Thread(target=pause)
    pausing.start()
    pausing.join(timeout=1)  # it waits for the completion's lock (SQLite: for the database's)
    commit.set()
    for thread in (completing, pausing):
        thread.join(timeout=30)
    assert not failed, failed
    assert [str(err) for err in refused] == [f"run {run.pk} cannot go from completed to paused"]
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
