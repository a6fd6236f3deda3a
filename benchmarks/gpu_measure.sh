#!/usr/bin/env bash
# The GPU measurements of issue 29, in stages that each fit one 10-minute command on a lent H100/H200:
#
#   bash benchmarks/gpu_measure.sh STAGE [STAGE ...]        (from the repository root)
#
#   setup    the machine and software (nvidia-smi, torch, transformers), the carried wheels, the op's CUDA build
#   tests    every CUDA test: the op against its reference and opcheck on cuda, packed == unpacked per backend
#            in float32 and bf16 (BERT pretraining, SQuAD, GLUE heads, GPT-2, Llama), the GPU benchmarks' checks
#   bert     the profiling table: BERT-large at 512 on Wikipedia-512, bf16, NONE SORT GREEDY SPFHP NNLSHP CGHP,
#            backends mask flex varlen, transformers' BertForPreTraining (sdpa) as the baseline, MFU
#   compile  the same model, NONE and CGHP, eager against torch.compile and CUDA graphs, per backend
#   llama    packed Llama-1.1B SFT on long-context lengths at 8K and 32K: varlen and flex against transformers'
#            padding-free path (DataCollatorWithFlattening) with sdpa and flex
#   squad    the SQuAD fine-tuning speed-up at BERT-large size
#   smoke    every stage's Python at toy sizes on the CPU (what tests/test_gpu_benchmarks.py runs in CI)
#   quick    one short device call for issues 37 and 38, by priority under DEADLINE seconds (default 380), each
#            part under its own cap: the GPU tests (no host sync in a step; compiled and CUDA-graph steps equal
#            eager; varlen and flex), where a BERT-large layer's time goes per attention variant
#            (benchmarks/bert_layer.py), the training application (BERT-large 512 packed: the step compiled, then
#            each layer compiled, then varlen, then flex), packed Llama-1.1B at 8K against transformers'
#            padding-free path, then (time permitting) the application with CUDA graphs, the profile's compiled
#            rows (and the application's step, --engine) against transformers compiled, then Llama at 8K and 32K
#            with CUDA graphs and the chunked loss. QUICK=part,part picks parts; DATA=folder a dataset carried in
#
# Each stage writes under ${OUT:-runs/gpu}/STAGE* and prints a short table last. PY is the Python with torch
# (default python3). On the device machine: `setup` first in every fresh machine (it installs the wheels that
# benchmarks/gpu_wheels.sh put in .whl/, which the device call must carry); its PYTHONPATH is exported by
# every stage. Sizes: MICRO (BERT micro-batch, default 16), ROUNDS (default 5).
set -euo pipefail
PY=${PY:-python3}
OUT=${OUT:-runs/gpu}
MICRO=${MICRO:-16}
ROUNDS=${ROUNDS:-5}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # the project itself, uninstalled

stage_setup() {
    if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        [ -d .whl/vocab_only ] && cp -r .whl/vocab_only/. /tmp/site/
        export PYTHONPATH="/tmp/site:$PYTHONPATH"
    fi
    { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
      $PY - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
for name in ("transformers", "tokenizers", "numpy", "scipy", "datasets", "pytorch_optimizer", "triton", "flash_attn"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "missing:", type(e).__name__)
EOF
    } 2>&1 | tee "$OUT/setup.txt"
    # the custom op with its CUDA kernel (build.py builds it when nvcc and a CUDA torch are present)
    PATH="$(dirname "$(command -v $PY)"):$PATH" $PY custom_ops/build.py 2>&1 | tee "$OUT/build.log"
}

stage_tests() {
    # the files with CUDA cases; everything else is device-independent and runs in CI. -rs lists the skips.
    $PY -m pytest -q -rs -p no:cacheprovider --timeout 300 tests/test_ops.py tests/test_modeling.py \
        tests/test_causal_lm.py tests/test_glue_model.py tests/test_squad.py tests/test_profiling.py \
        tests/test_gpu_benchmarks.py 2>&1 | tee "$OUT/tests.log"
}

stage_bert() {
    $PY run_profiling.py --config profile_large_512 --algorithms none sort greedy spfhp nnlshp cghp \
        --backends mask flex varlen --hf-baseline profile.precision=bf16 profile.micro_batch_size="$MICRO" \
        profile.rounds="$ROUNDS" --json "$OUT/bert_large_512.jsonl" --plot "$OUT/bert_large_512.png" \
        2>&1 | tee "$OUT/bert_large_512.txt"
}

stage_compile() {
    $PY run_profiling.py --config profile_large_512 --algorithms none cghp --backends mask flex varlen \
        --hf-baseline --step-modes eager compile cudagraphs profile.precision=bf16 \
        profile.micro_batch_size="$MICRO" profile.rounds="$ROUNDS" --json "$OUT/bert_compile.jsonl" \
        2>&1 | tee "$OUT/bert_compile.txt"
}

stage_llama() {
    $PY benchmarks/llama_long_context.py --model 1b --pack-length 8192 32768 \
        --variants varlen flex hf-sdpa hf-flex hf-flash --steps 4 --rounds 3 --json "$OUT/llama.jsonl" \
        2>&1 | tee "$OUT/llama.txt"
}

stage_squad() {
    $PY benchmarks/squad_speedup.py --size large --micro-batch "$MICRO" --precision bf16 \
        --json "$OUT/squad_large.json" 2>&1 | tee "$OUT/squad_large.txt"
}

