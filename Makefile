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

.PHONY: help venv install lib testhooks ctest gotest pytest pytest-dist test demo gpu-check bench bench-full clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.requirements: requirements-dev.txt
	@command -v $(GO) >/dev/null || { echo "error: Go 1.26+ is required (https://go.dev/dl); set GO=/path/to/go"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.requirements ## Create .venv with the pinned requirements

$(VENV)/.goddp: $(VENV)/.requirements $(GO_SRC) csrc/goddp.h csrc/goddp_module.c setup.py pyproject.toml
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

gotest: ## Go vet, unit tests with the race detector, a short fuzz run
	$(GO) vet ./...
	$(GO) vet -tags goddp_testhooks ./...
	$(GO) test -race -count=1 -tags goddp_testhooks ./...
	$(GO) test -run '^$$' -fuzz '^FuzzPlan$$' -fuzztime 20s ./planner

pytest: install $(HOOKDIR)/.ext ## Python suites in one process (a 1-rank gloo group)
	$(PYTEST_ENV) $(PY) -m pytest -q tests/python

# The backend and distributed suites again under torchrun: two ranks, gloo, CPU.
pytest-dist: install $(HOOKDIR)/.ext
	OMP_NUM_THREADS=1 $(TORCHRUN) --standalone --nproc_per_node=2 -m pytest -q -p no:cacheprovider -m "not single_process" \
	    tests/python/test_backend_*.py tests/python/test_dist_*.py

# Within `make test` the plain pytest step leaves the two-rank cases to
# pytest-dist instead of launching torchrun for them itself (tests/python/_dist_util.py).
test: PYTEST_ENV = GODDP_TESTS_TORCHRUN_LATER=1
test: gotest ctest pytest pytest-dist ## Run every test: Go, C, Python, Python under torchrun

demo: install ## goddp vs torch.compile(DDP), DDPOptimizer, regional: GPT, Inductor, 2 CPU ranks (~140 s of CPU)
	OMP_NUM_THREADS=1 $(TORCHRUN) --standalone --nproc_per_node=2 -m bench.demo

gpu-check: install ## goddp on one CUDA GPU (< 8 min): NCCL, Inductor, goddp.trace, bf16; on CPU if there is none
	$(PY) -m bench.gpu_check

bench: install ## Quick benchmarks (< 10 min): shaped two-host link, compile overhead
	$(PY) -m bench.run --quick

bench-full: install ## Full benchmarks (long)
	$(PY) -m bench.run --full

clean: ## Remove build outputs (keeps .venv)
	rm -rf $(BUILD) dist *.egg-info python/*.egg-info python/goddp/_goddp*.so $(VENV)/.goddp
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
