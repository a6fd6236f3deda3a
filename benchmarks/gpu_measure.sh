#!/usr/bin/env bash
# The GPU measurements of issue 8 in one command, for a machine with an NVIDIA GPU and a CUDA build of torch
# (run from the repository root; the Python that has torch, transformers, scipy, ... is $PY, default python3).
# Not yet run: no GPU was available when it was written. Writes everything under ${OUT:-runs/gpu}.
set -euo pipefail
PY=${PY:-python3}
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
# 1. the custom op with its CUDA kernel (build.py builds it when nvcc and a CUDA torch are present)
$PY custom_ops/build.py 2>&1 | tee "$OUT/build.log"
# 2. correctness on the GPU: the op (opcheck on cuda) and packed == unpacked per backend, fp32 and bf16
$PY -m pytest -q tests/test_ops.py tests/test_modeling.py -k "cuda" 2>&1 | tee "$OUT/tests.log"
# 3. the table: BERT-large at 512 on Wikipedia-512, bf16, every backend, HF baseline, MFU
$PY run_profiling.py --config profile_large_512 --algorithms none sort greedy spfhp nnlshp cghp \
    --backends mask flex varlen --hf-baseline profile.precision=bf16 --json "$OUT/large_512_bf16.jsonl" \
    --plot "$OUT/large_512_bf16.png" 2>&1 | tee "$OUT/large_512_bf16.txt"
# 4. SQuAD fine-tuning speed-up at BERT-large size
$PY benchmarks/squad_speedup.py --size large --micro-batch 8 --precision bf16 --json "$OUT/squad_large.json" 2>&1 | tee "$OUT/squad_large.txt"
