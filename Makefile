# Two commands on a fresh machine: `make demo` and `make test`. Each sets up .venv/ inside the repo.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch (the kernels extra needs torch; the applier itself does not).
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# Caches stay inside the repo too: `make demo` and `make test` write nothing outside it.
export XDG_CACHE_HOME   := $(CURDIR)/.cache
export PIP_CACHE_DIR    := $(CURDIR)/.cache/pip
export TRITON_CACHE_DIR := $(CURDIR)/.cache/triton

.PHONY: demo test test-fast clean-sandbox clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,kernels]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p .cache/tmp
	TMPDIR=$(CURDIR)/.cache/tmp $(PY) scripts/demo.py --sandbox sandbox --torch "$(TORCH)"

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

clean-sandbox:
	rm -rf sandbox

clean: clean-sandbox
	rm -rf $(VENV) *.egg-info .cache
