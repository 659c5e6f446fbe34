"""Several explorers of one run, over Postgres: the claims they share its explorer steps by
(store.DjangoStepClaims: a step's batch is picked once, its groups go to one explorer each, a
dead explorer's groups go back to the pool, exactly one explorer finishes the step), and adding or
removing explorers from the run page while it trains (supervision.set_explorers)."""
import threading

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from apps.runs import duties, holding, supervision
from apps.runs.models import ExplorerGroup, ExplorerStep, Run
from apps.runs.presets import preset_config
from apps.runs.store import DjangoStepClaims
from workers.rft.config import ConfigError, RunConfig

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host:1", "host:2"


@pytest.fixture
def run(researcher):
    now = timezone.now().isoformat()
    beats = {"explorer": {"at": now, "worker": A}, "explorer-1": {"at": now, "worker": B}}
    return Run.objects.create(name="shared", owner=researcher, status="running", config={}, heartbeats=beats)


def test_the_batch_is_picked_once_and_each_group_goes_to_one_explorer(run):
    a, b = DjangoStepClaims(run, A), DjangoStepClaims(run, B, "explorer-1")
    picks = []
    assert a.open(0, lambda: picks.append("a") or [5, 3, 9, 1]) == [5, 3, 9, 1]
    assert b.open(0, lambda: picks.append("b") or [7]) == [5, 3, 9, 1]  # read back, not picked again
    assert picks == ["a"]
    mine, theirs = a.claim(0), b.claim(0)
    assert sorted(mine + theirs) == [1, 3, 5, 9] and not set(mine) & set(theirs)
    a.done(0, mine, {"rollouts": 8})
    assert a.claim(0) == [] and b.claim(0) == theirs  # its own, not done yet: an explorer restarted in
    # place (after a database outage) takes them again


def test_the_share_follows_the_explorers_serving_the_run_now(run):
    a = DjangoStepClaims(run, A)
    Run.objects.filter(pk=run.pk).update(heartbeats={"explorer": run.heartbeats["explorer"]})  # A alone
    a.open(0, lambda: [1, 2, 3, 4])
    assert a.claim(0) == [1, 2, 3, 4]
    Run.objects.filter(pk=run.pk).update(heartbeats=run.heartbeats)  # B joins
    a.open(1, lambda: [1, 2, 3, 4])
    assert a.claim(1) == [1, 2]  # half: B takes the rest


def test_two_explorers_claiming_at_once_never_share_a_group(run):
    DjangoStepClaims(run, A).open(0, lambda: list(range(40)))
    got = {A: [], B: []}

    def take(worker):
        try:
            claims = DjangoStepClaims(run, worker, {A: "explorer", B: "explorer-1"}[worker])
            while ids := claims.claim(0):
                got[worker] += ids
                claims.done(0, ids, {"rollouts": 4})
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(worker,)) for worker in (A, B)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got[A] + got[B]) == list(range(40))


def test_two_explorers_of_one_worker_process_claim_apart(run):
    """Embedded, every explorer is a thread of the one worker process: same worker id, two duties."""
    one_worker = {duty: {**beat, "worker": A} for duty, beat in run.heartbeats.items()}
    Run.objects.filter(pk=run.pk).update(heartbeats=one_worker)
    a, b = DjangoStepClaims(run, A, "explorer"), DjangoStepClaims(run, A, "explorer-1")
    a.open(0, lambda: [1, 2, 3, 4])
    assert a.claim(0) == [1, 2] and b.claim(0) == [3, 4]
    assert a.claim(0) == [1, 2]  # its own again (not done), never the other's
    assert ExplorerGroup.objects.get(task_id=3).worker == f"explorer-1@{A}"


def test_a_dead_explorers_groups_go_back_to_the_pool(run):
    a, b = DjangoStepClaims(run, A), DjangoStepClaims(run, B, "explorer-1")
    a.open(0, lambda: [1, 2])
    assert a.claim(0) == [1] and b.claim(0) == [2]  # a share each: the step's groups over 2 explorers
    b.done(0, [2], {"rollouts": 4})
    assert b.claim(0) == []  # group 1 is A's, and A is alive
    Run.objects.filter(pk=run.pk).update(heartbeats={"explorer-1": run.heartbeats["explorer-1"]})  # A is gone
    assert b.claim(0) == [1]


def test_exactly_one_explorer_finishes_a_step_once_every_group_is_done(run):
    a, b = DjangoStepClaims(run, A), DjangoStepClaims(run, B, "explorer-1")
    a.open(3, lambda: [1, 2])
    a.claim(3), b.claim(3)
    finished_by = []
    a.done(3, [1], {"rollouts": 4})
    assert not a.finish(3, lambda parts: finished_by.append(("a", parts)))  # group 2 is still B's
    b.done(3, [2], {"rollouts": 4})
    assert b.finish(3, lambda parts: finished_by.append(("b", parts)))
    assert a.finish(3, lambda parts: finished_by.append(("a", parts)))  # finished: True, and not run again
    assert finished_by == [("b", [{"rollouts": 4, "worker": f"explorer@{A}", "explorer": "explorer"},
                                  {"rollouts": 4, "worker": f"explorer-1@{B}", "explorer": "explorer-1"}])]
    assert ExplorerStep.objects.get(run=run, step=3).finished_at is not None


def test_a_failed_finish_leaves_the_step_to_finish_again(run):
    a = DjangoStepClaims(run, A)
    a.open(0, lambda: [1])
    a.claim(0)
    a.done(0, [1], {"rollouts": 4})

    def broken(parts):
        raise RuntimeError("the metrics store is down")

    with pytest.raises(RuntimeError):
        a.finish(0, broken)
    assert ExplorerStep.objects.get(run=run, step=0).finished_at is None
    assert a.finish(0, lambda parts: None)


