# The two commands of the README:
#   make demo   set up (first time) and run the main job: a CPU sweep of optimizers x sizes x seeds -> report
#   make test   set up (first time) and run the test suite (what .ci/run calls) on every core (pytest-xdist)
# and for the inner loop (not in the README's two):
#   make test-fast   the suite without the tests marked slow or distributed: see the comment above its target
# constraints.txt pins torch==2.13.0: on a CPU-only machine that resolves to the local CPU build; on a GPU
# machine pip takes the normal CUDA build of the same version. Drop it to take the newest torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SWEEP ?= recipes/sweeps/cpu_demo.yaml
DEMO_DIR ?= runs/cpu_demo
PYTEST_ARGS ?=
# pytest-xdist: one worker per physical core (TEST_WORKERS=0: one process, TEST_WORKERS=2 on a shared box). Each test
# module runs on one worker, the multi-process and DeepSpeed tests together on one worker (tests/conftest.py:
# pytest_xdist_make_scheduler, ONE_WORKER). Workers share the data cache: concurrent builds of one entry are safe
# (hf_optbench.data.cache.store).
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --dist loadscope

.PHONY: setup demo test test-fast bench gpu-wheels gpu-check lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	@# setuptools warns at every editable install (a block of asterisks about folders named like the package): a
	@# warning filter keeps `make setup` quiet; pip's own errors still print
	@# --no-compile, then compileall on every core: pip compiles the installed files one after another (the whole
	@# set-up took 84.5 s with pip's compile, 72 s this way: two interleaved rounds each, 2-core AMD EPYC). Like pip,
	@# it passes over a file that does not compile (torch ships one for Python 3.12 syntax)
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[dev]"
	$(BIN)/python -c "import compileall, sys; compileall.compile_dir(sys.prefix + '/lib', quiet=2, workers=0)"
	touch $(STAMP)

setup: $(STAMP)

# The demo tunes, then compares (recipes/sweeps/cpu_demo.yaml: at each data ratio, its grid -> $(DEMO_DIR)/tuning,
# one tuned file per ratio, tuned_hparams__tpp<ratio>.yaml, then the comparison seeds). It keeps no checkpoints;
# its packed data goes to $HF_OPTBENCH_CACHE/data (default ~/.cache/hf_optbench/data): run
# `HF_OPTBENCH_CACHE=/elsewhere make demo` to put it elsewhere.
demo: setup
	$(BIN)/hf-optbench sweep $(SWEEP) --output-dir $(DEMO_DIR)
	$(BIN)/hf-optbench report $(DEMO_DIR)
	@echo "report: $(DEMO_DIR)/report/report.md (and report.html, summary.csv, *.png)"
	@echo "tuned values: $(DEMO_DIR)/tuned_hparams__tpp*.yaml (one file per data ratio); data cache: $${HF_OPTBENCH_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/hf_optbench}/data"

# The package's bytecode is written first (compileall: only files changed since the last time): the suite starts
# about a hundred Python processes (runs, sweeps, launches), and where PYTHONDONTWRITEBYTECODE is set none of them
# would keep its compilation of hf_optbench, each paying it again at start.
COMPILE := $(BIN)/python -m compileall -q -j 0 hf_optbench > /dev/null

test: setup
	$(COMPILE)
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The inner loop: the suite without the tests marked slow or distributed (in their files, or in tests/conftest.py's
# SLOW list: the README's commands as pasted, multi-process and DeepSpeed runs, kill-and-resume, real sweeps and
# pushes, the statistical error-rate checks, benchmark scripts and bad inputs run as processes). `make test` and CI
# (.ci/run) run them all.
test-fast: setup
	$(COMPILE)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not distributed" $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/run_all.py

# The GPU check (benchmarks/gpu_check.sh) runs on a lent GPU machine that reaches no registry: this
# downloads what its image lacks into .whl/ (git-ignored; the device tool carries it) and prints the total size,
# which must stay under 64 MiB with the project.
gpu-wheels: setup
	$(BIN)/python benchmarks/gpu_wheels.py --dest .whl

# Without a CUDA device it says in one line what it would run and exits 0; GPU_CHECK_REHEARSE=1 runs every step's
# code path on the CPU at toy shapes.
gpu-check:
	PYTHON=$${PYTHON:-python3} benchmarks/gpu_check.sh $${GPU_CHECK_OUT:-runs/gpu_check}

lint: setup
	$(BIN)/ruff check hf_optbench tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
