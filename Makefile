# FleetPulse — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)
KAFKA_PORT ?= 19092
export KAFKA_PORT
# the one version (pipeline/__init__.py): the package's, the image tag, the chart's appVersion
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pipeline/__init__.py)

.PHONY: help demo test faults fuzz check bench image kafka-up kafka-down kube-build kube-up kube-down kube-demo services-up services-down clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)  ## create or reuse .venv with the project and its test extras

system-deps:  ## install Java/Prometheus/Alertmanager/Chromium if missing (Debian, needs root)
	@bash deploy/system-deps.sh

demo: $(STAMP)  ## simulate a mixed fleet through the whole pipeline in-process (no Kafka)
	$(BIN)/fleetpulse demo $(DEMO_ARGS)

test: $(STAMP) system-deps  ## run the whole suite against real Kafka (and the other real services)
	@bash deploy/with-services.sh $(BIN)/python -m pytest -q $(PYTEST_ARGS)

faults: $(STAMP) system-deps  ## run the fault scenarios (tests/faults), slow ones included; README Reliability tables
	@bash deploy/with-services.sh $(BIN)/python -m pytest -q -m "slow or not slow" tests/faults $(PYTEST_ARGS)
	$(BIN)/python -m tests.faults.reliability

fuzz: $(STAMP)  ## property tests with a fresh random seed (make test runs them derandomized); FUZZ_RUNS=N repeats; no services (the Iceberg cases are make test's)
	@for i in $$(seq 1 $${FUZZ_RUNS:-1}); do HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -x -m "not slow and not s3 and not postgres" tests/unit $(PYTEST_ARGS) || exit 1; done

check: $(STAMP)  ## ruff + mypy + docs/checks.md current with the check catalog
	$(BIN)/ruff check pipeline streams tests bench
	$(BIN)/mypy
	$(BIN)/python -m pipeline.detect.check_docs --check

checks-doc: $(STAMP)  ## regenerate docs/checks.md's table from pipeline/detect/catalog.py
	$(BIN)/python -m pipeline.detect.check_docs

bench: $(STAMP) system-deps  ## run the benchmarks (bench/), write bench/results/*.json and the README tables
	@bash deploy/with-services.sh $(BIN)/python -m bench

image:  ## build the container image fleetpulse:<version> with podman, buildah or docker (pulls its base image)
	@for tool in podman buildah docker; do \
	  if command -v $$tool >/dev/null; then exec $$tool build -t fleetpulse:$(VERSION) -f Containerfile .; fi; \
	done; echo "make image: needs podman, buildah or docker" >&2; exit 1

kafka-up:  ## start the development Kafka broker (127.0.0.1:$KAFKA_PORT)
	@bash deploy/kafka/kafka.sh start

kafka-down:  ## stop it
	@bash deploy/kafka/kafka.sh stop

kube-build:  ## build kube-apiserver and helm from the Go module proxy (once; ~5 min, cached)
	@bash deploy/kubernetes/kube.sh build && bash deploy/kubernetes/helm.sh build

kube-up:  ## start the development Kubernetes API server + etcd (127.0.0.1:$KUBE_API_PORT)
	@bash deploy/kubernetes/kube.sh start

kube-down:  ## stop it
	@bash deploy/kubernetes/kube.sh stop

kube-demo: $(STAMP) system-deps  ## a lost GPU on a local API server: watcher, worker, actuator live; cordon, drain, repair, release printed
	@bash deploy/kubernetes/kube-demo.sh

clean:  ## remove the venv, caches and local outputs (keeps the Kafka jar cache)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache fleetpulse.egg-info out build dist
