"""Sequence parallelism (DeepSpeed-Ulysses over packed documents): the packed causal LMs with every row's tokens
split over S ranks compute what one process computes on whole rows, for any split of the documents (none is
padded or aligned); composed with data and tensor parallelism in one mesh; checkpoints resume across sizes; and
configurations it cannot run are refused in one line before anything is written."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from training_helpers import entry, final_weights, run_cli

# float64: only the summation order differs (all-to-alls move values, they do not add them), so 1e-10.
# float32: logits and loss within 1e-5 (Hugging Face's own float32 error is ~1e-5); a gradient within 1e-4 of its
# parameter's largest (attention sums in another order over 8-48 terms). Weights after AdamW are compared in
# float64 only: Adam divides a gradient by its own root mean square, which turns the rounding noise of a
# near-zero gradient into a full learning-rate step in float32, split or not.
F64, F32, F32_GRAD = 1e-10, 1e-5, 1e-4


def test_split_rows_equal_whole_rows_over_four_ranks_and_over_pairs(tmp_path):
    """Llama (grouped-query: 8 heads, 4 key/value heads) and GPT-2, backends mask and reference (flex: forward,
    no CPU backward), loss per token and per sequence: logits, loss, every gradient and the weights after three
    AdamW steps equal one process's, with 4 ranks (6 tokens each: a 14-token document spans three ranks) and with
    2 (12 each; a document boundary on the share boundary; padding at the end of a row)."""
    out = tmp_path / "sp.json"
    run_cli(str(out), nproc=4, script="tests/sequence_parallel_worker.py")
    results = json.loads(out.read_text())
    assert len(results) == 20
    for case, r in results.items():
        if case.endswith("float64"):
            assert max(r.values()) < F64, (case, r)
        else:
            assert r["logits"] < F32 and r["loss"] < F32 and r["gradients"] < F32_GRAD, (case, r)
    assert all(r["weights"] > 0 for c, r in results.items() if "flex" not in c)  # the steps did run


SFT = ["--config", "sft_tiny_chat_packed", "model.hidden_size=32", "model.num_attention_heads=8",
       "model.num_key_value_heads=4", "model.intermediate_size=64", "train.max_steps=4", "train.micro_batch_size=2",
       "train.checkpoint_every=2", "train.validate_every=2", "train.log_every=1"]


def close(a: dict, b: dict, atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


def test_sequence_parallel_with_data_and_tensor_parallelism_equals_one_process_and_resumes_across_sizes(tmp_path):
    """SFT on the chat fixture, 4 updates of 12 packs (float32, AdamW): 2 replicas x 2 sequence ranks, and 2
    sequence x 2 tensor ranks (4 processes each) end with the weights of one process (to 1e-5: float32 sums in
    another order over 4 updates); the first's step-2 checkpoint resumed on one process, and one process's step-2
    checkpoint resumed at sequence x tensor 2 x 2, continue like the uninterrupted run."""
    straight, sp_dp, sp_tp, back = (tmp_path / n for n in ("straight", "sp_dp", "sp_tp", "back"))
    assert entry("causal_lm", [*SFT, f"output_dir={straight}"]) == 0
    run_cli(*SFT, f"output_dir={sp_dp}", "parallel.sequence_parallel=2", nproc=4, script="run_causal_lm.py")
    reference = final_weights(straight)
    assert close(final_weights(sp_dp), reference, 1e-5)
    # the balance measures of every update (metrics.jsonl): the same packs and padding; one replica is balanced
    rows = {name: [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
                   if "loss" in json.loads(line)] for name, folder in (("one", straight), ("sp_dp", sp_dp))}
    assert [r["padding_ratio"] for r in rows["one"]] == pytest.approx([r["padding_ratio"] for r in rows["sp_dp"]])
    assert all(r["abr"] == r["dbr"] == r["cr"] == 0 for r in rows["one"])
    assert all(0 <= r["abr"] < 1 and 0 <= r["dbr"] < 1 and r["cr"] == 1 for r in rows["sp_dp"])
    assert 0 < rows["one"][0]["padding_ratio"] < 0.2
    state = json.loads((sp_dp / "checkpoints" / "step-0000004" / "state.json").read_text())
    assert (state["replicas"], state["sequence"], state["tensor"]) == (2, 2, 1)

    shutil.copytree(sp_dp, back, ignore=shutil.ignore_patterns("step-0000004", "hf", "results.json"))
    assert entry("causal_lm", [*SFT, f"output_dir={back}", "--resume"]) == 0  # 2 x 2 -> 1 process
    assert close(final_weights(back), reference, 1e-5)

    shutil.copytree(straight, sp_tp, ignore=shutil.ignore_patterns("step-0000004", "hf", "results.json"))
    run_cli(*SFT, f"output_dir={sp_tp}", "parallel.sequence_parallel=2", "parallel.tensor_parallel=2", "--resume",
            script="run_causal_lm.py")  # started without torchrun: launches its 2 x 2 processes
    assert close(final_weights(sp_tp), reference, 1e-5)
    # dropout's generators: the shared one a sequence rank (the tensor ranks of a group agree), the attention
    # cores' one a rank (seeded alike, a row's shares drew the same masks: rank 0's and 2's were equal)
    rngs = json.loads((sp_tp / "checkpoints" / "step-0000004" / "state.json").read_text())["rng"]
    assert len({r["cpu"] for r in rngs}) == 2 and rngs[0]["cpu"] == rngs[1]["cpu"]
    assert len({r["tensor_region"]["cpu"] for r in rngs}) == 4


@pytest.mark.parametrize("overrides, named", [
    (["model.num_key_value_heads=1"], "num_key_value_heads (1) does not divide by parallel.sequence_parallel (2)"),
    (["data.max_seq_length=255", "model.max_position_embeddings=256"], "pack length 255 does not divide"),
])
def test_what_sequence_parallelism_cannot_split_is_one_line_and_writes_nothing(tmp_path, overrides, named):
    """Key/value heads that do not divide by S (each rank attends with whole heads after the all-to-all), a pack
    length that does not divide by S: exit 2, one line on stderr naming it, no run folder."""
    out = tmp_path / "run"
    proc = run_cli(*SFT, f"output_dir={out}", "parallel.sequence_parallel=2", *overrides, script="run_causal_lm.py",
                   check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr[-2000:]
    assert not out.exists()


def test_a_task_without_a_sequence_parallel_layout_is_refused(dataset, tmp_path):
    """BERT pretraining reads its heads at fixed slots of the row (MLM first, [CLS] last): no sequence-parallel
    layout, refused in one line (in this process: the check runs before any collective)."""
    from bert_ipu.config import ParallelConfig
    from bert_ipu.engine.parallel import check_sequence_parallel
    from bert_ipu.engine.runtime import RunError, Runtime
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    rt = Runtime(torch.device("cpu"), sequence=2)
    with pytest.raises(RunError, match="the pretraining task has no sequence-parallel layout"):
        check_sequence_parallel(PretrainingTask(None), None, rt, 128)
    assert ParallelConfig(sequence_parallel=2, tensor_parallel=2, pipeline_stages=1).processes == 4
