"""Engine tests: plain pytest, no database. Models are built into a per-session data dir."""
import os

import pytest
import torch


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """RFTWEB_DATA_DIR for the session, with the tiny model built once."""
    from transformers.utils import logging as hf_logging

    from workers.rft.models import resolve_model_path

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # A short name: vLLM's IPC sockets live under it (<dir>/vllm/ipc/<8>/<uuid4>, at most 107 bytes),
    # and xdist's basetemp is deeper (.../pytest-N/popen-gw1/).
    path = tmp_path_factory.mktemp("data")
    previous = os.environ.get("RFTWEB_DATA_DIR")
    os.environ["RFTWEB_DATA_DIR"] = str(path)
    resolve_model_path("tiny")
    yield path
    if previous is None:
        del os.environ["RFTWEB_DATA_DIR"]
    else:
        os.environ["RFTWEB_DATA_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_path(data_dir):
    return data_dir / "models" / "tiny"


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    from workers.rft.models import load_tokenizer

    return load_tokenizer(tiny_path)


@pytest.fixture
def tiny_model(tiny_path):
    from workers.rft.models import load_policy

    torch.manual_seed(0)
    return load_policy(tiny_path, torch.device("cpu"))


def make_config(**sections):
    """A RunConfig on the tiny model with small defaults; sections override per key."""
    from workers.rft.config import RunConfig

    data = {
        "seed": 0,
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 4},
        "explorer": {"batch_size": 4, "max_new_tokens": 4, "use_chat_template": False},
        "trainer": {"lr": 1e-3, "micro_batch_size": 8, "total_steps": 3},
        "buffer": {"taskset": "arithmetic:n=200,max_operand=9,ops=+,split=train"},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return RunConfig.from_dict(data)
