# goddp: a PyTorch Dynamo backend whose DDP planning core is written in Go.
#
# Every target installs what it needs from nothing: a virtual environment in
# .venv with the pinned requirements, then goddp itself (editable, so the
# extension is rebuilt from the Go source by setup.py).

PYTHON   ?= python3
GO       ?= go
VENV     := .venv
PY       := $(VENV)/bin/python
PIP      := $(PY) -m pip
TORCHRUN := $(VENV)/bin/torchrun
BUILD    := build
LIBDIR   := $(BUILD)/lib
# Test variants: Go tag goddp_testhooks and C macro GODDP_TESTHOOKS add the
# goddp_debug_panic hook, which must never ship. Only the tests load these.
HOOKDIR  := $(BUILD)/testhooks
GO_SRC   := $(shell find planner bridge -name '*.go' -not -name '*_test.go') go.mod
# Keep the Go build cache and module cache inside the machine's default
# locations; CI runs as root in a fresh clone.
export CGO_ENABLED := 1

.PHONY: help venv install lib testhooks ctest gotest gounit gofuzz test-beside pytest pytest-dist test demo gpu-check bench bench-full clean \
	wheel sdist wheel-tools test-wheel test-torch

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The pinned requirements go in with uv (from PyPI, pinned here): torch and
# its CUDA libraries are 5.8 GB unpacked, which pip unpacks and compiles on
# one core in about 2.5 minutes, uv on every core in about one. Compiled:
# pip compiles every module at install and uv only when asked, and where
# PYTHONDONTWRITEBYTECODE is set (CI here) nothing writes .pyc later, so each
# process of the suites would compile torch from source again (the
# one-process suite took 11.2 minutes instead of 6.3). pip stays in .venv
# for goddp's editable install and for the user's path that tests/wheel walks.
# uv reads UV_INDEX_URL / UV_DEFAULT_INDEX, not pip's PIP_INDEX_URL or pip.conf:
# behind a mirror, set those too.
UV_VERSION := 0.13.9
UV         := $(VENV)/bin/uv
UV_PIP     := $(UV) pip install -q --compile-bytecode --python $(PY)

