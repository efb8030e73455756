# goddp. Every target installs what it needs: .venv with the pinned requirements,
# then goddp, editable. Why each step is as it is: docs/installing.md, docs/testing.md.

PYTHON   ?= python3
GO       ?= go
VENV     := .venv
PY       := $(VENV)/bin/python
TORCHRUN := $(VENV)/bin/torchrun
BUILD    := build
LIBDIR   := $(BUILD)/lib
HOOKDIR  := $(BUILD)/testhooks
GO_SRC   := $(shell find planner bridge -name '*.go' -not -name '*_test.go') go.mod
export CGO_ENABLED := 1

.PHONY: help venv install lib testhooks ctest gotest gounit gofuzz pytest pytest-dist test demo gpu-check bench bench-full clean \
	wheel sdist wheel-tools test-wheel test-torch

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

UV_PIP   := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
$(VENV)/.requirements: requirements-dev.txt
	@command -v $(GO) >/dev/null || { echo "error: Go 1.26+ is required (https://go.dev/dl); set GO=/path/to/go"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==0.13.9
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
# $(call plan_toy,C flags,library's directory,its path from the program's)
plan_toy = $(CC) -std=c11 -Wall -Wextra -Werror -O2 $1 -Icsrc $< -o $@ -L$2 -Wl,-rpath,'$$ORIGIN$3' -lgoddp -lpthread -ldl
$(BUILD)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(LIBDIR)/libgoddp.so
	$(call plan_toy,,$(LIBDIR),/lib)
$(HOOKDIR)/plan_toy: tests/c/plan_toy.c csrc/goddp.h $(HOOKDIR)/libgoddp.so
	$(call plan_toy,-DGODDP_TESTHOOKS,$(HOOKDIR),)
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
# Name:executions for each of the planner's Fuzz* targets (planner/makefile_test.go fails on one
# left out). Counted, not timed: a timed run can fail spuriously on a loaded machine (golang/go#75804).
FUZZ_RUNS := Plan:100000 BlockRule:40000 BlockPlan:40000 Decide:25000 Bodies:50000 \
             CheckpointRegions:60000 EdgeCosts:40000 Timeline:30000
gofuzz: ## Short counted fuzz runs (Build, the block rule, block plans, Decide, the body stacks, the checkpoint regions, the edge costs, the timeline)
	$(foreach run,$(FUZZ_RUNS),$(GO) test -run '^$$' -fuzz '^Fuzz$(firstword $(subst :, ,$(run)))$$' -fuzztime $(lastword $(subst :, ,$(run)))x ./planner &&) true

# Note [A lost DNS answer] in docs/testing.md
DNS_GIVES_UP   := RES_OPTIONS=timeout:1
PYTEST_WORKERS ?= auto
SUITE_ENV      := OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 $(DNS_GIVES_UP)
ON_EVERY_CORE  := -n $(PYTEST_WORKERS) --dist worksteal
TWO_RANKS      := --standalone --nproc_per_node=2 -m pytest -q -p no:cacheprovider -m "not single_process" tests/python/*/test_dist_*.py
pytest: install $(HOOKDIR)/libgoddp.so ## Python suites, one process per core (each a 1-rank gloo group)
	$(PYTEST_ENV) $(SUITE_ENV) $(PY) -m pytest -q $(ON_EVERY_CORE) tests/python
pytest-dist: install $(HOOKDIR)/libgoddp.so ## The two-rank suites (test_dist_*) under torchrun (2 ranks, gloo)
	$(SUITE_ENV) $(TORCHRUN) $(TWO_RANKS)

# The wheel: zig cc against glibc 2.28 (Note [Manylinux toolchain] in docs/installing.md).
VERSION      := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/goddp/__init__.py)
MANYLINUX    ?= 2_28
SDIST        := dist/goddp-$(VERSION).tar.gz
WHEEL_STAMP  := dist/.goddp-$(VERSION)-manylinux_$(MANYLINUX)_x86_64.stamp
DIST_SRC     := $(GO_SRC) go.sum csrc/goddp.h setup.py pyproject.toml MANIFEST.in README.md $(shell find python/goddp -name '*.py')
$(VENV)/.wheel-tools: $(VENV)/.requirements requirements-wheel.txt
	$(UV_PIP) -r requirements-wheel.txt
	touch $@
wheel-tools: $(VENV)/.wheel-tools ## Install the pinned wheel toolchain (zig cc, auditwheel) into .venv
$(SDIST): $(VENV)/.wheel-tools $(DIST_SRC)
	rm -f dist/goddp-*.tar.gz
	$(PY) -m build -q --sdist --no-isolation --outdir dist .
sdist: $(SDIST) ## Build dist/goddp-VERSION.tar.gz (installing it builds the Go core: needs Go >= 1.26 and a C compiler)
$(WHEEL_STAMP): $(SDIST) $(VENV)/.wheel-tools scripts/build_wheel.sh scripts/check_wheel.py
	scripts/build_wheel.sh $(SDIST) $(MANYLINUX) $(VENV) $(BUILD)
	touch $@
wheel: $(WHEEL_STAMP) ## Build and check dist/goddp-VERSION-py3-none-manylinux_2_28_x86_64.whl (installs without Go)
test-wheel: $(WHEEL_STAMP) ## The user's path: install the wheel without Go, train 2 ranks outside the checkout; the sdist without Go
	GODDP_WHEEL="$$(ls dist/goddp-$(VERSION)-*.whl)" GODDP_SDIST=$(SDIST) OMP_NUM_THREADS=1 $(DNS_GIVES_UP) \
	    $(PY) -m pytest -q -p no:cacheprovider tests/wheel

# Another torch release in its own venv, goddp editable from this checkout (docs/installing.md).
TORCH_VENV  := .venv-torch-$(TORCH)
$(TORCH_VENV)/.requirements: requirements-dev.txt scripts/torch_venv.sh
	@PYTHON=$(PYTHON) scripts/torch_venv.sh "$(TORCH)" $(@D)
	touch $@
test-torch: $(TORCH_VENV)/.goddp $(HOOKDIR)/libgoddp.so ## Python suites (one-process, then two ranks) against torch TORCH=x.y.z in .venv-torch-x.y.z
	GODDP_TESTS_TORCHRUN_LATER=1 $(SUITE_ENV) $(TORCH_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider $(ON_EVERY_CORE) tests/python
	$(SUITE_ENV) $(TORCH_VENV)/bin/torchrun $(TWO_RANKS)
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
