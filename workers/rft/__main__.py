"""Headless runs: `python -m workers.rft run CONFIG.yaml` prints one line per step.

    python -m workers.rft run workers/rft/examples/tiny_grpo.yaml [--work-dir DIR] [--resume CHECKPOINT]
    python -m workers.rft install tiny|smollm2-135m     build or install a built-in model into the data dir
"""
import argparse
import sys
import time
from pathlib import Path

from .config import ConfigError, load_config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.rft")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a config with in-memory stores")
    run.add_argument("config")
    run.add_argument("--work-dir", help="checkpoints and weight versions (default: <data dir>/runs/<config>-<time>)")
    run.add_argument("--resume", help="a checkpoint directory of an earlier run of this config")
    install = commands.add_parser("install", help="build or install a built-in model")
    install.add_argument("name", choices=["tiny", "smollm2-135m"])
    args = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from . import models

    if args.command == "install":
        print(models.resolve_model_path(args.name))
        return 0
    try:
        config = load_config(Path(args.config))
    except ConfigError as err:
        print(f"invalid config {args.config}:\n{err}", file=sys.stderr)
        return 2

    from .loop import Loop, memory_stores

    work_dir = args.work_dir or models.data_dir() / "runs" / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    with Loop(config, memory_stores(config, echo=print), work_dir) as loop:
        if args.resume:
            loop.resume(args.resume)
        status = loop.run()
    print(f"{status}: {work_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
