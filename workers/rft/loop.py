"""A run in one process: build explorer, trainer and synchroniser from a RunConfig and storage
(any implementation of the protocols), then alternate explorer and trainer steps as the
synchronisation rules allow. The headless CLI runs it with in-memory stores; a Celery worker
runs it with the Postgres-backed ones.

Mode `both` in one process follows the synchronisation rules: explorer step t runs once the
version it needs (`required_version(t)`) is published; trainer step s + 1 runs once explorer step
s (the one it trains on) is done. At offset 0 that is sequential: the explorer steps while it
may, otherwise the trainer steps (and publishes every `interval` steps). From offset 1 on, the
explorer runs in a background thread beside the trainer, so a step costs max(explore, train)
rather than their sum; on CPU each thread gets its own share of torch's intra-op threads. The
trainer trains on the same batches as the sequential loop whenever one explorer step fills a
trainer batch (filters that drop rollouts can make a batch reach into the next explorer step,
which the sequential loop always has ready and the overlapped one may not yet).

should_stop() is asked between steps and, every few seconds, inside an explorer step by its long
loops (stopping.py): a stop there abandons the step unstored and ends the run as a stop between
steps does, with a checkpoint to resume from; the resumed run replays that step.
"""
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .activity import EXPLORER, TRAINER, Activity
from .algorithms import resolve
from .config_rules import waiting_for_data
from .engines import TransformersEngine, build_engine
from .experience import EXPERT_GROUP
from .explorer import Explorer
from .explorer_thread import ExplorerThread
from .loop_checkpoints import Checkpointing
from .memory import memory_stores
from .models import add_lora, load_critic, load_policy, load_reference, load_tokenizer, pick_device, pick_dtype
from .protocols import Stores
from .rewards import ReadLimits, build_reward
from .sampling import empty_batch_why
from .stopping import StopRequested, stoppable
from .synchronizer import Synchronizer
from .trainer import Trainer
from .workflows import WORKFLOWS, rollout_tokens

log = logging.getLogger(__name__)
DATA_WAIT_S = 1.0  # how often a headless trainer with nothing to train on looks again (the web app's: holding.pause)


def components_of(config) -> tuple[str, ...]:
    """The components (explorer, trainer) a run's mode needs."""
    return {"both": (EXPLORER, TRAINER), "explore": (EXPLORER,), "bench": (EXPLORER,), "train": (TRAINER,)}[config.mode]


def build_trainer(config, tokenizer, buffer=None, metrics=None, ranks=None) -> Trainer:
    """The run's trainer with its models (reference and critic where the algorithm needs them).
    A follower rank (distributed.py) builds it with no stores: it only runs what the leader sends.
    With model.lora the policy gets adapters, and its base (adapters off) is the reference unless
    model.ref_path names another model. The critic is always trained in full."""
    spec, model, device = resolve(config), config.model, pick_device(config.model.device)
    policy = load_policy(model.path, device)
    if model.lora is not None:
        policy = add_lora(policy, model.lora)
    separate_reference = spec.needs_reference and (model.lora is None or model.ref_path is not None)
    return Trainer(
        config,
        policy,
        tokenizer,
        buffer,
        metrics,
        reference=load_reference(model.ref_path or model.path, device) if separate_reference else None,
        critic=load_critic(model.critic_path or model.path, device) if spec.needs_critic else None,
        ranks=ranks,
    )


def follow(config, ranks) -> None:
    """A follower rank of the run's trainer: build it, run the leader's commands until stop."""
    torch.manual_seed(config.seed)
    build_trainer(config, load_tokenizer(config.model.path), ranks=ranks).follow()


def run_rank(ranks, config, work_dir: str | Path, resume: str | None = None) -> str | None:
    """One rank of a headless run (ranks None: the only one), in-memory stores: rank 0 runs the
    loop and returns its status; the others follow its trainer. (Here, not in __main__: spawned
    ranks import it by its module's name.)"""
    if ranks is not None and not ranks.is_leader:
        follow(config, ranks)
        return None
    with Loop(config, memory_stores(config, echo=print), work_dir, ranks=ranks) as loop:
        if resume:
            loop.resume(resume)
        return loop.run()


