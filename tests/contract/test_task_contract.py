"""What workers/rft/protocols.py promises of a TaskSource's draws and stats (what a run's task
selector learned), asserted of the in-memory source and the Django one on this run's database:
a selection reads both as one finished step wrote them (workers/rft/task_selectors.py)."""
from workers.rft.experience import Task, TaskKey, TaskStats
from workers.rft.task_selectors import DifficultyBased


def three(make_task_source):
    return make_task_source([Task(None, f"{i}+1?", str(i + 1), priority=float(i == 2)) for i in range(3)])


def test_a_task_never_drawn_has_no_stats_and_keys_come_in_taskset_order(make_task_source):
    source = three(make_task_source)
    tasks = source.tasks()
    assert [task.stats for task in tasks] == [None, None, None]
    added = source.add_tasks([Task(None, "9+1?", "10")])[0]
    assert added.times_sampled == 0 and added.stats is None
    assert [key.id for key in source.task_keys()] == [task.id for task in source.tasks()] == [
        *(task.id for task in tasks), added.id]  # a selector walking "in order" reads this one
    assert source.task_keys()[2] == TaskKey(tasks[2].id, 1.0, 0, None)


def test_a_finished_steps_draws_and_stats_are_read_back_together(make_task_source):
    source = three(make_task_source)
    a, b, c = (task.id for task in source.tasks())
    learned = {a: TaskStats(2.5, 5.5, 7, 0), b: TaskStats(8.0, 0.0, 7, 3)}
    source.mark_sampled([a, b, c], learned)  # c failed: drawn, nothing learned
    for read in (source.tasks(), source.task_keys(with_stats=True), source.tasks_with_ids([a, b, c])):
        assert [(task.times_sampled, task.stats) for task in read] == [(1, learned[a]), (1, learned[b]), (1, None)]
    # The default selector's pick asks for none (a query fewer).
    assert [(key.times_sampled, key.stats) for key in source.task_keys()] == [(1, None)] * 3
    # What a selector that retires solved tasks counts: b's three solved groups in a row.
    assert [source.count_solved(streak) for streak in (1, 3, 4)] == [1, 1, 0]
    source.mark_sampled([b], {b: TaskStats(8.0, 1.0, 8, 0)})  # a group that failed: b is back
    assert source.count_solved(1) == 0


def test_stats_stay_until_a_later_step_replaces_them(make_task_source):
    source = three(make_task_source)
    a, b, _ = (task.id for task in source.tasks())
    source.mark_sampled([a, b], {a: TaskStats(1.0, 7.0, 0), b: TaskStats(4.0, 4.0, 0)})
    source.mark_sampled([a, a])  # draws alone (the default selector): stats kept, each listing counted
    source.mark_sampled([b], {b: TaskStats(4.5, 11.5, 3, 0)})
    assert {task.id: (task.times_sampled, task.stats) for task in source.tasks()}[a] == (3, TaskStats(1.0, 7.0, 0))
    assert source.tasks_with_ids([b])[0].stats == TaskStats(4.5, 11.5, 3, 0)
    assert source.tasks_with_ids([b])[0].times_sampled == 2


def test_a_selector_picks_the_same_batch_from_either_store(make_task_source):
    """What the difficulty selector reads (draws, stats, priority, taskset order) arrives as it
    was written: its pick over the stored keys is its pick over what was written."""
    source = make_task_source([Task(None, f"q{i}", str(i)) for i in range(12)])
    stored = source.tasks()
    rates = {task.id: (i % 5) / 4 for i, task in enumerate(stored[:8])}
    source.mark_sampled(list(rates), {i: TaskStats(8 * r, 8 * (1 - r), 2, int(r == 1.0)) for i, r in rates.items()})
    chooser = DifficultyBased(0, 6, retire_after=1)
    picked = [task.id for task in chooser.select(source.task_keys(with_stats=True), 3)]
    written = [TaskKey(t.id, 0.0, int(t.id in rates), None if t.id not in rates else
                       TaskStats(8 * rates[t.id], 8 * (1 - rates[t.id]), 2, int(rates[t.id] == 1.0))) for t in stored]
    assert picked == [task.id for task in chooser.select(written, 3)]
    assert set(picked[:4]) == {task.id for task in stored[8:]}  # never drawn first
    assert stored[4].id not in picked  # solved by every rollout: retired
