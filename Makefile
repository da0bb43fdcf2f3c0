# The two commands of the README:
#   make demo   set up (first time) and run the main job: a CPU sweep of optimizers x sizes x seeds -> report
#   make test   set up (first time) and run the test suite (what .ci/run calls)
# constraints.txt pins torch==2.13.0: on a CPU-only machine that resolves to the local CPU build; on a GPU
# machine pip takes the normal CUDA build of the same version. Drop it to take the newest torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SWEEP ?= recipes/sweeps/cpu_demo.yaml
DEMO_DIR ?= runs/cpu_demo
PYTEST_ARGS ?=

.PHONY: setup demo test bench lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# The demo tunes, then compares (recipes/sweeps/cpu_demo.yaml: grid -> $(DEMO_DIR)/tuning, tuned_hparams.yaml, then
# the comparison seeds). It keeps no checkpoints; its packed data goes to $HF_OPTBENCH_CACHE/data (default
# ~/.cache/hf_optbench/data): run `HF_OPTBENCH_CACHE=/elsewhere make demo` to put it elsewhere.
demo: setup
	$(BIN)/hf-optbench sweep $(SWEEP) --output-dir $(DEMO_DIR)
	$(BIN)/hf-optbench report $(DEMO_DIR)
	@echo "report: $(DEMO_DIR)/report/report.md (and report.html, summary.csv, *.png)"
	@echo "tuned learning rates: $(DEMO_DIR)/tuned_hparams.yaml; data cache: $${HF_OPTBENCH_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/hf_optbench}/data"

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/run_all.py

lint: setup
	$(BIN)/ruff check hf_optbench tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
