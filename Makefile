# Every target bootstraps .venv by itself, so a fresh machine needs only python3.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PIP_CONSTRAINT := $(abspath constraints.txt)
export PYTHONUNBUFFERED := 1
export TORCHINDUCTOR_CACHE_DIR ?= $(abspath .cache/inductor)

.PHONY: venv demo test test-fast lint typecheck format bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -r requirements-dev.txt
	touch $(STAMP)

demo: venv
	$(VENV)/bin/scalpel demo

# Everything: unit and integration on TEST_WORKERS pytest-xdist workers (their tests run single-threaded child
# processes, OMP_NUM_THREADS=1, so two workers keep two cores busy), then the distributed tests one at a time (each
# starts 2-4 ranks of its own: run beside other tests they would judge hangs and stragglers on a machine shared
# with them). The slowest tests and the time per folder (summed over workers) are printed after each part.
TEST_WORKERS ?= 2
test: venv
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest tests --ignore=tests/distributed -q -p no:cacheprovider -n $(TEST_WORKERS) --durations=25
	$(PY) -m pytest tests/distributed -q -p no:cacheprovider --durations=10

# The edit loop: tests/unit, which starts no process (tests/unit/conftest.py refuses one), so no marker filter.
test-fast: venv
	$(PY) -m pytest tests/unit -q -p no:cacheprovider --durations=10

lint: venv
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts
	$(VENV)/bin/lint-imports

# mypy on src/torchscalpel with the settings in pyproject.toml ([tool.mypy]; cache in .cache/mypy).
typecheck: venv
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format src tests benchmarks examples scripts

bench: venv
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .cache scalpel-runs build *.egg-info src/*.egg-info
