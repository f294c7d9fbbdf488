# tpupipe — `make run` runs the whole pipeline locally; `make test` runs every test tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PRESET ?= local-fsdp
SET ?=
VENV := .venv
BIN := $(VENV)/bin
PIPELINE_YAML := build/tpupipe_pipeline.yaml
# compile-pipeline: the Google Cloud project and region the compiled pipeline runs in; empty, tpupipe compile's
# defaults ($GOOGLE_CLOUD_PROJECT, else its placeholder project; its default region). IMAGE_DIGEST: the components
# image's digest (sha256:HEX, as tpupipe publish prints it) every task is pinned to; empty, the tag alone.
PROJECT ?=
REGION ?=
IMAGE_DIGEST ?=

# Python 3.12: python3.12 if it runs, else pyenv's 3.12.x (its shim needs PYENV_VERSION), else common paths.
PYTHON312 ?= $(shell \
  if python3.12 -c 'import sys' >/dev/null 2>&1; then command -v python3.12; exit; fi; \
  for p in $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
    if [ -x "$$p" ] && "$$p" -c 'import sys' >/dev/null 2>&1; then echo "$$p"; exit; fi; done)

.PHONY: help run test test-fast test-e2e compile-pipeline bench lint format lock envs clean-runs goldens config-docs

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'
	@echo "  make run PRESET=<preset> SET=\"key=value ...\"   e.g. SET=\"epochs=2 cluster.num_hosts=3\""

# --no-compile, then compileall on every core (pip compiles one file after another), here and in the image
# environments (components/platforms/local/envs.py): where PYTHONDONTWRITEBYTECODE is set, Python writes no cache and
# every process would compile the modules it imports again. -qq: a package's test data that is not Python 3 is no news.
$(VENV)/.installed: requirements-pip.lock requirements-dev.lock pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found: install it (pyenv install 3.12) or set PYTHON312=/path/to/python3.12"; exit 1; }
	@echo "creating the pipeline environment $(VENV) with $(PYTHON312)"
	rm -rf $(VENV)
	$(PYTHON312) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --require-hashes -r requirements-pip.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile --require-hashes -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile --no-deps -e .
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

envs: $(VENV)/.installed ## create (or reuse, by content hash) the pipeline and the trainer environments
	$(BIN)/tpupipe env torch maxtext

# The run creates (or reuses) the one trainer environment its preset needs itself, in build_image; the terminal shows
# the run's own lines alone.
run: $(VENV)/.installed ## run the whole pipeline on the local platform (kfp.local + a local multi-node Ray cluster)
	@$(BIN)/tpupipe run --preset $(PRESET) $(if $(SET),--set "$(SET)")

# The tests run in two processes (pytest-xdist; CI's machine has 2 cores), each test file in one process so that a
# module's shared run is made once, handed out in collection order (the longest files first: tests/conftest.py).
# XDIST= runs them in this process alone (the fast tier too).
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
# The fast tier waits more than it computes (its emulators' polls and timeouts: about a third of two cores idle in two
# processes), so it runs in three; the e2e tier is bound by the CPU and stays in two.
FAST_XDIST ?= $(subst -n 2 ,-n 3 ,$(XDIST))

# The emulated Vertex AI runs its tasks in the components image's environment (.envs/pipeline-<hash>, from
# images/pipeline alone), built in the background beside the trainer environments; a fast test that needs it
# before it is ready waits on its lock.
test: $(VENV)/.installed ## all tests: the fast tiers while the trainer environments build, then the e2e tier
	@mkdir -p build
	@echo "creating (or reusing) the trainer and components environments in the background, log build/envs.log; the fast tiers meanwhile"
	@set -m; $(BIN)/tpupipe env torch maxtext pipeline > build/envs.log 2>&1 & envs=$$!; \
	  $(MAKE) --no-print-directory test-fast || { kill -- -$$envs 2>/dev/null; exit 1; }; \
	  wait $$envs || { echo "creating the trainer environments failed:"; tail -30 build/envs.log; exit 1; }
	$(MAKE) --no-print-directory test-e2e

test-fast: $(VENV)/.installed ## the tiers that start no Ray cluster and need no trainer environment (minutes)
	$(BIN)/python -m pytest -q -ra -m "not e2e and not trainer_env" $(FAST_XDIST) --durations=15 tests

test-e2e: envs ## the tier that starts real local Ray clusters and trains (local, gke and Vertex AI emulated runs), and the tests in a trainer environment
	$(BIN)/python -m pytest -q -ra -m "e2e or trainer_env" $(XDIST) --durations=15 tests

compile-pipeline: $(VENV)/.installed ## compile the pipeline to $(PIPELINE_YAML) for PROJECT and REGION and check it as Vertex AI will read it (offline)
	$(BIN)/tpupipe compile --output $(PIPELINE_YAML) $(if $(PROJECT),--project $(PROJECT)) $(if $(REGION),--region $(REGION)) \
	  $(if $(IMAGE_DIGEST),--image-digest $(IMAGE_DIGEST))

