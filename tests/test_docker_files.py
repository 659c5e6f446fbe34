"""What docker/ builds (nothing here builds an image: these read the files): the static files live
outside the data volume (a volume mounted over /data kept the first build's JS and CSS, served after
every rebuild), the CPU image's torch is the CPU build, and the first `up` can create the admin."""
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())


def env_of(dockerfile: str) -> dict[str, str]:
    """The ENV settings of a Dockerfile (NAME=value pairs, continued lines joined)."""
    text = dockerfile.replace("\\\n", " ")
    return dict(pair.split("=", 1) for line in re.findall(r"^ENV (.+)$", text, re.M) for pair in line.split())


def test_the_static_files_are_collected_outside_the_data_volume():
    env = env_of(DOCKERFILE)
    static, data = Path(env["RFTWEB_STATIC_ROOT"]), Path(env["RFTWEB_DATA_DIR"])
    assert not static.is_relative_to(data)
    assert all(volume.split(":")[1] == str(data) for volume in COMPOSE["x-app"]["volumes"])
    assert DOCKERFILE.index("RFTWEB_STATIC_ROOT") < DOCKERFILE.index("collectstatic")


def test_the_settings_read_the_static_root_from_the_environment(tmp_path):
    def static_root(**extra) -> str:
        env = {key: value for key, value in os.environ.items() if key != "RFTWEB_STATIC_ROOT"}
        env |= {"DJANGO_SETTINGS_MODULE": "rftweb.settings", "DEBUG": "1", "RFTWEB_DATA_DIR": str(tmp_path / "data"),
                **extra}
        code = "from django.conf import settings; print(settings.STATIC_ROOT)"
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert static_root() == str(tmp_path / "data" / "staticfiles")
    assert static_root(RFTWEB_STATIC_ROOT="/app/staticfiles") == "/app/staticfiles"


def test_the_cpu_image_installs_the_cpu_torch():
    install = next(line for line in DOCKERFILE.splitlines() if "-r requirements.txt" in line)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install
    assert "torch.__version__ == '2.13.0+cpu'" in DOCKERFILE


def test_the_migrate_service_creates_the_first_admin_once():
    migrate = COMPOSE["services"]["migrate"]
    command = migrate["command"][-1]
    assert "create_admin --if-missing" in command and "$$RFTWEB_ADMIN_PASSWORD" in command
    assert {"RFTWEB_ADMIN_USER", "RFTWEB_ADMIN_PASSWORD", "DATABASE_URL"} <= set(migrate["environment"])


def test_the_gpu_image_gets_python_3_11_where_its_base_has_none():
    gpu = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    base = re.search(r"^FROM (\S+)", gpu, re.M)[1]
    if "ubuntu24.04" in base:  # noble's Python is 3.12 alone
        assert "ppa:deadsnakes/ppa" in gpu and "python3.11 -m venv" in gpu
