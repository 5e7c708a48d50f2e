# trainflow: every target sets up what it needs (uv, then the locked environment).
SHELL := /bin/bash
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
RUN := $(UV) run --frozen --extra dev --no-sync
PYTEST_FLAGS ?= -q

.PHONY: setup setup-bench demo test test-under-load test-serial test-fast test-stress test-fast-airflow test-fast-rest reliability-long lint typecheck fmt components check-components e2e e2e-reliability bench bench-full clean \
	dist test-dist image-tools images image-archive test-images e2e-pods pods-images e2e-airflow test-airflow-floor \
	provider-reference

include testbed/testbed.mk

$(UV):
	python3 -m pip install --user --quiet 'uv>=0.5'

setup: $(UV)
	$(UV) sync --frozen --extra dev -p 3.11

# The dev environment plus the peers the differential suite and the benchmarks compare with.
setup-bench: $(UV)
	$(UV) sync --frozen --extra dev --extra bench -p 3.11 --quiet

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

# mypy's incremental cache lives outside the checkout, so a fresh clone of unchanged code (CI's) reuses it:
# mypy compares a module's hash when its mtime differs. Cold, the first run reads Airflow's and kfp's sources.
MYPY_CACHE ?= $(HOME)/.cache/trainflow/mypy
typecheck: setup
	$(RUN) mypy --cache-dir $(MYPY_CACHE)/trainflow -p trainflow.core -p trainflow.airflow -p trainflow.kfp
	MYPYPATH=scripts $(RUN) mypy --cache-dir $(MYPY_CACHE)/ocibuild --strict -p ocibuild

fmt: setup
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

# Compiled KFP component YAMLs are generated; CI checks they are up to date.
components: setup
	$(RUN) python components/kfp/generate.py

# The parameter reference in the provider README is generated from the operator (checked in make test-fast:
# tests/airflow/test_airflow_conventions.py).
provider-reference: setup
	$(RUN) python providers/airflow/reference.py

check-components: setup
	@tmp=$$(mktemp -d); $(RUN) python components/kfp/generate.py --out $$tmp >/dev/null && \
	  diff -ru components/yaml $$tmp || { echo "components/yaml is stale: run 'make components'"; exit 1; }

# test-fast: everything but the suites with their own targets (the stress runs: make test-stress).
# WORKERS=3: in pytest-xdist workers, a test module to a worker (its module fixtures stay whole); test-fast-rest
# took 243 s in 3 workers on an idle 2-core machine. make test keeps one process per suite: beside its other
# lanes, workers added load (up to 35 on 2 cores) and no speed (docs: CONTRIBUTING.md).
FAST_MARKERS := not e2e and not dist and not images and not stress
WORKERS ?= 0
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)
test-fast: setup
	$(RUN) pytest -m "$(FAST_MARKERS)" $(XDIST) $(PYTEST_FLAGS)

# test-fast in two halves for make test's lanes: the Airflow-heavy modules (each test starts Airflow processes)
# and the rest.
AIRFLOW_FAST := tests/airflow tests/reliability/test_airflow_bad_input.py tests/reliability/test_crash_phases.py \
	tests/reliability/test_cancellation.py
test-fast-airflow: setup
	$(RUN) pytest -m "$(FAST_MARKERS)" $(AIRFLOW_FAST) $(XDIST) $(PYTEST_FLAGS)

test-fast-rest: setup
	$(RUN) pytest -m "$(FAST_MARKERS)" $(foreach p,$(AIRFLOW_FAST),--ignore=$(p)) $(XDIST) $(PYTEST_FLAGS)

# The local engine's stress runs (tests/reliability/test_local_liveness.py: 500 jobs, readers, CPU hogs; about
# 3.5 min at load 28). No cluster; make e2e-reliability runs them too.
test-stress: setup
	$(RUN) pytest -m stress tests/reliability $(PYTEST_FLAGS)