bench: envs ## every benchmark in bench/bench_*.py (figures side by side in one run, each against its target); writes bench/results.json
	$(BIN)/python -m bench.run $(BENCH)

# The seed presets whose `tpupipe plan` (JSON and Kubernetes manifests) and `tpupipe run --platform gke --dry-run`
# transcript are committed under tests/goldens/ (tests/unit/test_plan_goldens.py holds the same settings).
GOLDEN_PRESETS := smoke gemma4-e2b-v6e-16 gemma4-e2b-tpu7x-16 llama3-8b-v6e-16x2 llama3-70b-v6e-16x2 llama3-8b-v6e-elastic-spot
GOLDEN_DRY_RUN_SET := gke.project=my-project
# Presets with settings, committed the same way: NAME=PRESET:KEY=VALUE[,KEY=VALUE...] (the goldens' directory and run
# id is NAME).
GOLDEN_VARIANTS := gemma4-e2b-v6e-16-queued=gemma4-e2b-v6e-16:cluster.capacity=queued gemma4-e2b-v6e-16-queue=gemma4-e2b-v6e-16:gke.cluster_name=shared,gke.queue=team-a gemma4-e2b-v6e-16-queue-queued=gemma4-e2b-v6e-16:gke.cluster_name=shared,gke.queue=team-a,cluster.capacity=queued

goldens: $(VENV)/.installed ## regenerate tests/goldens/ (plan and dry run of each seed preset) on purpose; review the diff
	@set -e; for p in $(GOLDEN_PRESETS); do \
	  rm -rf tests/goldens/$$p; mkdir -p tests/goldens/$$p; \
	  $(BIN)/tpupipe plan $$p --output json --manifests tests/goldens/$$p/manifests > tests/goldens/$$p/plan.json; \
	  $(BIN)/tpupipe run $$p --platform gke --dry-run --run-id $$p --set "$(GOLDEN_DRY_RUN_SET)" \
	    > tests/goldens/$$p/dry-run.txt; \
	  echo "tests/goldens/$$p"; done
	@set -e; for v in $(GOLDEN_VARIANTS); do \
	  n=$${v%%=*}; r=$${v#*=}; p=$${r%%:*}; s=$${r#*:}; s=$${s//,/ }; \
	  rm -rf tests/goldens/$$n; mkdir -p tests/goldens/$$n; \
	  $(BIN)/tpupipe plan $$p --run-id $$n --set "$$s" --output json --manifests tests/goldens/$$n/manifests \
	    > tests/goldens/$$n/plan.json; \
	  $(BIN)/tpupipe run $$p --platform gke --dry-run --run-id $$n --set "$(GOLDEN_DRY_RUN_SET) $$s" \
	    > tests/goldens/$$n/dry-run.txt; \
	  echo "tests/goldens/$$n"; done

LINTED := components pipelines trainers tests bench

# mypy takes what it checks, and how strictly, from pyproject.toml's [tool.mypy]; run from .venv, it sees the packages
# installed there.
lint: $(VENV)/.installed ## ruff check (pyproject.toml's rules), ruff format --check, then mypy: what CI runs first
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

config-docs: $(VENV)/.installed ## regenerate docs/config.md (every setting's meaning, default and allowed values) from the run spec
	$(BIN)/python -m components.spec.reference > docs/config.md

format: $(VENV)/.installed ## format the tree (ruff format) and apply ruff's safe fixes
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# Every environment installs a hash-locked file (pip --require-hashes), after pip itself (requirements-pip.lock): each
# image's requirements.lock (its Dockerfile and components/platforms/local/envs.py install it) and requirements-dev.lock
# (.venv: the components image's requirements and the test tools), resolved for Python 3.12 on Linux x86_64
# (manylinux_2_31: the oldest glibc torch-tpu's and libtpu's wheels are built for). tests/unit/test_locks.py fails when a pin is not in its lock.
LOCK := $(BIN)/uv pip compile -q --generate-hashes --python-version 3.12 --python-platform x86_64-manylinux_2_31 \
  --custom-compile-command "make lock"

lock: $(VENV)/.installed ## regenerate the hash-locked requirements (images/*/requirements.lock, requirements-dev.lock) after changing a requirements file
	@set -e; for d in $(wildcard images/*); do echo "locking $$d/requirements.txt"; $(LOCK) -o $$d/requirements.lock $$d/requirements.txt; done
	$(LOCK) -o requirements-dev.lock images/pipeline/requirements.txt requirements-dev.txt
	$(LOCK) -o requirements-pip.lock requirements-pip.txt
	@echo "locking torch's CPU build (images/torch/torch-cpu.lock) from torch's index, at requirements.txt's version"
	sed -n 's/^torch==\(.*\)/torch==\1+cpu/p' images/torch/requirements.txt | $(LOCK) --no-deps \
	  --index-url https://download.pytorch.org/whl/cpu -o images/torch/torch-cpu.lock -

clean-runs: ## delete local run directories
	rm -rf runs