stage_smoke() {
    # toy sizes on whatever device is there (the CPU in CI): the scripts' argument handling and code paths
    local hist="$OUT/smoke_hist.json"
    $PY -c "import json; c=[0]*64; c[9]=50; c[29]=30; c[59]=10; print(json.dumps(c))" > "$hist"
    printf 'name: smoke\nmodel: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 64}\nprofile: {histogram: %s, steps: 1, rounds: 2, micro_batch_size: 2}\n' \
        "$hist" > "$OUT/smoke.yaml"
    $PY run_profiling.py --config "$OUT/smoke.yaml" --algorithms none sort cghp --backends mask varlen \
        --hf-baseline --json "$OUT/smoke_profile.jsonl" 2>&1 | tee "$OUT/smoke.txt"
    $PY benchmarks/llama_long_context.py --model tiny --pack-length 256 --micro-batch 2 --steps 1 --rounds 2 \
        --sequences 300 --variants varlen mask hf-sdpa --json "$OUT/smoke_llama.jsonl" 2>&1 | tee -a "$OUT/smoke.txt"
    $PY benchmarks/bert_layer.py --hidden 64 --heads 4 --intermediate 128 --micro-batch 2 --iters 2 --no-compile \
        --variants mask dense none --json "$OUT/smoke_layer.jsonl" 2>&1 | tee -a "$OUT/smoke.txt"
}

# the training application as a user runs it on one GPU: the GPU config's global batch of 1024 packs (32
# micro-batches of 32 an update, so the optimizer step is amortised as in a real run), 5 updates, a row each;
# DATA: a built dataset carried into the call (else the first part that needs it makes the built-in corpus: seconds);
# APP_ARGS: more overrides for every application part (e.g. train.micro_batch_size=64)
APP="$PY run_pretraining.py --config pretrain_large_512_packed_gpu --overwrite train.max_steps=${APP_STEPS:-5}
     train.log_every=1 train.validate_every=null train.checkpoint_every=null train.report_to=none
     data.dataset=${DATA:-/tmp/builtin_512_packed} ${APP_ARGS:-}"

stage_quick() {
    local start=$SECONDS deadline=${DEADLINE:-380} parts=${QUICK:-tests,layer,app,app_layers,app_varlen,app_flex,llama,cudagraphs,profile,llama_next}
    part() {  # NAME CAP COMMAND...: skipped when not asked for or when fewer than 25 s are left
        local name=$1 cap=$2; shift 2
        [[ ",$parts," == *",$name,"* ]] || return 0
        local left=$(( deadline - (SECONDS - start) )); local t=$(( cap < left ? cap : left ))
        if [ "$t" -lt 25 ]; then echo "== $name skipped: $t s left"; return 0; fi
        echo "== $name (cap $t s) starts at $((SECONDS - start)) s"
        local rc=0
        timeout -k 5 "$t" "$@" > "$OUT/quick_$name.log" 2>&1 || rc=$?
        echo "== $name rc=$rc ends at $((SECONDS - start)) s"
        { grep -v "^\s*$" "$OUT/quick_$name.log" | grep -v "Warning\|warn(" | tail -n "${TAILN:-14}" | cut -c1-200; } || true
    }
    part tests 100 $PY -m pytest -q -rs -p no:cacheprovider -n 4 --timeout 150 -k "cuda or gpu_step" \
        tests/test_gpu_step.py tests/test_causal_lm.py tests/test_modeling.py
    part layer 150 $PY benchmarks/bert_layer.py --json "$OUT/quick_layer.jsonl"
    part app 130 $APP output_dir=/tmp/app_compile
    part app_layers 100 $APP output_dir=/tmp/app_layers train.compile=layers
    part app_varlen 130 $APP output_dir=/tmp/app_varlen model.attention_backend=varlen
    part app_flex 130 $APP output_dir=/tmp/app_flex model.attention_backend=flex
    part llama 150 $PY benchmarks/llama_long_context.py --model 1b --pack-length 8192 --steps 3 --rounds 3 \
        --variants varlen varlen+compile flex hf-flex hf-sdpa --json "$OUT/quick_llama.jsonl"
    part cudagraphs 110 $APP output_dir=/tmp/app_cudagraphs train.compile=cudagraphs
    part profile 160 $PY run_profiling.py --config profile_large_512 --algorithms none cghp --backends mask \
        --hf-baseline --engine --step-modes compile profile.precision=bf16 profile.micro_batch_size=32 profile.rounds=3 \
        --json "$OUT/quick_profile.jsonl"
    part llama_next 200 $PY benchmarks/llama_long_context.py --model 1b --pack-length 8192 32768 --steps 3 \
        --rounds 3 --loss-chunk 2048 --variants varlen+compile varlen+cudagraphs hf-flex \
        --json "$OUT/quick_llama_next.jsonl"
    for run in app_compile app_layers app_varlen app_flex app_cudagraphs; do  # the application's own metrics rows
        [ -f "/tmp/$run/metrics.jsonl" ] && cp "/tmp/$run/metrics.jsonl" "$OUT/quick_${run}_metrics.jsonl"
    done
    echo "== quick done at $((SECONDS - start)) s"
}

[ $# -ge 1 ] || { sed -n '2,27p' "$0"; exit 2; }
for stage in "$@"; do  # every stage named is checked before any runs (and before $OUT is made)
    case "$stage" in
        setup|tests|bert|compile|llama|squad|smoke|quick) ;;
        *) echo "gpu_measure.sh: unknown stage '$stage'; choose from setup tests bert compile llama squad smoke quick" >&2
           exit 2 ;;
    esac
done
mkdir -p "$OUT"
for stage in "$@"; do
    echo "== $stage"
    "stage_$stage"
done
