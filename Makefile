# Two entry points: `make run` (API + embedded worker, no Redis/Docker/GPU needed) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: run test install system-deps clean-data

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip

# The stamp re-runs the install when pyproject.toml changes. CPU torch comes first so the
# project's `torch>=...` requirement does not pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "torch==$(TORCH_VERSION)"
	$(PIP) install -e '.[worker,dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m service.embedded

system-deps:
	bash scripts/system_deps.sh

# The kernels are compiled once up front, so no test's first training pays for the build.
test: install system-deps
	$(PY) -m kernels.build
	$(PY) -m pytest $(PYTEST_ARGS)

clean-data:
	rm -rf data
