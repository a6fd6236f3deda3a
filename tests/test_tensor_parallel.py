"""Tensor parallelism (bert_ipu/engine/tensor.py): a model split over 2 processes (gloo, CPU) computes what the
whole model computes; training at tensor 2, alone or with data or pipeline parallelism, ends where one process
ends; checkpoints resume across tensor-parallel sizes.

Tolerances: the model-level comparison runs in float64 (tests/tensor_parallel_worker.py), so a split model
must agree to rounding (1e-10 relative; measured 1e-14 to 1e-16). Training runs are float32 through the
whole engine; weights after 4 LAMB steps agree to 1e-4 relative, as the pipeline tests explain
(tests/test_training.py): LAMB divides each gradient by its RMS, so parameters whose gradient is nearly zero
(attention key biases) move by rounding noise of order lr in any two summation orders.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bert_ipu.config import ConfigError
from bert_ipu.tasks import load_config
from bert_ipu.engine.optim import ShardedLamb
from bert_ipu.engine.runtime import RunError
from bert_ipu.tasks import run as main
from training_helpers import call, copy_run, entry, final_weights, job, launch, run_cli, tiny

COMMON = ["model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=4",
          "train.checkpoint_every=2", "train.validate_every=2"]
DROPOUT = ["model.hidden_dropout_prob=0.1", "model.attention_probs_dropout_prob=0.1"]
# 64 examples an update: 8 packs of about 7.5, whole micro-batches of 8 (fewer examples would shrink the micro-batch)
GLUE = ["--config", "glue_tiny_packed", "train.max_steps=3", "train.num_train_epochs=1", "train.global_batch_size=64",
        "model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]  # the same numbers: no dropout
# the causal LM at tensor 2: test_causal_lm's TINY Llama with 2 key/value heads, 8 packs an update
CAUSAL = ["model.num_key_value_heads=2", "train.micro_batch_size=2", "train.batch_unit=packs",
          "train.global_batch_size=8"]


@pytest.fixture(scope="module")
def runs(dataset, tiny_run, tmp_path_factory):
    """Every run of this module at 2 processes, in one launch (tests/engine_worker.py): the split-model checks,
    then the tensor-2 runs the tests below compare with one process; the step-2 copies they resume are made
    inside the launch. Each test reads its runs' folders and printed lines; the one-process runs are the tests'
    own, in this process (tiny_run: the 4-step test_tiny run of one process)."""
    root = tmp_path_factory.mktemp("tensor2")
    tiny_cmd = ["--config", "test_tiny", f"data.dataset={dataset}", *COMMON]
    from test_causal_lm import TINY

    return root, launch(2, [
        call("split", "tensor_parallel_worker:checks"),
        job("two", *tiny_cmd, f"output_dir={root / 'two'}", "parallel.tensor_parallel=2"),
        copy_run(tiny_run, root / "one_to_two", "checkpoints/step-0000004", "results.json"),
        job("one_to_two", *tiny_cmd, f"output_dir={root / 'one_to_two'}", "parallel.tensor_parallel=2", "--resume"),
        job("straight", *tiny_cmd, *DROPOUT, f"output_dir={root / 'straight'}", "parallel.tensor_parallel=2"),
        copy_run(root / "straight", root / "resumed", "checkpoints/step-0000004"),
        job("resumed", *tiny_cmd, *DROPOUT, f"output_dir={root / 'resumed'}", "parallel.tensor_parallel=2",
            "--resume"),
        job("staged", *tiny_cmd, *DROPOUT, f"output_dir={root / 'staged'}", "parallel.pipeline_stages=2",
            "train.max_steps=2"),
        job("staged_to_tensor", *tiny_cmd, *DROPOUT, f"output_dir={root / 'staged'}", "parallel.tensor_parallel=2",
            "--resume"),
        job("glue", *GLUE, f"output_dir={root / 'glue'}", "parallel.tensor_parallel=2", script="run_glue.py"),
        job("causal", "--config", "sft_tiny_chat_packed", *TINY, *CAUSAL, f"output_dir={root / 'causal'}",
            "parallel.tensor_parallel=2", script="run_causal_lm.py"),
        job("bf16", *tiny_cmd, "train.precision=bf16", f"output_dir={root / 'bf16'}", "parallel.tensor_parallel=2"),
    ], root)


@pytest.fixture(scope="module")
def four(dataset, tmp_path_factory):
    """Tensor 2 x data 2 and tensor 2 x pipeline 2: one launch of 4 processes, and the one-process run both
    compare with (16 packs per update, 3 updates)."""
    root = tmp_path_factory.mktemp("tensor4")
    common = [f"data.dataset={dataset}", *COMMON[:2], "train.max_steps=3", "train.checkpoint_every=3",
              "train.validate_every=3", "train.micro_batch_size=4", "train.global_batch_size=16"]
    main(load_config("test_tiny", [*common, f"output_dir={root / 'one'}"]), progress=False)
    ran = launch(4, [job(other, "--config", "test_tiny", *common, f"output_dir={root / other}",
                         "parallel.tensor_parallel=2", *extra)
                     for other, extra in (("data", []), ("pipeline", ["parallel.pipeline_stages=2"]))], root)
    return root, ran


def assert_close_runs(one, other, weights=1e-4, losses=1e-5, keys=("loss", "val_loss", "val_mlm_accuracy")):
    a, b = final_weights(one), final_weights(other)
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < weights, name
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (other / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        for key in keys:
            if key in x:
                assert abs(x[key] - y[key]) <= losses * abs(x[key]) + 1e-7, (key, x[key], y[key])


def _lamb_pair(params, decayed: int):
    """Two copies of `params` and pytorch_optimizer's LAMB on one, ShardedLamb on the other, alike: weight decay on
    the first `decayed` parameters, none on the rest."""
    from pytorch_optimizer import Lamb

    a = [p.clone().requires_grad_() for p in params]
    b = [p.clone().requires_grad_() for p in params]
    lib = Lamb([{"params": a[:decayed], "weight_decay": 0.01}, {"params": a[decayed:], "weight_decay": 0.0}],
               lr=0.02, betas=(0.8, 0.99), eps=1e-6)
    ours = ShardedLamb([{"params": b[:decayed], "weight_decay": 0.01}, {"params": b[decayed:], "weight_decay": 0.0}],
                       lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)
    return a, b, lib, ours


def test_sharded_lamb_equals_pytorch_optimizer():
    """On whole (plain) tensors ShardedLamb is pytorch_optimizer's LAMB: weights and trust ratios after 3 steps
    with weight decay on one group and not the other, float64, to rounding."""
    torch.manual_seed(0)
    params = [torch.randn(5, 3, dtype=torch.float64), torch.randn(7, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)]
    a, b, lib, ours = _lamb_pair(params, decayed=2)
    for step in range(3):
        grads = [torch.randn_like(p) for p in params]
        for group, opt in ((a, lib), (b, ours)):
            for p, g in zip(group, grads):
                p.grad = g.clone()
            opt.step()
        for p, q in zip(a, b):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(torch.as_tensor(lib.state[p]["trust_ratio"], dtype=torch.float64),
                                       ours.state[q]["trust_ratio"], rtol=1e-12, atol=0)


def test_sharded_lamb_counts_updates_for_every_group_as_pytorch_optimizer_does():
    """A group whose parameters have no gradient for a few updates (Llama's no-decay group before its RMSNorms
    joined it, in a checkpoint resumed after) counts those updates as pytorch_optimizer's LAMB does: its first
    update after them is bias-corrected as the 3rd, not the 1st (its step was 4.7x too far)."""
    torch.manual_seed(0)
    params = [torch.randn(5, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)]
    a, b, lib, ours = _lamb_pair(params, decayed=1)
    for step in range(3):
        grads = [torch.randn_like(p) for p in params]
        for group, opt in ((a, lib), (b, ours)):
            for i, (p, g) in enumerate(zip(group, grads)):
                p.grad = g.clone() if i == 0 or step == 2 else None
            opt.step()
    assert [g["step"] for g in ours.param_groups] == [3, 3]
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def test_split_models_equal_whole_models(runs):
    """BERT for pretraining (vocabulary of 99 rows: split 50 + 49, nothing padded; the padding id and both
    sides of the split among the tokens) and a Llama causal LM with grouped-query attention, split over 2
    processes, give the whole model's loss, every gradient, LAMB's trust ratios (ShardedLamb on the split
    model vs pytorch_optimizer's LAMB on the whole one) and weights after 2 steps, float64, to 1e-10
    relative, and so does the global gradient norm that clipping uses (active: above max_norm); the tied
    embedding and decoder stay one parameter. Left out of gradients, trust ratios and
    weights, and checked by name: the only parameters whose gradient is zero up to rounding (BERT's attention
    key biases; softmax is invariant to them). With dropout on, the loss and every replicated gradient are
    bitwise equal on both ranks, and the attention cores' dropout leaves the shared generator untouched: it
    draws from each rank's own generator, which advances from layer to layer (other masks in every layer, on
    every rank)."""
    result = runs[1].ok("split")["value"]
    for model in ("bert", "llama"):
        r = result[model]
        assert r["loss"] < 1e-12, (model, r)
        for key in ("gradients", "trust_ratios", "weights", "clipped_norm"):
            assert r[key] < 1e-10, (model, key, r)
        assert r["norm"] > 0.1, r  # the clipping was active (the norm above max_norm)
        assert r["tied"], model
    assert result["bert"]["null"] == ["bert.encoder.layer.0.attention.self.key.bias",
                                      "bert.encoder.layer.1.attention.self.key.bias"]
    assert result["llama"]["null"] == []
    assert result["dropout_replicated_equal"]
    assert result["shared_generator_untouched"]
    assert result["layers_draw_apart"] and result["ranks_draw_apart"]


def test_tensor_parallel_training_equals_one_process_and_resumes_across_sizes(dataset, tiny_run, runs, tmp_path):
    """test_tiny pretrained at tensor 2 (2 processes, 8 packs per update in 2 micro-batches) ends with the
    weights (1e-4 relative) and losses (1e-5) of one process. Checkpoints hold whole tensors: the tensor-2 run
    resumed from its step-2 checkpoint on one process, and the one-process run resumed from its step-2
    checkpoint at tensor 2, each end where the uninterrupted runs end (1e-4)."""
    common = [f"data.dataset={dataset}", *COMMON]
    one, (root, ran) = tiny_run, runs
    two = root / "two"
    assert "tensor parallel over 2" in ran.ok("two")["stdout"]
    assert_close_runs(one, two)

    def resumed_copy(src, name):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        shutil.rmtree(dst / "checkpoints" / "step-0000004")
        (dst / "results.json").unlink()
        return dst

    down = resumed_copy(two, "two_to_one")
    main(load_config("test_tiny", [*common, f"output_dir={down}"]), resume=True, progress=False)
    assert_close_runs(two, down, keys=())
    up = root / "one_to_two"  # resumed_copy(one) at tensor 2, in the launch
    assert "now 1 x 1 x 1 x 2" in ran.ok("one_to_two")["stdout"]
    assert_close_runs(one, up, keys=())


@pytest.mark.parametrize("other", ["data", "pipeline"])
def test_tensor_times_data_or_pipeline_equals_one_process(four, other):
    """Tensor 2 x data 2 and tensor 2 x pipeline 2 (4 processes each) give the weights (3e-4 relative, one more
    summation order, as the pipeline x data test explains) and training losses (1e-5) of one process on the
    same 16 packs per update."""
    root, ran = four
    one, grid = root / "one", root / other
    stdout = ran.ok(other)["stdout"]
    assert "tensor parallel over 2" in stdout
    assert ("2 replica(s)" in stdout) == (other == "data")
    # (validation is split over replicas, or runs whole pipeline schedules of 4 micro-batches: other packs than
    # one process's 2 validation batches, so it is not compared)
    assert_close_runs(one, grid, weights=3e-4, keys=("loss", "sequences", "mlm_accuracy"))
    from transformers import BertForPreTraining  # the export holds the whole weights, as transformers loads them

    exported = BertForPreTraining.from_pretrained(str(grid / "hf")).state_dict()
    for name, weight in final_weights(grid).items():
        assert torch.equal(exported[name], weight), name


def test_tensor_parallel_bad_settings_are_one_line(dataset, tmp_path):
    """A tensor-parallel size below 1 is a config error; a size that does not divide the attention heads, or a
    model without a plan (GPT-2's fused c_attn), is a one-line RunError before anything is written."""
    from transformers import GPT2Config

    from bert_ipu.models.gpt2 import PackedGPT2LMHeadModel
    from bert_ipu.engine.parallel import tensor_plan
    from bert_ipu.tasks.causal_lm.task import CausalLMTask
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    with pytest.raises(ConfigError, match="parallel.tensor_parallel must be an integer >= 1"):
        tiny(dataset, tmp_path / "x", "parallel.tensor_parallel=0")
    cfg = tiny(dataset, tmp_path / "x")
    task = PretrainingTask(cfg)
    from transformers import BertConfig

    from bert_ipu.models.bert import PackedBertForPreTraining

    model = PackedBertForPreTraining(BertConfig(vocab_size=30, hidden_size=12, num_attention_heads=2,
                                                num_hidden_layers=1, intermediate_size=24))
    with pytest.raises(RunError, match=r"num_attention_heads \(2\) does not divide by parallel.tensor_parallel \(3\)"):
        tensor_plan(task, model, 3)
    gpt2 = PackedGPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=12, n_head=2, n_layer=1, n_positions=16))
    with pytest.raises(RunError, match="no tensor-parallel plan for PackedGPT2LMHeadModel"):
        tensor_plan(CausalLMTask.__new__(CausalLMTask), gpt2, 2)
    assert not (tmp_path / "x").exists()
    proc = run_cli("--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={tmp_path / 'y'}", *COMMON,
                   "parallel.tensor_parallel=3", "model.num_attention_heads=2", nproc=3, check=False)
    assert proc.returncode != 0  # each rank exits with 2; torchrun itself with 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: the model's num_attention_heads (2)"), proc.stderr[-2000:]
    assert not (tmp_path / "y").exists()


