"""Issue #42, finding 2: docs/scale.md's command that adds a worker beside `make demo`'s full stack
runs as written (before, it exited with "SECRET_KEY must be set in the environment when DEBUG is
off"). The test takes the line from the document itself and runs it in a shell that has only what
the document says to set, then finds the worker on the Workers page's table."""
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from apps.runs.models import Worker
from tests.support import service_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def documented_demo_worker_command() -> str:
    """The bash block that follows the paragraph about `make demo`'s stack in "## Workers"."""
    text = (ROOT / "docs" / "scale.md").read_text()
    section = text.split("## Workers", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = [block.strip() for block in blocks if "DEBUG=1" in block and "celery" in block]
    assert len(commands) == 1, blocks
    return commands[0]


def test_the_documented_command_adds_a_worker_to_the_demo_stack():
    command = documented_demo_worker_command()
    # What a second terminal beside `make demo` has: the user's PATH and HOME, and the two URLs the
    # document says to set (here the test's database and Redis). Nothing of the test's settings.
    env = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    test_env = service_env()
    env.update(DATABASE_URL=test_env["DATABASE_URL"], REDIS_URL=test_env["REDIS_URL"],
               RFTWEB_HEARTBEAT_INTERVAL="1")
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    name = re.search(r"-n (\S+)", command).group(1).replace("%h", socket.gethostname())
    try:
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            if Worker.objects.filter(name=name, stopped_at__isnull=True).exists():
                break
            time.sleep(0.5)
        else:
            output = proc.stdout.read() if proc.poll() is not None else "(still running)"
            pytest.fail(f"{shlex.quote(command)} did not register {name}: exit {proc.poll()}\n{output}")
        worker = Worker.objects.get(name=name)
        assert worker.queues == ["explore"] and worker.slots == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
