# The two set-up commands of the README: `make demo` and `make test`.
.PHONY: demo test lint bench

VENV := .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	bash scripts/bootstrap.sh
	touch $@

# The demo needs Baseline and scikit-learn (the demo tasks), not the test and lint tools.
$(VENV)/.installed-demo: pyproject.toml
	bash scripts/bootstrap.sh demo
	touch $@

demo: $(VENV)/.installed-demo
	$(VENV)/bin/baseline demo --port $${PORT:-8000}

test: $(VENV)/.installed
	bash scripts/test.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy && $(VENV)/bin/lint-imports

bench: $(VENV)/.installed
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done