def test_glue_at_tensor_two_equals_one_process(runs, tmp_path):
    """A fine-tuning task on the same plan (BERT, replicated classification head): GLUE SST-2 fixture, 3 updates
    at tensor 2 end with the weights of one process (1e-4 relative) and predict the same dev labels (the
    evaluation gathers the whole model on every rank, then rank 0 scores it). (That `run_glue.py` started
    without torchrun launches its processes itself is test_engine's test_pipeline_config_launches_its_processes:
    the same launch for every kind.)"""
    assert entry("glue", [*GLUE, f"output_dir={tmp_path / 'one'}"]) == 0
    root, ran = runs
    stdout = ran.ok("glue")["stdout"]
    assert "tensor parallel over 2" in stdout
    a, b = final_weights(tmp_path / "one"), final_weights(root / "glue")
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 1e-4, name
    for path in sorted((tmp_path / "one").glob("predictions*.json")):
        assert json.loads(path.read_text()) == json.loads((root / "glue" / path.name).read_text()), path.name


def test_tensor_parallel_dropout_resumes_bitwise_and_replicas_stay_equal(runs):
    """With dropout on (0.1): a tensor-2 run resumed from its step-2 checkpoint ends bitwise equal to the
    uninterrupted run (the shared generator and each rank's attention-core generator are checkpointed); and a
    2-stage pipeline checkpoint (whose stages hold different generator states) resumed at tensor 2 gives both
    tensor ranks the same shared state: the replicated weights stay bitwise equal on both (the engine checks
    it at every checkpoint and stops if not)."""
    root, ran = runs
    for name in ("straight", "resumed", "staged"):
        ran.ok(name)
    a, b = final_weights(root / "straight"), final_weights(root / "resumed")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    stdout = ran.ok("staged_to_tensor")["stdout"]
    assert "now 1 x 1 x 1 x 2" in stdout and (root / "staged" / "checkpoints" / "step-0000004").is_dir()