# Wheel + sdist (LICENSE and NOTICE inside), then the built wheel in fresh venvs: Airflow floor and newest
# (offline stand-in constraints in tests/dist/constraints), the kfp extra, the core alone.
dist: $(UV)
	rm -f dist/trainflow-*.whl dist/trainflow-*.tar.gz
	$(UV) build -q --out-dir dist

test-dist: setup dist
	UV=$(UV) $(RUN) pytest -m dist tests/dist $(PYTEST_FLAGS)

# OCI images without daemon or registry (root: mmdebstrap, chroot): dist/images/oci (one OCI layout) and
# dist/images/images.json. IMAGES="trainer kfp examples" (default: all). See docs/images.md.
IMAGES ?=
image-tools:
	@command -v mmdebstrap >/dev/null && command -v umoci >/dev/null && command -v skopeo >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap umoci skopeo >/dev/null; }

images: setup dist image-tools
	PYTHONPATH=scripts nice $(RUN) python -m ocibuild build $(IMAGES)

# One built image as an OCI archive for 'ctr images import', under fully qualified NAMES (default: its own).
IMAGE ?= trainer
NAMES ?=
OUT ?= dist/images/$(IMAGE).oci.tar
image-archive: setup
	PYTHONPATH=scripts $(RUN) python -m ocibuild archive $(IMAGE) $(foreach n,$(NAMES),--name $(n)) -o $(OUT)

# Two builds of the KFP step image (shared cache, then a fresh one) give one digest; the image runs trainflow.
test-images: setup dist image-tools
	$(RUN) pytest -m images tests/images $(PYTEST_FLAGS)

# End-to-end: one pytest run per suite, because each suite's test modules import helpers from their own
# conftest. The differential suite compares with the Kubeflow SDK, so it adds the bench extra first.
# A real control plane (etcd, kube-apiserver, controllers, kwok, JobSet, Trainer) on loopback.
# tests/e2e in two pytest processes on one testbed (the Kueue and retry-scenario tests wait on queues and
# processes, the rest on jobs); the reliability suite restarts the API server, so it has its own testbed
# (make e2e-reliability, a lane of its own in make test).
E2E_HALF = tests/e2e/test_kueue.py tests/e2e/test_retry_scenarios.py
e2e: setup
	@set -e; trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh --kueue --objstore; rc=0; out=$$(mktemp -d); \
	  $(RUN) pytest -m e2e $(E2E_HALF) $(PYTEST_FLAGS) >$$out/half-1.log 2>&1 & one=$$!; \
	  $(RUN) pytest -m e2e tests/e2e $(foreach t,$(E2E_HALF),--ignore=$(t)) $(PYTEST_FLAGS) >$$out/half-2.log 2>&1 & \
	  two=$$!; wait $$one || rc=1; wait $$two || rc=1; \
	  for f in $$out/half-1.log $$out/half-2.log; do echo "=== $$f"; cat $$f; done; rm -rf $$out; \
	  exit $$rc

RELIABILITY_TESTBED := TRAINFLOW_TESTBED_DIR=$${TRAINFLOW_RELIABILITY_TESTBED_DIR:-/tmp/trainflow-reliability-run} \
	TRAINFLOW_TESTBED_PORT_BASE=$${TRAINFLOW_RELIABILITY_PORT_BASE:-28380}
e2e-reliability: setup
	@set -e; export $(RELIABILITY_TESTBED); trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh; rc=0; \
	  $(RUN) pytest -m e2e tests/reliability $(PYTEST_FLAGS) || rc=1; \
	  $(RUN) pytest -m stress tests/reliability $(PYTEST_FLAGS) || rc=1; \
	  $(MAKE) --no-print-directory setup-bench; \
	  $(RUN) --extra bench pytest -m e2e tests/differential $(PYTEST_FLAGS) || rc=1; \
	  exit $$rc