$(VENV)/.requirements: requirements-dev.txt
	@command -v $(GO) >/dev/null || { echo "error: Go 1.26+ is required (https://go.dev/dl); set GO=/path/to/go"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q uv==$(UV_VERSION)
	$(UV_PIP) -r requirements-dev.txt
	touch $@

venv: $(VENV)/.requirements ## Create .venv with the pinned requirements

# An extension of another name (a build from before abi3) would shadow the new one.
$(VENV)/.goddp: $(VENV)/.requirements $(GO_SRC) csrc/goddp.h csrc/goddp_module.c setup.py pyproject.toml
	rm -f python/goddp/_goddp.cpython-*.so
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(VENV)/.goddp ## Build the Go core and install goddp (editable) into .venv

$(LIBDIR)/libgoddp.so: $(GO_SRC) csrc/goddp.h
	$(GO) build -buildmode=c-shared -o $@ ./bridge

lib: $(LIBDIR)/libgoddp.so ## Build the shared library build/lib/libgoddp.so (+ Go's header)

$(HOOKDIR)/libgoddp.so: $(GO_SRC) csrc/goddp.h
	$(GO) build -tags goddp_testhooks -buildmode=c-shared -o $@ ./bridge

# The Python test variant of goddp._goddp, for the panic tests (they load it
# from here explicitly; see tests/python/_testhooks.py).
$(HOOKDIR)/.ext: $(VENV)/.requirements $(GO_SRC) csrc/goddp.h csrc/goddp_module.c setup.py
	rm -rf $(HOOKDIR)/ext
	GODDP_TESTHOOKS=1 $(PY) setup.py -q build_ext --build-lib $(HOOKDIR)/ext --build-temp $(HOOKDIR)/temp
	touch $@

testhooks: $(HOOKDIR)/libgoddp.so $(HOOKDIR)/.ext ## Build the test-only library and extension with the panic hook

$(BUILD)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(LIBDIR)/libgoddp.so
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -Icsrc tests/c/plan_toy.c -o $@ \
	    -L$(LIBDIR) -Wl,-rpath,'$$ORIGIN/lib' -lgoddp -lpthread -ldl

$(HOOKDIR)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(HOOKDIR)/libgoddp.so
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -DGODDP_TESTHOOKS -Icsrc tests/c/plan_toy.c -o $@ \
	    -L$(HOOKDIR) -Wl,-rpath,'$$ORIGIN' -lgoddp -lpthread -ldl

ctest: $(BUILD)/plan_toy $(HOOKDIR)/plan_toy ## Plan a toy graph from C through libgoddp.so (shipped and test-hook builds)
	$(BUILD)/plan_toy
	$(HOOKDIR)/plan_toy

# The fuzz runs are counted in executions (-fuzztime Nx), not seconds: with a
# duration, Go's fuzz coordinator can report a spurious "context deadline
# exceeded" failure when the time runs out on a loaded machine
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
#
# Note [The race detector where goroutines run]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The race detector sees races between goroutines, and the planner starts
# none: its one test that does (TestConcurrentBuild: Build from 8 goroutines
# at once) runs under -race with the bridge's tests, whose cgo calls come
# from many threads; the rest of the planner's tests run once, without it
# (under -race they took 9.7 s instead of 1.3). A planner test that starts
# goroutines is named TestConcurrent*, so that -race sees it (and
# TestGoroutinesOnlyInConcurrentTests fails on one that is not).
gotest: gounit gofuzz ## Go vet, unit tests (the race detector where goroutines run), short fuzz runs

# One vet, with the test-hook tag: no file is built only without it, so it
# vets every file, and the untagged build is checked by ctest's and
# setup.py's builds of the shipped library.
gounit: ## Go vet, and the Go tests (bridge and concurrent planner tests under -race)
	$(GO) vet -tags goddp_testhooks ./...
	$(GO) test -race -count=1 -tags goddp_testhooks ./bridge
	$(GO) test -race -count=1 -run '^TestConcurrent' ./planner
	$(GO) test -count=1 -skip '^TestConcurrent' ./planner

gofuzz: ## Short counted fuzz runs (Build, the block rule, Decide, the body stacks, the checkpoint regions)
	$(GO) test -run '^$$' -fuzz '^FuzzPlan$$' -fuzztime 100000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzBlockRule$$' -fuzztime 40000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime 25000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzBodies$$' -fuzztime 50000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzCheckpointRegions$$' -fuzztime 60000x ./planner

# Note [A lost DNS answer]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# c10d looks up the name of each TCPStore peer, only for its log lines: the
# peer of a local test group is ::ffff:127.0.0.1, which no /etc/hosts holds,
# so every connection asks DNS, and is told there is no such name. A
# resolver that loses an answer now and then (this machine's loses one
# query in 50) makes that connection wait glibc's 5 s before it asks again:
# the 64 clients of test_round_scale's store waited 10 s, the torchrun
# launches of the suites a few seconds each now and then. RES_OPTIONS
# (glibc's override of resolv.conf's options) makes the suites ask again
# after 1 s; none of their names comes from DNS (/etc/hosts answers first).
DNS_GIVES_UP   := RES_OPTIONS=timeout:1

# One pytest worker per core (pytest-xdist), each a 1-rank process of its
# own, one thread each. PYTEST_WORKERS=0 runs them all in this process.
# Every core already runs a test, so Inductor compiles in the process that
# asks (its pool of compile workers cost each process about 5 s of CPU).
PYTEST_WORKERS ?= auto
SUITE_ENV      := OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 $(DNS_GIVES_UP)
ON_EVERY_CORE  := -n $(PYTEST_WORKERS) --dist worksteal
# What pytest-dist (and test-torch) runs inside each of two torchrun ranks.
TWO_RANKS      := --standalone --nproc_per_node=2 -m pytest -q -p no:cacheprovider -m "not single_process" \
                  tests/python/*/test_dist_*.py
pytest: install $(HOOKDIR)/.ext ## Python suites, one process per core (each a 1-rank gloo group)
	$(PYTEST_ENV) $(SUITE_ENV) $(PY) -m pytest -q $(ON_EVERY_CORE) tests/python

# The two-rank suites under torchrun: two ranks, gloo, CPU.
pytest-dist: install $(HOOKDIR)/.ext ## The two-rank suites (test_dist_*) under torchrun (2 ranks, gloo)
	$(SUITE_ENV) $(TORCHRUN) $(TWO_RANKS)

# ---------------------------------------------------------------------------
# Distributions: `make sdist`, `make wheel`.
#
# Note [Manylinux toolchain]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# A wheel built with this machine's gcc needs this machine's glibc (2.34+
# symbols), and no index or older cluster takes that. The wheel is built
# instead with zig's C compiler from PyPI (ziglang, pinned in
# requirements-wheel.txt) as cgo's CC and as the extension's compiler and
# linker: `zig cc -target x86_64-linux-gnu.2.28` compiles and links against
# the headers and stub libraries of glibc 2.28, which zig carries for every
# glibc version, so the result runs on any glibc >= 2.28 and needs no old
# sysroot, container or root. 2.28 is torch's own floor (its wheels are
# manylinux_2_28): an older tag would let pip install goddp where torch
# cannot go. MANYLINUX=2_17 builds one for glibc 2.17 all the same.
# The alternatives, and why not: the manylinux containers (the reference,
# but need a container runtime this machine has not); a Debian or CentOS
# sysroot (no such package carries an old enough glibc for gcc here); and
# gcc with symbol-version pinning (.symver) by hand, which breaks with every
# new symbol. scripts/check_wheel.py checks the result (Note [Wheel checks]).
VERSION      := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/goddp/__init__.py)
MANYLINUX    ?= 2_28
WHEEL_PLAT   := manylinux_$(MANYLINUX)_x86_64
SDIST        := dist/goddp-$(VERSION).tar.gz
WHEEL_STAMP  := dist/.goddp-$(VERSION)-$(WHEEL_PLAT).stamp
WHEEL_BUILD  := $(BUILD)/wheel
# zig cc turns UBSan on by default; its runtime would pull some 70 more libc
# symbols (statx: glibc 2.28) into the extension, so it is turned off.
ZIG_CC       := $(abspath $(PY)) -m ziglang cc -target x86_64-linux-gnu.$(subst _,.,$(MANYLINUX)) -fno-sanitize=undefined
# Debug sections are dropped (2 MB instead of 8); the symbol table and Go's
# own tables, which its tracebacks read, stay.
ZIG_LDSHARED := $(ZIG_CC) -shared -O2 -Wl,--strip-debug
PKG_SRC      := $(shell find python/goddp -name '*.py')
DIST_SRC     := $(GO_SRC) go.sum csrc/goddp.h csrc/goddp_module.c setup.py pyproject.toml MANIFEST.in README.md $(PKG_SRC)

$(VENV)/.wheel-tools: $(VENV)/.requirements requirements-wheel.txt
	$(UV_PIP) -r requirements-wheel.txt
	touch $@

wheel-tools: $(VENV)/.wheel-tools ## Install the pinned wheel toolchain (zig cc, auditwheel) into .venv

$(SDIST): $(VENV)/.wheel-tools $(DIST_SRC)
	rm -f dist/goddp-*.tar.gz
	$(PY) -m build -q --sdist --no-isolation --outdir dist .

sdist: $(SDIST) ## Build dist/goddp-VERSION.tar.gz (installing it builds the Go core: needs Go >= 1.26 and a C compiler)

# The wheel is built from the sdist, so a file missing from the sdist breaks
# the wheel too; it is checked in $(WHEEL_BUILD) and only then moved to dist/.
$(WHEEL_STAMP): $(SDIST) $(VENV)/.wheel-tools scripts/check_wheel.py
	rm -rf $(WHEEL_BUILD) && mkdir -p $(WHEEL_BUILD)
	CC="$(ZIG_CC)" LDSHARED="$(ZIG_LDSHARED)" CFLAGS= LDFLAGS= \
	    ZIG_GLOBAL_CACHE_DIR=$(abspath $(BUILD))/zig-cache ZIG_LOCAL_CACHE_DIR=$(abspath $(BUILD))/zig-cache \
	    $(PIP) wheel -q --no-deps --no-build-isolation --no-cache-dir -w $(WHEEL_BUILD) $(SDIST)
	$(PY) -m wheel tags --remove --platform-tag $(WHEEL_PLAT) $(WHEEL_BUILD)/goddp-$(VERSION)-*.whl
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) scripts/check_wheel.py --max-manylinux 2_28 --abi3 $(WHEEL_BUILD)/goddp-$(VERSION)-*.whl
	rm -f dist/goddp-*.whl dist/.goddp-*.stamp
	mv $(WHEEL_BUILD)/goddp-$(VERSION)-*.whl dist/
	touch $@

wheel: $(WHEEL_STAMP) ## Build and check dist/goddp-VERSION-cp310-abi3-manylinux_2_28_x86_64.whl (installs without Go)

# The user's path (tests/wheel): the wheel in a fresh venv with no Go on PATH,
# a 2-rank training from outside the checkout; the sdist without Go; the one
# abi3 extension on every CPython >= 3.10 found here.
test-wheel: $(WHEEL_STAMP) ## The user's path: install the wheel without Go, train 2 ranks outside the checkout; the sdist without Go
	GODDP_WHEEL="$$(ls dist/goddp-$(VERSION)-*.whl)" GODDP_SDIST=$(SDIST) OMP_NUM_THREADS=1 $(DNS_GIVES_UP) \
	    $(PY) -m pytest -q -p no:cacheprovider tests/wheel

# ---------------------------------------------------------------------------
# Other torch releases: `make test-torch TORCH=2.14.1`.
#
# Its own venv, .venv-torch-$(TORCH), with that torch and the rest of
# requirements-dev.txt, and goddp installed editable from this checkout (the
# abi3 extension built in place serves .venv and it alike); then the
# one-process suites and the two-rank suites, as `make test` runs them.
TORCH       ?=
TORCH_VENV  := .venv-torch-$(TORCH)
TORCH_PY    := $(TORCH_VENV)/bin/python

$(TORCH_VENV)/.requirements: requirements-dev.txt
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=x.y.z (a torch release on PyPI, e.g. 2.14.1)"; exit 2; }
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install -q --upgrade pip
	grep -v '^torch==' requirements-dev.txt > $(TORCH_VENV)/requirements.txt
	$(TORCH_PY) -m pip install -q torch==$(TORCH) -r $(TORCH_VENV)/requirements.txt
	$(TORCH_PY) -c 'import torch, sys; v = torch.__version__.split("+")[0]; sys.exit(0 if v == "$(TORCH)" else f"installed torch {v}, not $(TORCH)")'
	touch $@

$(TORCH_VENV)/.goddp: $(TORCH_VENV)/.requirements $(GO_SRC) csrc/goddp.h csrc/goddp_module.c setup.py pyproject.toml
	rm -f python/goddp/_goddp.cpython-*.so
	$(TORCH_PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

test-torch: $(TORCH_VENV)/.goddp $(HOOKDIR)/.ext ## Python suites (one-process, then two ranks) against torch TORCH=x.y.z in .venv-torch-x.y.z
	GODDP_TESTS_TORCHRUN_LATER=1 $(SUITE_ENV) $(TORCH_PY) -m pytest -q -rs -p no:cacheprovider $(ON_EVERY_CORE) tests/python
	$(SUITE_ENV) $(TORCH_VENV)/bin/torchrun $(TWO_RANKS)

# Within `make test` the plain pytest step leaves the two-rank cases to
# pytest-dist instead of launching torchrun for them itself (tests/python/_dist_util.py).
# The Go unit tests and the C tests run beside the making of .venv (neither
# keeps both cores busy); the one-process suite then has every core. The
# two-rank suite leaves about a quarter of them idle (its ranks wait on each
# other and on the rank-safety cases' deliberate delays): the Go fuzz runs
# and the wheel's build fill that (test-beside) under SCHED_IDLE, which
# gives way at once to any other process that wants a core (nice 19 where
# there is no chrt); the wheel's tests follow.
test: ## Run every test: Go, C, Python, Python under torchrun, the wheel's user path
	$(MAKE) --no-print-directory -j2 --output-sync=target gounit ctest install testhooks
	$(MAKE) --no-print-directory -j1 pytest PYTEST_ENV=GODDP_TESTS_TORCHRUN_LATER=1
	$(MAKE) --no-print-directory -j2 pytest-dist test-beside
	$(MAKE) --no-print-directory -j1 test-wheel

# pytest-dist streams its output; the work beside it prints each target's
# when that target is done. BESIDE is probed only when test-beside runs.
BESIDE = $(shell chrt --idle 0 true >/dev/null 2>&1 && echo chrt --idle 0 || echo nice -n 19)
test-beside: install
	$(BESIDE) $(MAKE) --no-print-directory --output-sync=target gofuzz wheel

demo: install ## goddp vs torch.compile(DDP), DDPOptimizer, regional: GPT, Inductor, 2 CPU ranks (~140 s of CPU)
	OMP_NUM_THREADS=1 $(TORCHRUN) --standalone --nproc_per_node=2 -m bench.demo

gpu-check: install ## goddp on one CUDA GPU (< 8 min): NCCL, Inductor, goddp.trace, bf16; on CPU if there is none
	$(PY) -m bench.gpu_check

bench: install ## Quick benchmarks (< 10 min): shaped two-host link, compile overhead
	$(PY) -m bench.run --quick

bench-full: install ## Full benchmarks (long)
	$(PY) -m bench.run --full

clean: ## Remove build outputs and dist/ (keeps .venv)
	rm -rf $(BUILD) dist *.egg-info python/*.egg-info python/goddp/_goddp*.so $(VENV)/.goddp
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
