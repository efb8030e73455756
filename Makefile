# goddp. Every target installs what it needs: .venv with the pinned requirements,
# then goddp, editable. Why each step is as it is: docs/installing.md, docs/testing.md.

PYTHON   ?= python3
GO       ?= go
VENV     := .venv
PY       := $(VENV)/bin/python
PIP      := $(PY) -m pip
TORCHRUN := $(VENV)/bin/torchrun
BUILD    := build
LIBDIR   := $(BUILD)/lib
# Test variants (Go tag goddp_testhooks, C macro GODDP_TESTHOOKS): the panic hook, never shipped.
HOOKDIR  := $(BUILD)/testhooks
GO_SRC   := $(shell find planner bridge -name '*.go' -not -name '*_test.go') go.mod
export CGO_ENABLED := 1

.PHONY: help venv install lib testhooks ctest gotest gounit gofuzz pytest pytest-dist test demo gpu-check bench bench-full clean \
	wheel sdist wheel-tools test-wheel test-torch

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# uv (pinned here) installs the pinned requirements, bytecode compiled (docs/installing.md).
UV_PIP   := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
$(VENV)/.requirements: requirements-dev.txt
	@command -v $(GO) >/dev/null || { echo "error: Go 1.26+ is required (https://go.dev/dl); set GO=/path/to/go"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q uv==0.13.9
	$(UV_PIP) -r requirements-dev.txt
	touch $@
venv: $(VENV)/.requirements ## Create .venv with the pinned requirements

# Into .venv or a torch release's venv: python/goddp/libgoddp.so, built in place.
%/.goddp: %/.requirements $(GO_SRC) csrc/goddp.h setup.py pyproject.toml
	$(@D)/bin/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@
install: $(VENV)/.goddp ## Build the Go core and install goddp (editable) into .venv

$(LIBDIR)/libgoddp.so: $(GO_SRC) csrc/goddp.h
	$(GO) build -buildmode=c-shared -o $@ ./bridge
lib: $(LIBDIR)/libgoddp.so ## Build the shared library build/lib/libgoddp.so (+ Go's header)
$(HOOKDIR)/libgoddp.so: $(GO_SRC) csrc/goddp.h
	$(GO) build -tags goddp_testhooks -buildmode=c-shared -o $@ ./bridge
testhooks: $(HOOKDIR)/libgoddp.so ## Build the test-only library with the panic hook (the tests load it)
$(BUILD)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(LIBDIR)/libgoddp.so
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -Icsrc tests/c/plan_toy.c -o $@ \
	    -L$(LIBDIR) -Wl,-rpath,'$$ORIGIN/lib' -lgoddp -lpthread -ldl
$(HOOKDIR)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(HOOKDIR)/libgoddp.so
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -DGODDP_TESTHOOKS -Icsrc tests/c/plan_toy.c -o $@ \
	    -L$(HOOKDIR) -Wl,-rpath,'$$ORIGIN' -lgoddp -lpthread -ldl
ctest: $(BUILD)/plan_toy $(HOOKDIR)/plan_toy ## Plan a toy graph from C through libgoddp.so (shipped and test-hook builds)
	$(BUILD)/plan_toy
	$(HOOKDIR)/plan_toy

gotest: gounit gofuzz ## Go vet, unit tests (the race detector where goroutines run), short fuzz runs
# -race only where goroutines run: Note [The race detector where goroutines run] in docs/testing.md
gounit: ## Go vet, and the Go tests (bridge and concurrent planner tests under -race)
	$(GO) vet -tags goddp_testhooks ./...
	$(GO) test -race -count=1 -tags goddp_testhooks ./bridge
	$(GO) test -race -count=1 -run '^TestConcurrent' ./planner
	$(GO) test -count=1 -skip '^TestConcurrent' ./planner
# Counted in executions: a timed run can fail spuriously on a loaded machine (golang/go#75804).
gofuzz: ## Short counted fuzz runs (Build, the block rule, block plans, Decide, the body stacks, the checkpoint regions, the edge costs, the timeline)
	$(GO) test -run '^$$' -fuzz '^FuzzPlan$$' -fuzztime 100000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzBlockRule$$' -fuzztime 40000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzBlockPlan$$' -fuzztime 40000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime 25000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzBodies$$' -fuzztime 50000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzCheckpointRegions$$' -fuzztime 60000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzEdgeCosts$$' -fuzztime 40000x ./planner
	$(GO) test -run '^$$' -fuzz '^FuzzTimeline$$' -fuzztime 30000x ./planner

# Note [A lost DNS answer] in docs/testing.md
DNS_GIVES_UP   := RES_OPTIONS=timeout:1
# One pytest worker per core, one thread each (PYTEST_WORKERS=0: all in one process).
PYTEST_WORKERS ?= auto
SUITE_ENV      := OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 $(DNS_GIVES_UP)
ON_EVERY_CORE  := -n $(PYTEST_WORKERS) --dist worksteal
TWO_RANKS      := --standalone --nproc_per_node=2 -m pytest -q -p no:cacheprovider -m "not single_process" \
                  tests/python/*/test_dist_*.py
pytest: install $(HOOKDIR)/libgoddp.so ## Python suites, one process per core (each a 1-rank gloo group)
	$(PYTEST_ENV) $(SUITE_ENV) $(PY) -m pytest -q $(ON_EVERY_CORE) tests/python
pytest-dist: install $(HOOKDIR)/libgoddp.so ## The two-rank suites (test_dist_*) under torchrun (2 ranks, gloo)
	$(SUITE_ENV) $(TORCHRUN) $(TWO_RANKS)

# The wheel: zig cc against glibc 2.28 (Note [Manylinux toolchain] in docs/installing.md).
VERSION      := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/goddp/__init__.py)
MANYLINUX    ?= 2_28
WHEEL_PLAT   := manylinux_$(MANYLINUX)_x86_64
SDIST        := dist/goddp-$(VERSION).tar.gz
WHEEL_STAMP  := dist/.goddp-$(VERSION)-$(WHEEL_PLAT).stamp
ZIG_CC       := $(abspath $(PY)) -m ziglang cc -target x86_64-linux-gnu.$(subst _,.,$(MANYLINUX)) -fno-sanitize=undefined
DIST_SRC     := $(GO_SRC) go.sum csrc/goddp.h setup.py pyproject.toml MANIFEST.in README.md $(shell find python/goddp -name '*.py')
$(VENV)/.wheel-tools: $(VENV)/.requirements requirements-wheel.txt
	$(UV_PIP) -r requirements-wheel.txt
	touch $@
wheel-tools: $(VENV)/.wheel-tools ## Install the pinned wheel toolchain (zig cc, auditwheel) into .venv
$(SDIST): $(VENV)/.wheel-tools $(DIST_SRC)
	rm -f dist/goddp-*.tar.gz
	$(PY) -m build -q --sdist --no-isolation --outdir dist .
sdist: $(SDIST) ## Build dist/goddp-VERSION.tar.gz (installing it builds the Go core: needs Go >= 1.26 and a C compiler)
# Built from the sdist (so a file missing there fails here), checked, only then moved to dist/.
$(WHEEL_STAMP): $(SDIST) $(VENV)/.wheel-tools scripts/check_wheel.py
	rm -rf $(BUILD)/wheel && mkdir -p $(BUILD)/wheel
	CC="$(ZIG_CC)" CFLAGS= LDFLAGS= \
	    ZIG_GLOBAL_CACHE_DIR=$(abspath $(BUILD))/zig-cache ZIG_LOCAL_CACHE_DIR=$(abspath $(BUILD))/zig-cache \
	    $(PIP) wheel -q --no-deps --no-build-isolation --no-cache-dir -w $(BUILD)/wheel $(SDIST)
	$(PY) -m wheel tags --remove --platform-tag $(WHEEL_PLAT) $(BUILD)/wheel/goddp-$(VERSION)-*.whl
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) scripts/check_wheel.py --max-manylinux 2_28 $(BUILD)/wheel/goddp-$(VERSION)-*.whl
	rm -f dist/goddp-*.whl dist/.goddp-*.stamp
	mv $(BUILD)/wheel/goddp-$(VERSION)-*.whl dist/
	touch $@
wheel: $(WHEEL_STAMP) ## Build and check dist/goddp-VERSION-py3-none-manylinux_2_28_x86_64.whl (installs without Go)
test-wheel: $(WHEEL_STAMP) ## The user's path: install the wheel without Go, train 2 ranks outside the checkout; the sdist without Go
	GODDP_WHEEL="$$(ls dist/goddp-$(VERSION)-*.whl)" GODDP_SDIST=$(SDIST) OMP_NUM_THREADS=1 $(DNS_GIVES_UP) \
	    $(PY) -m pytest -q -p no:cacheprovider tests/wheel

# Another torch release in its own venv, goddp editable from this checkout (docs/installing.md).
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
test-torch: $(TORCH_VENV)/.goddp $(HOOKDIR)/libgoddp.so ## Python suites (one-process, then two ranks) against torch TORCH=x.y.z in .venv-torch-x.y.z
	GODDP_TESTS_TORCHRUN_LATER=1 $(SUITE_ENV) $(TORCH_PY) -m pytest -q -rs -p no:cacheprovider $(ON_EVERY_CORE) tests/python
	$(SUITE_ENV) $(TORCH_VENV)/bin/torchrun $(TWO_RANKS)

# scripts/test_all.sh runs the targets above in four steps, scheduled on the cores.
test: ## Run every test: Go, C, Python, Python under torchrun, the wheel's user path
	MAKE="$(MAKE)" scripts/test_all.sh

demo: install ## goddp vs torch.compile(DDP), DDPOptimizer, regional: a GPT with GPT-2's vocabulary, Inductor, 2 CPU ranks (~2 min)
	OMP_NUM_THREADS=1 $(TORCHRUN) --standalone --nproc_per_node=2 -m bench.demo
gpu-check: install ## goddp on one CUDA GPU (< 8 min): NCCL, Inductor, goddp.trace, bf16; on CPU if there is none
	$(PY) -m bench.gpu_check
bench: install ## Quick benchmarks (< 10 min): shaped two-host link, compile overhead
	$(PY) -m bench.run --quick
bench-full: install ## Full benchmarks (long)
	$(PY) -m bench.run --full
clean: ## Remove build outputs and dist/ (keeps .venv)
	rm -rf $(BUILD) dist *.egg-info python/*.egg-info python/goddp/*.so $(VENV)/.goddp
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
