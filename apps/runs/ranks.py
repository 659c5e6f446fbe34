"""The trainer's ranks on workers (trainer.strategy 'ddp' or 'fsdp'): the process holding the
trainer duty is rank 0 and starts the others of its machine as `python -m workers.rft follow`
processes (trainer_ranks); each further machine is a duty of its own, trainer-node-K, whose
worker starts that machine's ranks in each group rank 0 opens (serve_node). See supervision's
docstring for how a broken group is restarted."""
import json
import logging
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

from django.conf import settings

from . import duties, holding, services
from .duties import NODE_DUTY
from .holding import Stopped, pause, still_served
from .models import Run

log = logging.getLogger(__name__)
FOLLOWERS_EXIT_SECONDS = 10  # for released follower ranks to exit before they are killed
# torch holds one process group per process: one data-parallel trainer at a time in a worker
# process (an embedded server, or a threads pool, may serve several runs at once).
TRAINER_GROUP = threading.Lock()


@contextmanager
def trainer_ranks(run: Run, config, duty: str, worker: str):
    """The trainer's ranks (distributed.Ranks) while the duty runs, with this process as rank 0
    and the others started here; None unless the duty holds a trainer of several ranks. On the way out
    (Loop.close has sent its followers stop, unless the group broke) the followers get
    FOLLOWERS_EXIT_SECONDS to exit, then are killed, and the group goes.

    The group's store listens on 127.0.0.1 when every rank is on this machine, else on
    RFTWEB_NODE_ADDRESS alone; its ranks prove they know the run's secret (Run.secret) before
    they join. Waiting for ranks that do not come ends as soon as the run is no longer served
    (Stopped): a stop reaches a leader waiting for 999 machines."""
    trainer = config.trainer
    if trainer.strategy == "single" or duties.is_explorer(duty):
        yield None
        return
    import torch
    import torch.distributed as dist

    from workers.rft.distributed import JoinCancelled, RankFailure, free_port, join
    from workers.rft.models import pick_device

    device = pick_device(config.model.device).type
    local_size, world_size = trainer.num_processes, trainer.num_processes * trainer.num_nodes
    if device == "cuda" and torch.cuda.device_count() < local_size:
        raise ValueError(f"trainer.num_processes is {local_size}: {local_size} ranks need as many GPUs; "
                         f"this worker's machine has {torch.cuda.device_count()}")
    if not TRAINER_GROUP.acquire(blocking=False):
        raise RuntimeError("this worker process already trains a data-parallel run (one per process): resume this "
                           "run once that one has ended, or serve runs from Celery workers (a process each)")
    threads = torch.get_num_threads()  # join shares the cores out between the ranks
    host = settings.RFTWEB_NODE_ADDRESS if trainer.num_nodes > 1 else "127.0.0.1"
    port = free_port(host)
    followers, ranks, generation = [], None, None
    try:
        for rank in range(1, local_size):
            followers.append(start_follower(config, rank, world_size, f"{host}:{port}", device, run.secret))
        log.info("run %s (%s): trainer rank 0 is process %s, ranks 1..%s are processes %s", run.pk, duty,
                 os.getpid(), local_size - 1, [proc.pid for proc in followers])
        if trainer.num_nodes > 1:
            generation = services.open_rendezvous(run, "trainer", host, port, world_size)
        try:
            ranks = join(0, world_size, 0, (host, port, True), trainer.collective_timeout_s, device,
                         local_world_size=local_size, secret=run.secret,
                         should_stop=lambda: not still_served(run, duty, worker))
        except JoinCancelled as err:
            raise Stopped(f"{err}: the run is {run.status}") from err
        except (RuntimeError, dist.DistError) as err:
            exited = [f"rank {rank} exited with {proc.poll()}" for rank, proc in enumerate(followers, 1)
                      if proc.poll() is not None]
            if exited:
                raise RankFailure(f"{', '.join(exited)} before joining (the worker's log has its error)") from err
            if trainer.num_nodes > 1:
                raise RankFailure(
                    f"not every machine's ranks joined within {trainer.collective_timeout_s:g} s "
                    f"(trainer.collective_timeout_s): each of the trainer.num_nodes ({trainer.num_nodes}) needs a "
                    f"train worker free to serve it, reaching {host}:{port} "
                    "(RFTWEB_NODE_ADDRESS)") from err
            raise
        yield ranks
    finally:
        if generation is not None:
            services.close_rendezvous(run, "trainer", generation)
        end_followers(followers, at_once=ranks is None or ranks.failed)
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        TRAINER_GROUP.release()