def test_causal_lm_at_tensor_two_equals_one_process(runs, tmp_path):
    """The causal LM task (Llama, grouped-query attention with 2 key/value heads, tied lm_head split along the
    vocabulary, AdamW on DTensors) on the SFT chat fixture: 4 updates at tensor 2 end with the weights of one
    process (1e-4 relative: AdamW divides by the gradients' RMS, as LAMB) and the same validation loss (1e-5)."""
    from test_causal_lm import TINY

    one = tmp_path / "one"
    assert entry("causal_lm", ["--config", "sft_tiny_chat_packed", *TINY, *CAUSAL, f"output_dir={one}"]) == 0
    root, ran = runs
    assert "tensor parallel over 2" in ran.ok("causal")["stdout"]
    assert_close_runs(one, root / "causal", keys=("loss", "val_loss"))


def test_bf16_at_tensor_two_gives_the_losses_of_one_bf16_process(dataset, runs, tmp_path):
    """bf16 autocast at tensor 2: the training and validation losses of one bf16 process to 1e-3 relative (bf16
    keeps 8 bits of mantissa and the split changes the order of its sums; measured about 3e-6 over 4 updates),
    and the weights stay float32."""
    common = [f"data.dataset={dataset}", *COMMON, "train.precision=bf16"]
    one = tmp_path / "one"
    main(load_config("test_tiny", [*common, f"output_dir={one}"]), progress=False)
    root, ran = runs
    ran.ok("bf16")
    two = root / "bf16"
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == len(lb) >= 4
    for x, y in zip(la, lb):
        for key in ("loss", "val_loss"):
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-3 * abs(x[key]), (key, x[key], y[key])
    assert all(v.dtype == torch.float32 for v in final_weights(two).values())