class Loop(Checkpointing):
    """Explorer and trainer of a run. `components` limits this process to one of them when the other
    runs elsewhere (checkpoint sync): see `run_explorer` and `run_trainer`. With `ranks`
    (distributed.Ranks, trainer.strategy 'ddp' or 'fsdp') this is the leader rank: its followers run
    `follow` and are released by close()."""

    def __init__(self, config, stores: Stores, work_dir: str | Path, components: tuple[str, ...] | None = None,
                 clock: Callable[[], float] = time.monotonic, ranks=None):
        components = components or components_of(config)
        self.clock = clock  # seconds, for trainer.save_interval_s
        self._saved = (0, clock())  # (trainer step, clock) of the last checkpoint, or of the start
        torch.manual_seed(config.seed)
        self.config = config
        self.stores = stores
        self.work_dir = Path(work_dir)
        self.spec = resolve(config)
        model = config.model
        device = pick_device(model.device)
        tokenizer = load_tokenizer(model.path)
        sync = config.synchronizer
        self.sync = Synchronizer(
            sync.method, sync.interval, sync.offset,
            directory=self.work_dir / "versions" if sync.method == "checkpoint" else None,
            tokenizer=tokenizer, group=stores.weight_group, timeout_s=sync.timeout_s, verify_every=sync.verify_every,
            device=device,
        )

        engine = None
        if EXPLORER in components:
            rollout_model = load_policy(model.path, device, pick_dtype(device, model.dtype))
            # vLLM's context was min(max_position_embeddings, 2,048) whatever the config asked:
            # it cut longer answers short without a word and refused longer prompts mid-run.
            engine = build_engine(config.explorer.engine, rollout_model, tokenizer, seed=config.seed,
                                  max_model_len=rollout_tokens(config))
        # A judge or reward model reads of a task what the policy does, of a response what it may write.
        limits = ReadLimits(prompt_tokens=model.max_prompt_tokens, response_tokens=config.explorer.max_new_tokens)
        self.workflow = WORKFLOWS.get(config.explorer.workflow)(
            engine,
            build_reward(config.explorer.reward_fn, limits),
            tokenizer=tokenizer,
            system_prompt=config.explorer.system_prompt,
            use_chat_template=config.explorer.use_chat_template,
            max_prompt_tokens=model.max_prompt_tokens,
            max_response_tokens=config.explorer.max_new_tokens,
            **config.explorer.workflow_args,
        )
        self.explorer = None
        if engine is not None:
            self.explorer = Explorer(
                config, self.workflow, stores.task_source, stores.buffer, stores.metrics, stores.eval_source,
                claims=stores.claims,
            )

        self.activity = Activity()  # what each part does now, for the run page
        self.stopping = None  # should_stop, for the waits inside a step (_stop_inside_steps)
        self.skipped_steps = 0  # steps that counted with nothing to train on (Trainer.waits_for_data); in checkpoints
        self._waiting_for_data = False  # the trainer's last try found nothing, and it waits (train)
        self._explorer_thread = None  # while run() overlaps the explorer with the trainer
        self.trainer = None
        if TRAINER in components:
            self.trainer = build_trainer(config, tokenizer, stores.buffer, stores.metrics, ranks)
            if self.spec.uses_expert:
                self.seed_expert_data()

    def seed_expert_data(self) -> int:
        """Write the expert taskset's answers into the buffer as expert experiences, once, and
        copy the imported expert dataset in. Only the taskset's rows count as done: not human
        edits, nor the rollouts promote_to_expert copied before the trainer started (a split
        run's explorer may start first: MIX then trained on the 8 promoted rows alone, not the
        taskset's 50)."""
        source, buffer, seeded = self.stores.expert_source, self.stores.buffer, 0
        if source is not None and not buffer.count(sources=("expert",), group_prefix=EXPERT_GROUP):
            seeded += buffer.write([self.workflow.expert_experience(task) for task in source.tasks()])
        if self.stores.expert_data is not None:
            seeded += self.stores.expert_data.seed(self.workflow.written_experience)
        return seeded

    def close(self) -> None:
        """Free what outlives a run in a long-lived worker: the rollout engine's processes (vLLM),
        the follower ranks."""
        self.sync.close()
        if self.trainer is not None:
            self.trainer.release_ranks()
        engine = self.workflow.engine
        if engine is not None and hasattr(engine, "close"):
            engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- running ---------------------------------------------------------------------------------

    def run(self, should_stop=None, overlap: bool = True, wait=None) -> str:
        """Run to trainer.total_steps; returns 'completed', or 'stopped' when should_stop() said so
        (checked after every trainer step and inside explorer steps; a checkpoint is saved either
        way). `overlap=False` keeps the explorer in this thread at any offset (tests compare the
        two loops). `wait()`: a pause while the trainer has nothing to train on (train)."""
        should_stop = should_stop or (lambda: False)
        wait = wait or (lambda: time.sleep(DATA_WAIT_S))
        self._stop_inside_steps(should_stop)
        try:
            return self._run(should_stop, overlap, wait)
        except StopRequested:  # inside an explorer step (an overlapped explorer's thread has ended) or a rating wait
            self._save_on_stop()
            return "stopped"

    def _stop_inside_steps(self, should_stop) -> None:
        """Hand should_stop to the waits inside a step: the explorer's long loops, and the trainer's
        wait for ratings (feedback.rating_wait_s, up to an hour: the buffer's sample checks it)."""
        self.stopping = should_stop
        if self.explorer is not None:
            self.explorer.stopping = should_stop

    def _run(self, should_stop, overlap: bool, wait) -> str:
        if self.config.mode == "bench":
            self.bench()
            return "completed"
        if self.config.mode == "explore":
            return self._explore_only(should_stop)
        evaluating = self.explorer is not None and self.config.explorer.eval_interval > 0
        if evaluating and self.explorer.step == 0:
            self.evaluate()
        if overlap and self.explorer is not None and self.sync.offset >= 1:
            outcome = self._run_overlapped(should_stop, wait)
        else:
            outcome = self._run_sequential(should_stop, wait)
        if outcome == "stopped":
            return outcome
        if evaluating:  # the final weights, which no explorer step has pulled yet
            self.sync.pull(self.explorer.engine, self.sync.latest_version())
            self.evaluate()
        self.save_final()
        self.report_skipped_steps()
        return "completed"

    def _run_sequential(self, should_stop, wait) -> str:
        total = self.config.trainer.total_steps
        while self.trainer.step < total:
            explorer = self.explorer
            if explorer is not None and self.sync.latest_version() >= self.sync.required_version(explorer.step):
                self.explore()
                continue
            if explorer is not None:  # the engine's big idle caches give way to the trainer's step
                explorer.engine.free_idle_caches()
            trained = self.train()
            if should_stop() and self.trainer.step < total:
                self._save_on_stop()
                return "stopped"
            if trained is None:
                if explorer is not None:  # it said it was rolling out the step it finished
                    needed = self.sync.required_version(explorer.step)
                    self.activity.doing(EXPLORER, f"waiting for the trainer's v{needed} (explorer step "
                                                  f"{explorer.step + 1})")
                wait()
        return "completed"

    def _run_overlapped(self, should_stop, wait) -> str:
        """The trainer in this thread, the explorer in an ExplorerThread beside it."""
        total = self.config.trainer.total_steps
        threads_before = torch.get_num_threads()
        explorer_threads, trainer_threads = self.torch_thread_shares()
        # Explorer steps needing the version the last trainer step publishes would train nothing
        # (the sequential loop does not run them either).
        explorer = ExplorerThread(self, last_version=(total - 1) // self.sync.interval, torch_threads=explorer_threads)
        self._explorer_thread = explorer
        explorer.start()
        try:
            if trainer_threads:
                torch.set_num_threads(trainer_threads)
            while self.trainer.step < total:
                needed = self.explorer_steps_needed()
                explorer.wait_until(lambda needed=needed: self.explorer.step >= needed)
                trained = self.train()
                if should_stop() and self.trainer.step < total:
                    explorer.finish()
                    self._save_on_stop()
                    return "stopped"
                if trained is None:
                    wait()
                    continue
                # Only now: no explorer step starts on a version published just before a stop,
                # nor while the run is paused (should_stop() waits then).
                explorer.allow(self.sync.latest_version())
            explorer.finish()
            return "completed"
        finally:
            explorer.stop()  # on an error here: the explorer finishes its step, starts no other
            self._explorer_thread = None
            if trainer_threads:
                torch.set_num_threads(threads_before)

    def explorer_steps_needed(self) -> int:
        """The explorer steps done before the next trainer step may start: the one it trains on
        (trainer step s + 1 trains on explorer step s, as in run_trainer) and, with
        buffer.max_staleness, the first step whose rollouts are fresh enough for it."""
        return self._explorer_steps_before(self.trainer.step, self.sync.latest_version())

    def explorer_steps_total(self) -> int:
        """The explorer steps a split run rolls out: those its trainer's last step waits for (one
        more than the steps with max_staleness 0 and offset 1)."""
        total = self.config.trainer.total_steps
        return max(total, self._explorer_steps_before(total - 1, (total - 1) // self.sync.interval))

    def _explorer_steps_before(self, trainer_step: int, version: int) -> int:
        if not self.spec.uses_rollouts:
            return 0
        needed = trainer_step + 1
        max_staleness = self.config.buffer.max_staleness
        if max_staleness is not None and (oldest_usable := version - max_staleness) > 0:
            first_fresh_step = oldest_usable * self.sync.interval + self.sync.offset
            needed = max(needed, first_fresh_step + 1)
        return needed

    def torch_thread_shares(self) -> tuple[int | None, int | None]:
        """(explorer, trainer) torch intra-op threads while they overlap: the cores split between
        them when both compute on this CPU, None (leave as is) otherwise."""
        engine = self.explorer.engine
        on_cpu = (
            isinstance(engine, TransformersEngine) and engine.device.type == "cpu" and self.trainer.device.type == "cpu"
        )
        if not on_cpu:
            return None, None
        n = torch.get_num_threads()
        return max(1, n // 2), max(1, n - n // 2)

    def run_explorer(self, should_stop, wait, trained=lambda: False, evaluates_ends: bool = False) -> str:
        """The explorer alone, its trainer in another process: each step waits until the version
        it needs is published. Runs until should_stop() (the trainer has finished, or a stop);
        past the last step the trainer trains on it only waits (an nccl explorer still takes the
        versions the trainer sends). The run's first explorer (`evaluates_ends`) also evaluates,
        with explorer.eval_interval, what `run` evaluates at the ends: the starting weights before
        step 0 and, once `trained()` says the trainer took its last step, the final version (the
        trainer waits for it: supervision.wait_for_final_eval)."""
        self._stop_inside_steps(should_stop)
        try:
            return self._run_explorer(should_stop, wait, trained, evaluates_ends)
        except StopRequested:
            return "stopped"  # the explorer keeps nothing to save: its stored steps are where it resumes

    def _run_explorer(self, should_stop, wait, trained, evaluates_ends: bool) -> str:
        total = self.explorer_steps_total()
        ends = evaluates_ends and self.config.explorer.eval_interval > 0
        if ends and self.explorer.step == 0:
            while self.sync.latest_version() < 0:  # nccl: the trainer's weights, sent once all explorers joined
                if should_stop():
                    return "stopped"
                wait()
            # The engine holds version 0, the run's starting weights, as it loaded them: no pull.
            # (nccl's pull loads the newest version received, which another explorer's first step
            # and the trainer's may have made v1 already: one CI run evaluated v1 as the start.)
            self.evaluate()
        final = self.final_version() if ends else None
        while not should_stop():
            if self.explorer.step >= total:  # the trainer's last step trains on what is rolled out
                if final is not None and trained() and self.sync.latest_version() >= final:
                    self.sync.pull(self.explorer.engine, final)
                    self.evaluate()
                    final = None
                    continue
                wait()
                continue
            if self.sync.latest_version() < (needed := self.sync.required_version(self.explorer.step)):
                step = self.explorer.step + 1
                self.activity.doing(EXPLORER, f"waiting for the trainer's v{needed} (explorer step {step})")
                wait()
                continue
            if self.explore() is None:  # other explorers still roll out this step's last groups
                wait()
        return "stopped"

    def final_version(self) -> int:
        """The last version the trainer publishes: that of its last step a multiple of the sync interval."""
        return self.config.trainer.total_steps // self.sync.interval

    def run_trainer(self, should_stop, explored_steps, wait) -> str:
        """The trainer alone, its explorer in another process: trainer step s + 1 waits until
        explorer step s is done (`explored_steps()` counts them) and, with buffer.max_staleness,
        until rollouts fresh enough for it are, as in the single-process loop (explorer_steps_needed;
        waiting for step s alone, a quick trainer skipped every step after the first at staleness 0)."""
        self._stop_inside_steps(should_stop)
        try:
            return self._run_trainer(should_stop, explored_steps, wait)
        except StopRequested:  # in a step's wait for ratings: the step is not counted
            self._save_on_stop()
            return "stopped"

    def _run_trainer(self, should_stop, explored_steps, wait) -> str:
        total = self.config.trainer.total_steps
        while not self.sync.ready():  # nccl: the explorers join the weight group as their engines come up
            if should_stop():
                return "stopped"
            wait()
        if self.sync.method == "nccl" and not self.sync.has_sent():  # the explorers start from the trainer's weights
            self.sync.publish(self.trainer.policy, self.trainer.step, self.trainer.full_state()["policy"])
        while self.trainer.step < total:
            if explored_steps() < (needed := self.explorer_steps_needed()):
                self.activity.doing(TRAINER, f"waiting for explorer step {needed}")
                self.sync.check()  # an explorer that died meanwhile breaks the weight group: say so now
                if should_stop():
                    self.save_for_resume()
                    return "stopped"
                wait()
                continue
            trained = self.train()
            if should_stop() and self.trainer.step < total:
                self._save_on_stop()
                return "stopped"
            if trained is None:
                wait()
        self.save_final()
        self.report_skipped_steps()
        return "completed"

    def explore(self) -> dict | None:
        """An explorer step (or, shared with other explorers, a part of one: Explorer.explore_step)
        with the version it needs; then the eval, if due, by the explorer that finished the step."""
        step = self.explorer.step
        started = time.perf_counter()
        self.sync.pull(self.explorer.engine, self.sync.required_version(step))
        self.explorer.sync_seconds += time.perf_counter() - started  # in the step's metrics
        self.activity.doing(EXPLORER, f"rolling out step {step + 1} with v{self.sync.required_version(step)}")
        metrics = self.explorer.explore_step()
        interval = self.config.explorer.eval_interval
        if interval and metrics and self.explorer.step != step and self.explorer.step % interval == 0:
            self.evaluate()
        return metrics

    def evaluate(self) -> dict:
        self.activity.doing(EXPLORER, f"evaluating after explorer step {self.explorer.step}")
        return self.explorer.evaluate()

    def train(self) -> dict | None:
        """A trainer step; None where it found nothing to train on and waits for data (the caller
        waits a while and tries again)."""
        def publish():  # after the update, inside the step (its sync_seconds)
            if self.sync.is_publish_step(self.trainer.step):
                self.sync.publish(self.trainer.policy, self.trainer.step, self.trainer.full_state()["policy"])

        def training():
            self.activity.doing(TRAINER, f"training step {self.trainer.step + 1}")

        # While it waits, the line says so, and for how long, until a try finds data: a 159 s step on
        # an annotator's long edit said "waiting for data" throughout.
        if not self._waiting_for_data:
            training()
        with stoppable(self.stopping):  # a stop while the step waits for ratings: StopRequested, no step
            metrics = self.trainer.train_step(current_version=self.sync.latest_version(), publish=publish,
                                              sampled=training if self._waiting_for_data else None)
        self._waiting_for_data = metrics is None
        if metrics is None:  # no step (Trainer.waits_for_data): the line says what it waits for, not "training"
            waits_for = waiting_for_data(self.config, trained=self.trainer.step > 0)
            self.activity.doing(TRAINER, f"waiting for data: {waits_for}")
            return None
        self.skipped_steps += "skipped" in metrics
        if self.checkpoint_due():
            self.save()
        return metrics

    def report_skipped_steps(self) -> None:
        """At the end, how many trainer steps found nothing to train on, as a warning: a run of 100
        such steps read as plain "completed", model v100 and checkpoints saved."""
        skipped, total = self.skipped_steps, self.config.trainer.total_steps
        why = empty_batch_why(self.spec.uses_rollouts)
        if skipped == total:
            log.warning("trained nothing: all %s trainer steps found nothing to train on: %s", total, why)
        elif skipped:
            log.warning("%s of %s trainer steps found nothing to train on: %s", skipped, total, why)

    def _explore_only(self, should_stop) -> str:
        """Rollouts only (e.g. to collect data), with the newest published version if any."""
        while self.explorer.step < self.config.trainer.total_steps:
            self.sync.pull(self.explorer.engine, self.sync.latest_version())
            self.explorer.explore_step()
            if should_stop():
                return "stopped"
        return "completed"

    def bench(self) -> list[dict]:
        """Evaluate the starting model and every published version on the eval taskset."""
        results = [self.explorer.evaluate()]
        if self.sync.method == "checkpoint":
            for version in range(1, self.sync.latest_version() + 1):
                if self.sync.version_dir(version).exists():
                    self.sync.pull(self.explorer.engine, version)
                    self.explorer.step = version
                    results.append(self.explorer.evaluate())
        return results