# The long reliability runs (50,000 dry-run cases, 500-job load) on their own testbed.
reliability-long: setup
	@set -e; trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh; \
	  RELIABILITY_DRY_RUN_EXAMPLES=50000 RELIABILITY_SEED=random RELIABILITY_LOAD_JOBS=500 \
	  $(RUN) pytest -m e2e tests/reliability $(PYTEST_FLAGS)

# Real pods: two real nodes (containerd, runc, CNI, kubelet, kube-proxy, CoreDNS), the Trainer controller in
# cluster and Kueue (a preemption on real pods), on its own testbed instance (testbed/up.sh --pods --kueue).
# The runtime images are OCI layouts streamed into the nodes' containerd: $(PODS_IMAGES), built by pods-images
# unless TRAINFLOW_TESTBED_IMAGES names them.
PODS_TESTBED := TRAINFLOW_TESTBED_DIR=$${TRAINFLOW_PODS_TESTBED_DIR:-/tmp/trainflow-pods-run} \
	TRAINFLOW_TESTBED_PORT_BASE=$${TRAINFLOW_PODS_PORT_BASE:-25380}
PODS_IMAGES := dist/images/pods
# The image names the default runtimes reference (Trainer v2.3.0 overlays/runtimes), all from the runtimes image
# (the trainer image's layers plus Open MPI, sshd, DeepSpeed, mpi4py, MLX and JAX on CPU: docs/images.md); the
# KFP step image goes in under its own name (ghcr.io/trainflow/trainflow-kfp:<version>), and the Trainer's dataset and
# model initializers, built from its v2.3.0 sources (testbed/upstream), under the names its runtimes give them.
PODS_IMAGE_NAMES := docker.io/pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime \
	ghcr.io/kubeflow/trainer/xgboost-runtime:v2.3.0 \
	ghcr.io/kubeflow/trainer/deepspeed-runtime:v2.3.0 \
	ghcr.io/kubeflow/trainer/mlx-runtime:v2.3.0 \
	nvcr.io/nvidia/jax:25.10-py3
PODS_INITIALIZERS := dataset-initializer model-initializer
# The TorchTune trainer (docs/images.md), under its own name: the TorchTune test sets it as the TrainJob's image
PODS_OWN := kfp torchtune

# Builds what it names (layers cached: a warm rebuild takes about a minute), so a clean clone works too. Each
# image goes in as an OCI layout whose blobs are hardlinks into dist/images/oci, never as a multi-GB tar copy:
# the testbed streams it into containerd (disk, not time, is what a CI machine runs out of).
pods-images: setup dist image-tools
	PYTHONPATH=scripts $(RUN) python -m ocibuild build runtimes $(PODS_OWN) $(PODS_INITIALIZERS)
	rm -rf $(PODS_IMAGES)
	PYTHONPATH=scripts $(RUN) python -m ocibuild archive runtimes --layout \
	  $(foreach n,$(PODS_IMAGE_NAMES),--name $(n)) -o $(PODS_IMAGES)/runtimes.oci
	for i in $(PODS_OWN) $(PODS_INITIALIZERS); do PYTHONPATH=scripts $(RUN) python -m ocibuild archive $$i --layout -o $(PODS_IMAGES)/$$i.oci || exit 1; done

# The suite in two pytest processes side by side (each test has its own namespace; the two nodes hold both
# halves' pods): the Airflow and KFP tests, and the rest. Their logs follow each other once both are done.
# Then the newest Airflow's deployment on the same testbed (run.sh --suite pods: the triggerer restarted under
# real pods' logs), its own state dir and ports beside e2e-airflow's.
PODS_HALF := tests/e2e_pods/test_airflow_pods.py tests/e2e_pods/test_kfp_pods.py tests/e2e_pods/test_kfp_step_image.py \
	tests/e2e_pods/test_logs_and_cancel.py