# ---- adding and removing explorers while the run trains --------------------------------------------


@pytest.fixture
def sent(monkeypatch):
    """The duties supervision hands to workers (the workers themselves: tests/workers/test_explorers.py)."""
    duties = []
    monkeypatch.setattr(supervision, "enqueue", lambda name, run_id, duty, queue, **_: duties.append((duty, queue)))
    return duties


def shared_run(make_run, engine_num=2, sync="checkpoint", status="running"):
    config = RunConfig.from_dict({**preset_config("quick-demo"), "synchronizer": {"method": sync},
                                  "explorer": {"engine_num": 1}}).to_dict()
    config["explorer"]["engine_num"] = engine_num
    return make_run(status=status, config=config)


def test_explorers_are_added_and_removed_from_the_run_page(researcher_client, make_run, sent,
                                                           django_capture_on_commit_callbacks):
    run = shared_run(make_run)
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'name="engine_num" value="2"' in page and reverse("run-explorers", args=[run.pk]) in page
    with django_capture_on_commit_callbacks(execute=True):
        researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "4"})
    run.refresh_from_db()
    assert run.config["explorer"]["engine_num"] == 4
    assert sent == [("explorer-2", "explore"), ("explorer-3", "explore")]  # the new ones, not the two serving it
    assert duties.duties_of_run(run) == ("explorer", "explorer-1", "explorer-2", "explorer-3", "trainer")

    run.heartbeats = {**run.heartbeats, "explorer-3": {"at": timezone.now().isoformat(), "worker": "w3"}}
    run.save()
    researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "3"})
    run.refresh_from_db()
    assert run.config["explorer"]["engine_num"] == 3 and len(sent) == 2
    # explorer-3's worker finds at its next check that it is no longer one of the run's, and stops.
    with pytest.raises(holding.DutyLost, match="explorer-3 is no longer one of its duties"):
        holding.wait_while_paused(run, "explorer-3", "w3")


@pytest.mark.parametrize("sync, status, says", [
    # It said "set mode 'both' and synchronizer.method 'checkpoint'", which a launched run cannot do.
    ("memory", "running", "explorer.engine_num: synchronizer.method &#x27;memory&#x27; runs the explorer inside the "
                          "trainer&#x27;s worker, and a launched run keeps its mode and sync method: Launch again, "
                          "with synchronizer.method &#x27;checkpoint&#x27;, for a run whose explorers are added and "
                          "removed while it trains"),
    ("nccl", "running", "synchronizer.method &#x27;nccl&#x27; sends the weights to a group of a fixed size"),
    ("checkpoint", "completed", "is completed: explorers are added or removed while it runs or is paused"),
])
def test_a_count_the_run_cannot_take_is_refused_and_changes_nothing(researcher_client, make_run, sent, sync, status,
                                                                    says):
    run = shared_run(make_run, engine_num=1, sync=sync, status=status)
    response = researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "2"}, follow=True)
    assert says in response.content.decode()
    run.refresh_from_db()
    assert run.config["explorer"]["engine_num"] == 1 and sent == []


def test_a_run_in_one_worker_says_it_is_launched_again_to_add_explorers(make_run, sent):
    demo = preset_config("quick-demo")  # its eval_interval and trainer settings have no effect in mode explore
    explorer = {key: value for key, value in demo["explorer"].items() if key != "eval_interval"}
    trainer = {"total_steps": demo["trainer"]["total_steps"]}
    config = {**demo, "mode": "explore", "explorer": explorer, "trainer": trainer}
    run = make_run(status="running", config=RunConfig.from_dict(config).to_dict())
    with pytest.raises(ConfigError) as refused:
        supervision.set_explorers(run, 2)
    assert refused.value.errors[0].message.startswith(
        "mode 'explore' runs no explorers in workers of their own, and a launched run keeps its mode and sync method: "
        "Launch again, with mode 'both' and synchronizer.method 'checkpoint',")
    assert supervision.set_explorers(run, 1).config["explorer"]["engine_num"] == 1 and sent == []  # no change


@pytest.mark.parametrize("typed", ["1_0", "\uff11", "+2", "2.0", "-1", "99999999999999999999999", "two"])
def test_a_count_not_in_plain_digits_is_refused_as_everywhere_else(researcher_client, make_run, sent, typed):
    """int() read "1_0" as 10 and a full-width "１" as 1 (apps.core.numbers.whole_number refuses both)."""
    run = shared_run(make_run)
    response = researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": typed}, follow=True)
    assert f"explorer.engine_num: {typed!r} is not a whole number: type the explorers wanted in digits 0-9, e.g. 2" \
        in response.content.decode().replace("&#x27;", "'")
    run.refresh_from_db()
    assert run.config["explorer"]["engine_num"] == 2 and sent == []
    blank = researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": " "}, follow=True)
    assert "explorer.engine_num: type how many explorers the run should have, e.g. 2" in blank.content.decode()


def test_only_the_owner_or_a_curator_changes_the_explorers(client, annotator_client, make_run, sent, researcher):
    from apps.accounts.roles import RESEARCHER
    from apps.accounts.services import create_user

    run = shared_run(make_run)
    other = create_user("other", "pw-for-tests-123", roles=(RESEARCHER,))
    client.force_login(other)
    assert client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "3"}).status_code == 403
    assert annotator_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "3"}).status_code == 403
    run.refresh_from_db()
    assert run.config["explorer"]["engine_num"] == 2 and sent == []
