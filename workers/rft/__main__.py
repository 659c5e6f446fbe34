"""Headless runs: `python -m workers.rft run CONFIG.yaml` prints one line per step.

    python -m workers.rft run workers/rft/examples/tiny_grpo.yaml [--work-dir DIR] [--resume CHECKPOINT]
    python -m workers.rft install tiny|smollm2-135m     build or install a built-in model into the data dir

With trainer.strategy 'ddp' the run starts trainer.num_processes ranks on this machine
(distributed.launch); rank 0 runs the loop and prints, the others train their share of each batch.
On several machines (trainer.num_nodes), torchrun starts the ranks, this module on every machine:

    torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m workers.rft run CONFIG.yaml

A Celery worker serving a ddp run is its rank 0 and starts the others as `follow` processes (its
pool processes are daemonic, and multiprocessing starts no children of those):

    python -m workers.rft follow CONFIG|- --rank R --world-size N --master HOST:PORT [--device cpu|cuda]
                                 [--local-rank L --local-world-size M]   (on a machine other than rank 0's)
"""
import argparse
import os
import sys
import threading
import time
from pathlib import Path

from .config import ConfigError, load_config
from .config_rules import data_issues


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.rft")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a config with in-memory stores")
    run.add_argument("config")
    run.add_argument("--work-dir", help="checkpoints and weight versions (default: <data dir>/runs/<config>-<time>)")
    run.add_argument("--resume", help="a checkpoint directory of an earlier run of this config")
    install = commands.add_parser("install", help="build or install a built-in model")
    install.add_argument("name", choices=["tiny", "smollm2-135m"])
    follow = commands.add_parser("follow", help="a follower rank of a trainer whose leader started it")
    follow.add_argument("config", help="the run's config file, or - to read it (YAML or JSON) from stdin")
    follow.add_argument("--rank", type=int, required=True)
    follow.add_argument("--world-size", type=int, required=True)
    follow.add_argument("--master", required=True, help="HOST:PORT of the store rank 0 serves")
    follow.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    follow.add_argument("--local-rank", type=int, help="its place (its GPU) on its machine (default: its rank)")
    follow.add_argument("--local-world-size", type=int, help="ranks on its machine (default: the world size)")
    args = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from . import models

    if args.command == "install":
        print(models.resolve_model_path(args.name))
        return 0
    try:
        config = load_config(sys.stdin.read() if args.config == "-" else Path(args.config))
    except ConfigError as err:
        print(f"invalid config {args.config}:\n{err}", file=sys.stderr)
        return 2

    if args.command == "follow":
        return follow_leader(config, args)
    if config.explorer.engine_num > 1:
        print(f"explorer.engine_num is {config.explorer.engine_num}: several explorers are workers of a run launched "
              "from the dashboard (Celery workers on queue explore, docs/scale.md); a headless run has one",
              file=sys.stderr)
        return 2
    if config.buffer.expert_dataset is not None:
        print("buffer.expert_dataset names imported expert data of the web app's buffer, which a headless run does not "
              "read: give it the expert answers as buffer.expert_taskset (a JSONL of tasks whose metadata holds "
              "expert_response, docs/data-formats.md)", file=sys.stderr)
        return 2
    if config.feedback.source_runs:
        print("feedback.source_runs names runs of the web app, whose human edits and preference pairs a headless run "
              "does not read: give it expert answers as buffer.expert_taskset (docs/data-formats.md)", file=sys.stderr)
        return 2
    starved = data_issues(config, web=False)  # as a launch on the web app refuses, less what only it holds
    if starved:
        print(f"invalid config {args.config}:\n{ConfigError(starved)}", file=sys.stderr)
        return 2
    if config.synchronizer.method == "nccl":
        print("synchronizer.method is nccl: it sends weights from a trainer to explorers that are workers of a run "
              "launched from the dashboard (docs/scale.md); a headless run holds both in one process: use memory",
              file=sys.stderr)
        return 2

    stem = f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    work_dir = str(args.work_dir or models.data_dir() / "runs" / stem)
    from .loop import run_rank

    trainer = config.trainer
    device_type = models.pick_device(config.model.device).type
    world_size = trainer.num_processes * trainer.num_nodes
    if trainer.strategy == "single":
        status = run_rank(None, config, work_dir, args.resume)
    elif "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: this process is one rank
        from .distributed import join_from_env

        if int(os.environ["WORLD_SIZE"]) != world_size:
            print(f"torchrun started {os.environ['WORLD_SIZE']} ranks; the config asks for {world_size} "
                  "(trainer.num_processes x trainer.num_nodes)", file=sys.stderr)
            return 2
        ranks = join_from_env(trainer.collective_timeout_s, device_type)
        status = run_rank(ranks, config, work_dir, args.resume)
        if not ranks.is_leader:
            return 0
    elif trainer.num_nodes > 1:
        print(f"trainer.num_nodes is {trainer.num_nodes}: start the run on every machine with\n"
              f"  torchrun --nnodes {trainer.num_nodes} --nproc-per-node {trainer.num_processes} "
              f"--rdzv-backend c10d --rdzv-endpoint HOST:PORT -m workers.rft run {args.config}", file=sys.stderr)
        return 2
    else:
        from .distributed import launch

        status = launch(run_rank, trainer.num_processes, config, work_dir, args.resume,
                        timeout_s=trainer.collective_timeout_s, device_type=device_type)[0]
    print(f"{status}: {work_dir}")
    return 0


def follow_leader(config, args) -> int:
    """One follower rank until its leader says stop."""
    import torch.distributed as dist

    from .distributed import join
    from .loop import follow

    end_with_leader()
    host, _, port = args.master.rpartition(":")
    local_rank = args.rank if args.local_rank is None else args.local_rank
    ranks = join(args.rank, args.world_size, local_rank, (host, int(port), False), config.trainer.collective_timeout_s,
                 args.device, local_world_size=args.local_world_size)
    try:
        follow(config, ranks)
    finally:
        dist.destroy_process_group()
    return 0


def end_with_leader() -> None:
    """Exit once the process that started this one is gone: a leader killed outright sends no
    stop, and a follower would wait a day (distributed.IDLE_TIMEOUT) for its next command."""
    leader = os.getppid()

    def watch():
        while os.getppid() == leader:
            time.sleep(1)
        print(f"follower {os.getpid()}: its leader {leader} is gone; exiting", file=sys.stderr)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="leader-watch").start()


if __name__ == "__main__":
    sys.exit(main())