e2e-pods: setup
	@set -e; export $(PODS_TESTBED); \
	  if [ -z "$${TRAINFLOW_TESTBED_IMAGES:-}" ]; then $(MAKE) pods-images; export TRAINFLOW_TESTBED_IMAGES=$(PODS_IMAGES); fi; \
	  bash testbed/node/build.sh --deps; trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh --pods --kueue --objstore; rc=0; \
	  out=$$(mktemp -d); \
	  $(RUN) pytest -m e2e $(PODS_HALF) $(PYTEST_FLAGS) >$$out/half-1.log 2>&1 & one=$$!; \
	  $(RUN) pytest -m e2e tests/e2e_pods --ignore=tests/e2e_pods/teardown $(foreach t,$(PODS_HALF),--ignore=$(t)) \
	    $(PYTEST_FLAGS) >$$out/half-2.log 2>&1 & two=$$!; \
	  wait $$one || rc=1; wait $$two || rc=1; \
	  for f in $$out/half-1.log $$out/half-2.log; do echo "=== $$f"; cat $$f; done; rm -rf $$out; \
	  TRAINFLOW_AIRFLOW_DIR=/tmp/trainflow-airflow-pods TRAINFLOW_AIRFLOW_PORT_BASE=29670 \
	    bash tests/airflow_deploy/run.sh --airflow $(AIRFLOW_NEWEST) --suite pods || rc=1; \
	  $(RUN) pytest -m e2e tests/e2e_pods/teardown $(PYTEST_FLAGS) || rc=1; \
	  exit $$rc


# A real Airflow deployment (tests/airflow_deploy/run.sh): Postgres + scheduler (LocalExecutor) + triggerer +
# dag-processor + api-server on loopback, on the newest Airflow in its own venv; DAGs triggered over REST on the
# local engine and on the testbed; the UI in Debian's Chromium.
AIRFLOW_NEWEST := 3.3
e2e-airflow: setup
	bash tests/airflow_deploy/run.sh --airflow $(AIRFLOW_NEWEST) --suite deploy

# The provider on the floor release of older Airflow lines (2.11.2 and 3.0.6; pyproject.toml allows >= 2.11),
# each in its own venv and deployment: tests/airflow_deploy/test_floor.py, a deferral and a mark-failed through
# the line's triggerer, the provider's unit tests. One line: make test-airflow-floor AIRFLOW_FLOORS=3.0
AIRFLOW_FLOORS ?= 2.11 3.0
test-airflow-floor: setup
	for v in $(AIRFLOW_FLOORS); do bash tests/airflow_deploy/run.sh --airflow $$v --suite floor || exit 1; done

# The fast lanes and one e2e lane with CPU hogs beside them (one per core, normal priority, bounded in time):
# load flakes show here before CI finds them. Run it once per change to waits, logs or the local engine.
UNDER_LOAD ?= test-fast-rest test-fast-airflow e2e
test-under-load: setup
	bash scripts/under_load.sh $(UNDER_LOAD)

# Every suite: the checks first, the cluster, Airflow and pods suites side by side on their own testbeds while
# the cold builds run (scripts/test_all.sh; logs in build/test-logs). test-serial: one by one.
test: setup
	bash scripts/test_all.sh

test-serial: lint typecheck check-components test-fast test-dist test-images e2e e2e-reliability e2e-airflow \
	test-airflow-floor e2e-pods

# Benchmarks against the peers measured in the same run, on their own testbed instance.
BENCH_TESTBED := TRAINFLOW_TESTBED_DIR=$${TRAINFLOW_BENCH_TESTBED_DIR:-/tmp/trainflow-bench-run} \
	TRAINFLOW_TESTBED_PORT_BASE=$${TRAINFLOW_BENCH_PORT_BASE:-27380}
bench: setup
	@set -e; export $(BENCH_TESTBED); trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh --objstore; \
	  $(RUN) python benchmarks/run.py --quick

bench-full: setup
	@set -e; export $(BENCH_TESTBED); trap 'bash testbed/down.sh' EXIT; bash testbed/up.sh --objstore; \
	  $(RUN) python benchmarks/run.py --full

demo: setup
	bash scripts/demo.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
