# packed BERT. `make help` lists the targets.
#   make run    set up the virtual environment and run the main job
#   make test   set up the virtual environment and run the test suite
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
HIST    := benchmarks/histograms

.PHONY: help setup run test bench clean
help:
	@echo "make run    set up $(VENV) and run the main job (packing report on the shipped histograms)"
	@echo "make test   set up $(VENV) and run the tests"
	@echo "make bench  packing benchmark against the issue's goals"
	@echo "make setup  only create/update $(VENV) from requirements.txt"

setup: $(VENV)/.installed

# torch first, from the CPU wheel, so that pip never pulls CUDA packages; then the pinned rest.
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

run: setup
	$(PY) -m bert_ipu.packing --histogram $(HIST)/wikipedia_512.json --plot wikipedia_512_packing.png
	$(PY) -m bert_ipu.packing --histogram $(HIST)/squad_1_1_384.json --plot squad_1_1_384_packing.png

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/packing_benchmark.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *_packing.png
