# packed BERT. `make help` lists the targets.
#   make        set up the virtual environment and build the custom op
#   make run    ... and run the main job
#   make test   ... and run the test suite
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
HIST    := benchmarks/histograms
OPS_LIB := bert_ipu/bert_ipu_ops.so
OPS_SRC := $(wildcard custom_ops/*.cpp custom_ops/*.cu custom_ops/*.h) custom_ops/build.py

.PHONY: all help setup extras ops run report test coverage bench docs clean wikipedia
all: ops

help:
	@echo "make        set up $(VENV) and build the custom op ($(OPS_LIB))"
	@echo "make run    ... then the main job: pretrain a small packed BERT on the built-in corpus (CPU, minutes)"
	@echo "make report ... the packing report on the shipped histograms and the built-in corpus"
	@echo "make wikipedia DUMP=FILE  ... a Wikipedia dump -> packed shards -> BERT-large phase 1 and phase 2 [ENGINE=dask [ADDRESS=HOST:PORT]]"
	@echo "make test   ... then the tests"
	@echo "make coverage  ... the tests under coverage.py: line coverage of bert_ipu/, subprocesses included"
	@echo "make bench  packing, model and data benchmarks (print figures)"
	@echo "make docs   ... the documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link fails"
	@echo "make setup  only create/update $(VENV) from requirements.txt"
	@echo "make extras ... and the optional requirements-benchmarks.txt (trackers of train.report_to, benchmark peers)"
	@echo "make clean  remove $(VENV), the build and the custom op, test caches, runs/, the report's plots and site/"

setup: $(VENV)/.installed

# torch first, from the CPU wheel, so that pip never pulls CUDA packages; then the pinned rest.
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

# the optional packages (requirements-benchmarks.txt): the experiment trackers of train.report_to (W&B, MLflow) and
# the benchmarks' peers. The library imports none of them unless asked; `make test` installs them so that their
# tests (tests/test_metrics_report.py) run instead of skipping.
extras: $(VENV)/.extras
$(VENV)/.extras: requirements-benchmarks.txt $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-benchmarks.txt
	touch $@

# CPU kernel always; CUDA kernel too when nvcc and a CUDA build of torch are present (build.py says which)
ops: $(OPS_LIB)
$(OPS_LIB): $(OPS_SRC) $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) custom_ops/build.py

RUNS := runs
# the main job: built-in corpus -> packed shards -> a small BERT pretrained on the CPU -> HF export
run: ops
	$(PY) run_pretraining.py --config pretrain_tiny_128_packed --overwrite  # the demo replaces its previous run

# the real-data chain: a Wikipedia dump -> text -> instances at 128 and 512 -> packed shards -> phase 1 at 128 ->
# phase 2 at 512 from phase 1's export. make wikipedia DUMP=enwiki-...-pages-articles.xml.bz2 [WORKERS=8]
# [STAGES=4|1] [ARGS="train.max_steps=..."] [ENGINE=dask [ADDRESS=HOST:PORT]]; every step skips what an earlier run
# completed. ENGINE=dask runs the three data steps on a Dask cluster: the one at ADDRESS, or a local one of WORKERS.
# ARGS go to both phases, PHASE1_ARGS / PHASE2_ARGS to one (e.g. output_dir: phase 2 then reads phase 1's export
# from there, PHASE2_ARGS="output_dir=B model.init_checkpoint=A/hf").
DUMP    ?=
WORKERS ?= 2
ENGINE  ?= local
ADDRESS ?=
DATA_ENGINE := --workers $(WORKERS) --engine $(ENGINE) $(if $(ADDRESS),--address $(ADDRESS),)
STAGES  ?= 4
VALIDATION ?= 0.02
WIKI    := $(RUNS)/data/wikipedia
STAGE_ARGS := parallel.pipeline_stages=$(STAGES) $(if $(filter 4,$(STAGES)),,parallel.layers_per_stage=null)
wikipedia: ops
	@test -n "$(DUMP)" || { echo "usage: make wikipedia DUMP=enwiki-...-pages-articles.xml.bz2 [WORKERS=N] [STAGES=4|1] [ENGINE=dask [ADDRESS=HOST:PORT]]"; exit 2; }
	$(PY) data/prepare_wikipedia.py --dump $(DUMP) --output $(WIKI)_text $(DATA_ENGINE)
	for S in 128 512; do \
	  $(PY) data/create_pretraining_data.py --input $(WIKI)_text --output $(WIKI)_$${S}_instances --if-changed \
	    --max-seq-length $$S $(DATA_ENGINE) --validation-fraction $(VALIDATION) || exit $$?; \
	  $(PY) data/pack_pretraining_data.py --input $(WIKI)_$${S}_instances --output $(WIKI)_$${S}_packed \
	    --if-changed $(DATA_ENGINE) || exit $$?; \
	done
	$(PY) run_pretraining.py --config pretrain_large_128_packed --auto-resume $(STAGE_ARGS) $(ARGS) $(PHASE1_ARGS)
	$(PY) run_pretraining.py --config pretrain_large_512_packed --auto-resume $(STAGE_ARGS) $(ARGS) $(PHASE2_ARGS)

# the packing report on the paper's histograms, and one decoded pack of the built-in corpus
report: ops
	$(PY) -m bert_ipu.packing --histogram $(HIST)/wikipedia_512.json --plot wikipedia_512_packing.png
	$(PY) -m bert_ipu.packing --histogram $(HIST)/squad_1_1_384.json --plot squad_1_1_384_packing.png
	$(PY) data/create_pretraining_data.py --output $(RUNS)/report/instances_128 --overwrite
	$(PY) data/pack_pretraining_data.py --input $(RUNS)/report/instances_128 --output $(RUNS)/report/packed_128 --overwrite
	$(PY) data/inspect_packed_data.py $(RUNS)/report/packed_128

# two pytest-xdist workers (this machine has 2 cores), a test file each at a time: a file's tests share its module
# fixtures (a launch of processes, a corpus) on one worker. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: ops extras
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# line coverage of bert_ipu/ by the whole suite, the processes the tests start included (pyproject.toml
# [tool.coverage]); slower than `make test`, which it leaves alone
coverage: ops extras
	rm -f .coverage .coverage.*
	HF_HUB_OFFLINE=1 $(PY) -m coverage run -m pytest -q -n $(TEST_WORKERS) --dist loadfile
	$(PY) -m coverage combine -q
	$(PY) -m coverage report

bench: ops
	$(PY) benchmarks/packing_benchmark.py
	$(PY) benchmarks/model_benchmark.py
	$(PY) benchmarks/data_benchmark.py

# the documentation site: docs/*.md -> site/ (MkDocs Material, offline; a broken link or anchor, or a page
# missing from the nav, is an error)
docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis *_packing.png $(OPS_LIB) $(RUNS) site .coverage .coverage.* htmlcov
