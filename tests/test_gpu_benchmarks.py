"""The GPU measurements' scripts (issue 29), run small on the CPU so that a session lent a GPU spends its minutes
measuring, not debugging: benchmarks/llama_long_context.py (ours against Hugging Face's padding-free path) and
benchmarks/gpu_measure.sh's stages."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("llama_long_context", ROOT / "benchmarks" / "llama_long_context.py")
llc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llc)

SMALL = ["--model", "tiny", "--pack-length", "256", "--micro-batch", "3", "--steps", "2", "--rounds", "2", "--sequences", "500",
         "--device", "cpu"]


def test_packed_llama_and_hf_flattened_agree_on_the_first_loss(tmp_path):
    """Our packed rows (mask and reference attention) and transformers' LlamaForCausalLM on
    DataCollatorWithFlattening's rows of the same documents give the same loss in float32 (2e-5 relative: the
    two sum the same terms in another order); every variant is timed."""
    out = tmp_path / "rows.jsonl"
    assert llc.main([*SMALL, "--variants", "mask", "reference", "hf-sdpa", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["mask", "reference", "hf-sdpa"]
    losses = [r["first_loss"] for r in rows]
    assert max(losses) - min(losses) <= 2e-5 * abs(losses[0])
    assert all(r["tokens_per_second"] > 0 and len(r["step_ms"]) == 2 and not r["loss_off"] for r in rows)
    # the real tokens of a step are the documents' (no padding), the same for both layouts
    assert rows[0]["tokens_per_step"] == rows[2]["tokens_per_step"]


def test_a_cross_contaminated_row_is_flagged(tmp_path, monkeypatch):
    """Without position_ids, Hugging Face's flattened row is one long document (attention crosses documents):
    the script flags its loss and exits 1, so a wrong mask on the GPU cannot pass as a speed-up."""
    flattened = llc.flattened_rows

    def without_positions(docs):
        rows = flattened(docs)
        rows.pop("position_ids")
        return rows

    monkeypatch.setattr(llc, "flattened_rows", without_positions)
    out = tmp_path / "rows.jsonl"
    assert llc.main([*SMALL, "--variants", "mask", "hf-sdpa", "--json", str(out)]) == 1
    rows = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["hf-sdpa"]["loss_off"] and not rows["mask"]["loss_off"]


def test_useful_flops_count_matmuls_and_causal_attention():
    """6 x matmul parameters per token plus 6 x layers x hidden x len^2 (causal half of 12) per document."""
    config = llc.llama_config("tiny", 256)
    h, L, V, i = config.hidden_size, config.num_hidden_layers, config.vocab_size, config.intermediate_size
    kv = config.num_key_value_heads * h // config.num_attention_heads
    matmul = L * (2 * h * h + 2 * h * kv + 3 * h * i) + h * V
    assert llc.useful_flops(config, [10, 20]) == 6 * matmul * 30 + 6 * L * h * (100 + 400)


def test_varlen_is_skipped_on_the_cpu_with_its_reason(capsys):
    assert llc.main([*SMALL, "--variants", "varlen", "mask"]) == 0
    assert "varlen: skipped" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--rounds", "1"], ["--variants", "nope"]])
def test_bad_arguments_are_one_line(argv):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llama_long_context.py"), *SMALL, *argv],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_gpu_measure_smoke_stage_runs_every_script(tmp_path):
    """`gpu_measure.sh smoke`: the profile (with the HF baseline, varlen skipped with its reason off CUDA), the
    Llama and the layer benchmarks at toy sizes, through the same shell script a GPU session runs; an unknown
    stage is one line and exit 2."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PY": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", "benchmarks/gpu_measure.sh", "smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "smoke_profile.jsonl").read_text().splitlines()]
    assert {r["algorithm"] for r in rows} == {"none", "sort", "cghp", "hf"}
    llama = [json.loads(line) for line in (tmp_path / "smoke_llama.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in llama] == ["mask", "hf-sdpa"] and not any(r["loss_off"] for r in llama)
    layer = [json.loads(line) for line in (tmp_path / "smoke_layer.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in layer] == ["mask", "dense", "none"] and all(r["ms_per_layer"] > 0 for r in layer)
    bad = subprocess.run(["bash", "benchmarks/gpu_measure.sh", "nope"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown stage" in bad.stderr


def test_the_layer_benchmark_files_each_kernel_under_its_kind():
    """benchmarks/bert_layer.py's kernel split, on kernel names as torch.profiler reports them on an H100/H200:
    flash, memory-efficient and cuDNN attention carry matrix-product words in their names (cutlass, sm90) and must
    still count as attention; compiled FlexAttention is an inductor template."""
    spec = importlib.util.spec_from_file_location("bert_layer", ROOT / "benchmarks" / "bert_layer.py")
    layer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layer)
    names = {
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, true>(Flash_fwd_params)":
            "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<...>)": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1": "attention",
        "triton_tem_fused_0": "template",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off":
            "gemm",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN": "gemm",
        "triton_per_fused_add_native_layer_norm_1": "fused",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "other",
    }
    assert {n: layer.kind_of(n) for n in names} == names
