# Portcullis: `make run` serves the quickstart, `make test` runs everything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG := examples/quickstart/config.yaml
# setuptools always notes that an editable install maps packages through a finder
# (our folders are not named after the package); the note is information, not a problem.
EDITABLE_NOTE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: install install-dev run test lint policy-test agents-check wheel-check bench bench-peers bench-servers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(EDITABLE_NOTE) $(BIN)/pip install --quiet -e .
	touch $@

# Real OPA in-process for the regorus-vs-OPA differential test (dev only). Its wheel
# declares Requires-Python >=3.14 but runs on 3.11+, and pip cannot ignore that per
# dependency in pyproject, so it is installed here, pinned.
OPA_BINDINGS := opa-golib-python-bindings==0.4.4

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(EDITABLE_NOTE) $(BIN)/pip install --quiet -e '.[dev,ner]'
	$(BIN)/pip install --quiet --ignore-requires-python '$(OPA_BINDINGS)'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/portcullis serve --config $(CONFIG) --demo-key demo/alice

lint: install-dev
	$(BIN)/ruff check .

policy-test: install
	$(BIN)/portcullis policy test policies policy-tests

# The real Claude Code and opencode against the quickstart (npm; skipped when unreachable).
agents-check: install
	$(BIN)/python scripts/agents_check.py

# The wheel as users get it: built from the files git knows (the dev extra's pinned
# setuptools, no build isolation), checked to hold every module and data file, installed
# with its dependencies into a fresh venv (pip's cache), then `portcullis --help`,
# `policy test`, `policy init` and the quickstart answering one Anthropic and one OpenAI
# request. The wheel ships the gateway (and the default bundle's files, which `policy
# init` starts a bundle repository from); the bundle served and the configuration are
# the operator's: a wheel user runs, from a checkout (or with their own config and bundle),
#   pip install dist/portcullis-*.whl && portcullis serve --config examples/quickstart/config.yaml
# whose `../../policies` and `../../.portcullis` resolve beside the configuration.
# The wheel that passed is left in dist/.
wheel-check: install-dev
	$(BIN)/python scripts/wheel_smoke.py --dist dist

# PostgreSQL and Redis: $DATABASE_URL / $REDIS_URL when set, else the local servers on
# their standard ports, else throwaway servers that are stopped afterwards.
test: install-dev
	@eval "$$($(BIN)/python scripts/test_services.py start)" || exit 1; \
	status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/portcullis policy test policies policy-tests || status=1; \
	$(MAKE) --no-print-directory wheel-check || status=1; \
	$(BIN)/python -m pytest $(PYTEST_ARGS) || status=1; \
	$(BIN)/python scripts/test_services.py stop; \
	exit $$status

# The headline first (bench/pipeline.py), then the rest of bench/run.py, then each
# capability's bench. BENCH_ARGS goes to bench/run.py; with --only-headline or
# --only-routing nothing after it runs. About 15 minutes on two cores.
bench: install-dev
	@eval "$$($(BIN)/python scripts/test_services.py start)" || exit 1; \
	status=0; \
	$(BIN)/python bench/run.py $(BENCH_ARGS) || status=1; \
	case " $(BENCH_ARGS) " in *" --only-headline "*|*" --only-routing "*) \
		$(BIN)/python scripts/test_services.py stop; exit $$status;; esac; \
	$(BIN)/python bench/routing_layers.py || status=1; \
	$(BIN)/python bench/pii.py --duration 3 --streams 100 --samples 1000 || status=1; \
	$(BIN)/python -m bench.pii_accuracy --ner || status=1; \
	$(BIN)/python bench/integrity.py --duration 3 --streams 100 || status=1; \
	$(BIN)/python -m bench.injection_accuracy || status=1; \
	$(BIN)/python -m bench.injection_accuracy --corpus tests/injection_corpus_holdout.jsonl || status=1; \
	$(BIN)/python -m bench.intent_accuracy || status=1; \
	$(BIN)/python bench/audit_fsync.py || status=1; \
	$(BIN)/python scripts/test_services.py stop; \
	exit $$status

# The headline with LiteLLM's proxy beside it, installed once into .bench-peers/ (PyPI).
bench-peers: install-dev
	@eval "$$($(BIN)/python scripts/test_services.py start)" || exit 1; \
	status=0; \
	$(BIN)/python bench/run.py --only-headline --peers $(BENCH_ARGS) || status=1; \
	$(BIN)/python scripts/test_services.py stop; \
	exit $$status

# uvicorn + httptools vs granian, for the floor proxy and the gateway's app (measures only).
bench-servers: install-dev
	$(BIN)/python -m bench.servers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .portcullis .pytest_cache .ruff_cache build dist .bench-peers
