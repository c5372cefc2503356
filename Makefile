# tensorplay-rpc: `make demo` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_SYSTEM := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
# Debian packages the build, the package and its tests need.
APT_PACKAGES := gcc python3-dev python3-venv python3-pip python3-setuptools python3-wheel \
	python3-pybindgen python3-cloudpickle python3-msgpack python3-numpy python3-pytest python3-pytest-timeout \
	python3-torch python3-build iproute2 openmpi-bin mypy openssl
# The benchmark also draws a chart.
BENCH_APT_PACKAGES := python3-matplotlib
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

NATIVE_DIR := python/tensorplay_rpc/_native
NATIVE_STAMP := $(NATIVE_DIR)/.built
GO_SOURCES := go.mod go.sum $(shell find core pybind -name '*.go' -not -name '*_test.go')
PY_SOURCES := pyproject.toml setup.py $(shell find python/tensorplay_rpc -name '*.py' -not -path '*/_native/*')

.PHONY: help deps bench-deps apt-install native install demo demo-go test test-go test-python typecheck vet bench bench-hosts fuzz soak scale scale-mesh check clean

help:
	@echo "make demo   build everything and run a small world of workers on localhost"
	@echo "make demo-go  a Python worker and a Go worker calling each other by name"
	@echo "make test   build everything and run every test (go vet, go test -race, pytest)"
	@echo "make check  the edit loop's tier: vet, gofmt, mypy, Go tests without -race, Python tests with no world (under 3 minutes)"
	@echo "make bench  tensorplay_rpc (shm, TCP and gRPC) vs torch.distributed.rpc vs raw TCP, in one run"
	@echo "make bench-hosts  the same between two network namespaces, with delays (root)"
	@echo "make fuzz   fuzz the frame decoder, the reassembler, the store and the shm ring reader, 3 million runs each"
	@echo "make soak   a 10-minute soak of a world of 4"
	@echo "make scale  a world of 256 workers on this host, three times"
	@echo "make scale-mesh  a full mesh of 64 workers over shared memory, its peak shared memory printed"

# Installs only what is missing, so a warm machine does no network work.
deps:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(APT_PACKAGES)"

bench-deps:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(BENCH_APT_PACKAGES)"

apt-install:
	@missing=$$(for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The CPython extension, built by setup.py as pip builds it (gopy v0.4.10 and goimports from
# the pinned tools module; see setup.py), for Debian's Python; setup.py rebuilds it only when
# the Go sources change.
$(NATIVE_STAMP): $(GO_SOURCES) setup.py tools/go.mod tools/go.sum tools/tools.go | deps
	@$(PYTHON_SYSTEM) setup.py -q build_native
	@touch $@

native: deps $(NATIVE_STAMP)

$(PY):
	$(PYTHON_SYSTEM) -m venv --system-site-packages $(VENV)

$(VENV)/.installed: $(PY) $(NATIVE_STAMP) $(PY_SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps --disable-pip-version-check .
	@touch $@

install: deps $(VENV)/.installed

vet: deps
	go vet ./...
	@test -z "$$(gofmt -l core pybind tools)" || { echo "gofmt needed:"; gofmt -l core pybind tools; exit 1; }

# Every fuzz target (name:package) in turn: go test fuzzes one at a time.
FUZZ_TARGETS := FuzzFrameDecode:./core/wire FuzzReassembly:./core FuzzStoreRequest:./core/rendezvous \
	FuzzRingReader:./core/transport/shmtransport FuzzRecords:./core/transport/tcptransport \
	FuzzHello:./core/transport/tcptransport

# Agents on one host talk over shared memory by default; the other runs pin their worlds to
# plain TCP (the path between hosts) and to gRPC, so every agent test covers each transport.
test-go: deps
	go test -race -count=1 -timeout 15m ./...
	TENSORPLAY_RPC_TRANSPORTS=tcp go test -race -count=1 -timeout 15m ./core/...
	TENSORPLAY_RPC_TRANSPORTS=grpc go test -race -count=1 -timeout 15m ./core/...
	@for t in $(FUZZ_TARGETS); do \
		go test -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s "$${t#*:}" || exit 1; \
	done

# The soak runs 20 s in `make test`, 10 minutes here.
soak: install
	cd tests && TENSORPLAY_SOAK_SECONDS=600 ../$(PY) -m pytest -q -p no:cacheprovider test_soak.py

# A world of 32 runs in `make test`; here 256, three times in a row, with what each worker
# costs printed (goroutines, threads, file descriptors, RSS).
scale: install
	cd tests && TENSORPLAY_SCALE_WORKERS=256 TENSORPLAY_SCALE_RUNS=3 ../$(PY) -m pytest -q -p no:cacheprovider -o log_cli=true test_scale.py

# A full mesh of 64 workers over shared memory (8 in `make test`), with the host's shared
# memory at its peak and while idle printed.
scale-mesh: install
	cd tests && TENSORPLAY_MESH_WORKERS=64 TENSORPLAY_MESH_PEAK_LIMIT_MIB=2048 ../$(PY) -m pytest -q -p no:cacheprovider -o log_cli=true test_scale_mesh.py

# The fuzz targets: briefly in `make test`, longer here.
# Budgets are counts of executions, not durations: with a duration, Go 1.26's fuzzing
# coordinator can fail a target with "context deadline exceeded" as the time runs out, with no
# failing input (golang/go#75804, fixed in Go 1.27; seen here once in `make test`).
FUZZTIME ?= 50000x
fuzz:
	$(MAKE) --no-print-directory test-go FUZZTIME=3000000x

test-python: install
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider

# The package's annotations, as a user's type checker sees them (Debian's mypy).
typecheck: deps
	cd python && mypy --strict --config-file ../pyproject.toml --python-executable $(PYTHON_SYSTEM) tensorplay_rpc

test: vet typecheck test-go test-python

# The edit loop's tier, under 3 minutes: vet, gofmt, mypy, the Go tests without -race, and the
# Python tests that start no world of processes. `make test` is what CI runs.
check: vet typecheck install
	go test -count=1 -timeout 10m ./...
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider test_api_objects.py test_docs.py \
		-k "not test_every_code_block_of_the_page_runs"

demo: install
	$(PY) tests/demo.py

# A Python worker and a Go worker (examples/goworker) calling each other by name.
demo-go: install
	go build -o bin/goworker ./examples/goworker
	$(PY) examples/mixed_world.py bin/goworker

bench: install bench-deps
	cd bench && ../$(PY) bench.py $(BENCH_ARGS)

# Between two network namespaces on a bridge, with 0, 1 and 5 ms of delay (root).
bench-hosts: install bench-deps
	cd bench && ../$(PY) hosts.py

clean:
	rm -rf bin $(NATIVE_DIR) $(VENV) build dist gomodules python/*.egg-info build-native.log bench/out
