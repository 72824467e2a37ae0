# Two commands on a fresh machine: `make demo` and `make test`. Each sets up .venv/ inside the repo.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch (the kernels extra needs torch; the applier itself does not).
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# Caches and temporary files stay inside the repo too: `make demo` and `make test` write nothing outside it
# (everything that asks tempfile for a folder, pytest's tmp_path folders included, goes to .cache/tmp, numbered per
# run so that two runs do not share one; Hypothesis' examples go to .cache/hypothesis; tests/conftest.py keeps git in
# those folders from taking this checkout for their repository).
export XDG_CACHE_HOME   := $(CURDIR)/.cache
export PIP_CACHE_DIR    := $(CURDIR)/.cache/pip
export TRITON_CACHE_DIR := $(CURDIR)/.cache/triton
export TMPDIR           := $(CURDIR)/.cache/tmp
# The tests run on two cores: two pytest-xdist workers, each taking whole files (a file's tests and module fixtures
# stay in one process), each with its own popen-gwN folder under the run's pytest-N. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test test-fast clean-sandbox clean

$(STAMP): setup.cfg pyproject.toml
	mkdir -p $(TMPDIR)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,kernels]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(TMPDIR)
	$(PY) scripts/demo.py --sandbox sandbox --torch "$(TORCH)"

test: $(STAMP)
	mkdir -p $(TMPDIR)
	$(PYTEST)

# Without the slow tests (the Triton interpreter, real torch files: tests/conftest.py marks them).
test-fast: $(STAMP)
	mkdir -p $(TMPDIR)
	$(PYTEST) -m "not slow"

clean-sandbox:
	rm -rf sandbox

clean: clean-sandbox
	rm -rf $(VENV) *.egg-info .cache
