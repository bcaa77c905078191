# `make demo` and `make test` create and reuse .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

# Exact versions from constraints.txt (pyproject.toml only declares the supported ranges); its
# torch==2.13.0 is the CPU build on this project's machines, not a multi-GB CUDA one.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,demo]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/posbias demo

# pytest exit code 5 = no tests collected: not a failure for this target.
test: $(STAMP)
	@$(PY) -m pytest -q -ra; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-fast: $(STAMP)
	@$(PY) -m pytest -q -m "not slow and not integration"; rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

bench: $(STAMP)
	$(PY) bench/bench_qa.py

clean:
	rm -rf $(VENV) runs .pytest_cache