def start_follower(config, rank: int, world_size: int, master: str, device: str, secret: str,
                   local_rank: int | None = None, local_size: int | None = None) -> subprocess.Popen:
    """A follower rank as a process of its own (not multiprocessing: a Celery pool process is
    daemonic, and may start no children that way); its output goes to the worker's log. On the
    leader's machine its local rank (its GPU) is its rank. The run's secret goes in its
    environment (not its command line, which every user of the machine can read)."""
    from workers.rft.distributed import SECRET_ENV

    local = [] if local_rank is None else ["--local-rank", str(local_rank), "--local-world-size", str(local_size)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.rft", "follow", "-", "--rank", str(rank), "--world-size", str(world_size),
         "--master", master, "--device", device, *local],
        stdin=subprocess.PIPE, cwd=settings.BASE_DIR, text=True, env={**os.environ, SECRET_ENV: secret},
    )
    with proc.stdin:
        proc.stdin.write(json.dumps(config.to_dict()))
    return proc


def end_followers(followers: list[subprocess.Popen], at_once: bool) -> None:
    """Wait for released followers to exit; kill the rest (at once: the group broke, a live
    follower may be stuck in a collective)."""
    deadline = time.monotonic() + (0 if at_once else FOLLOWERS_EXIT_SECONDS)
    for proc in followers:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if not at_once:
                log.warning("follower rank process %s did not exit when released; killing it", proc.pid)
            proc.kill()
            proc.wait()


def serve_node(run: Run, duty: str, worker: str) -> str:
    """Machine K of a trainer on several (duty trainer-node-K): start its ranks (K*P .. K*P+P-1,
    P = trainer.num_processes) in each group rank 0 opens, once per group, until the run is no
    longer served: on a stop it leaves within FOLLOWERS_EXIT_SECONDS (its followers' time to take
    rank 0's stop), whether or not a group ever formed. A group that rank 0 closed or replaced
    takes its ranks with it."""
    from workers.rft.models import pick_device

    from .config_keys import stored_config

    config = stored_config(run.config)
    node, local_size = int(duty.removeprefix(NODE_DUTY)), config.trainer.num_processes
    device = pick_device(config.model.device).type
    served, followers = None, []
    try:
        while True:
            if not still_served(run, duty, worker):
                # Rank 0 sends its followers stop once its last step and checkpoint are done:
                # they get FOLLOWERS_EXIT_SECONDS for that, not the run's whole life.
                end_followers(followers, at_once=False)
                followers = []
                return run.status
            run.refresh_from_db(fields=["rendezvous"])
            group = run.rendezvous.get("trainer", {})
            if followers and (group.get("generation") != served or "host" not in group):
                end_followers(followers, at_once=False)  # released by a stop, or left in a broken group
                followers = []
            if not followers and "host" in group and group["generation"] != served:
                served = group["generation"]
                master = f"{group['host']}:{group['port']}"
                followers = [start_follower(config, node * local_size + i, group["world_size"], master, device,
                                            run.secret, local_rank=i, local_size=local_size)
                             for i in range(local_size)]
                log.info("run %s (%s): ranks %s..%s joining group %s at %s", run.pk, duty, node * local_size,
                         (node + 1) * local_size - 1, served, master)
                holding.mark_started(run, duty, worker)
            pause()
    finally:
        end_followers(followers, at_once=True)
