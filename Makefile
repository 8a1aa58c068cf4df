# Two entry points: `make run` (API + embedded worker, no Redis/Docker/GPU needed) and `make test`
# (`make test-fast` for the edit loop).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
# Which torch build `make install` brings in: auto (a CUDA build where nvidia-smi sees a GPU,
# else CPU wheels), cpu, or a PyTorch CUDA wheel index name (cu126, cu128, cu130).
# TORCH_INDEX_URL takes torch from that index instead. scripts/torch_pip_args.sh decides.
TORCH_BUILD ?= auto
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
# Test processes side by side (pytest-xdist), whole files to each so module fixtures start once:
# most tests wait on their uvicorn and Celery subprocesses, Redis, PostgreSQL or Chromium, so
# more processes than this 2-core machine's cores pay. Its tests but the `alone` ones took, with
# nothing else running, 453 s on 4 processes (507 on 3, 490 on 6); beside a training on two
# threads, 805 s on 4, 544 on 5, 567 on 6. Tests marked `alone` (they judge wall time) run
# after them, one at a time.
TEST_WORKERS ?= 5
XDIST = -n $(TEST_WORKERS) --dist loadfile
# The project's bytecode, written once up front: with PYTHONDONTWRITEBYTECODE set (as on this
# machine) every API, worker and CLI process the tests start would compile its modules again.
PYC = $(PY) -m compileall -q -j 0 api_schemas core service worker kernels tests experiments clients/python/src >/dev/null

.PHONY: run test test-fast install system-deps clean-data

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip

# The stamp re-runs the install when pyproject.toml changes. torch comes first, in the build
# chosen for the host, so the project's `torch>=...` requirement does not pull PyPI's multi-GB
# CUDA build onto a CPU host; a torch already in the venv is kept (rm -rf $(VENV) to change it).
TORCH_PIP_ARGS = $(shell TORCH_VERSION='$(TORCH_VERSION)' TORCH_BUILD='$(TORCH_BUILD)' \
	TORCH_INDEX_URL='$(TORCH_INDEX_URL)' PIP='$(PIP)' bash scripts/torch_pip_args.sh || echo FAIL)
# the installed torch's version, read from its metadata (importing torch takes seconds)
HAVE_TORCH = $(shell $(PY) -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null)

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml | $(PY)
	$(if $(HAVE_TORCH),@echo "torch $(HAVE_TORCH) already installed",$(eval TORCH_ARGS := $(TORCH_PIP_ARGS))$(if $(filter FAIL,$(TORCH_ARGS)),@exit 2,$(PIP) install $(TORCH_ARGS)))
	$(PIP) install -e '.[worker,dev]'
	$(PIP) install -e ./clients/python
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m service.embedded

system-deps:
	bash scripts/system_deps.sh

# The kernels are compiled once up front, so no test's first training pays for the build (and
# no two test processes build at once). Both runs always run; the first failure's status is
# make's. Exit status 5 (nothing collected: PYTEST_ARGS named no such test) is not a failure.
test: install system-deps
	$(PY) -m kernels.build
	@$(PYC)
	@rc=0; \
	echo "== pytest $(XDIST) -m 'not alone' $(PYTEST_ARGS)"; \
	$(PY) -m pytest $(XDIST) -m "not alone" $(PYTEST_ARGS) || rc=$$?; \
	[ $$rc -eq 5 ] && rc=0; \
	echo "== pytest -m alone $(PYTEST_ARGS)"; \
	$(PY) -m pytest -m alone $(PYTEST_ARGS) || { a=$$?; [ $$a -eq 5 ] || [ $$rc -ne 0 ] || rc=$$a; }; \
	exit $$rc

# The edit loop: everything but the heavy end-to-end tests (`slow`) and the `alone` ones.
test-fast: install system-deps
	$(PY) -m kernels.build
	@$(PYC)
	$(PY) -m pytest $(XDIST) -m "not slow and not alone" $(PYTEST_ARGS)

clean-data:
	rm -rf data
