"""Configurations that cannot be run exactly are refused in one line, before anything is written: a tensor-parallel
size that does not divide a split layer, and a Llama rope type that would make a packed sequence differ from the
same sequence alone. Every rope type that is accepted keeps packed == alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bert_ipu.engine import tensor
from bert_ipu.engine.runtime import RANK0_REPORTS_S
from bert_ipu.models import plans
from bert_ipu.models.llama import PackedLlamaForCausalLM

from training_helpers import run_cli


def tiny_llama(intermediate_size=48, rope=None, positions=64) -> LlamaConfig:
    rope = {"rope_type": "default"} if rope is None else rope
    return LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=intermediate_size, max_position_embeddings=positions,
                       rope_parameters={**rope, "rope_theta": 10000.0}, attention_dropout=0.0)


def test_a_split_width_that_does_not_divide_is_refused():
    """Column-parallel outputs and row-parallel inputs must divide by the tensor-parallel size (each rank holds
    an equal share); the heads alone were checked before, and an MLP width of 47 crashed inside DTensor at the
    first forward with a 330-line traceback."""
    tensor.check(PackedLlamaForCausalLM(tiny_llama(48)), plans.LLAMA, 2)  # divides: no error
    with pytest.raises(ValueError, match=r"mlp.gate_proj has 47 out features.*parallel.tensor_parallel \(2\)"):
        tensor.check(PackedLlamaForCausalLM(tiny_llama(47)), plans.LLAMA, 2)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tensor.check(PackedLlamaForCausalLM(tiny_llama(48)), plans.LLAMA, 4)


def test_tensor_parallel_with_an_odd_mlp_width_is_one_line_and_writes_nothing(tmp_path):
    """The issue's command: SFT at tensor 2 (its two processes launched by the entry point) with
    intermediate_size 47: exit 2, one line on stderr naming the layer and the fix, no run folder."""
    out = tmp_path / "run"
    proc = run_cli("--config", "sft_tiny_chat_packed", "model.hidden_size=32", "model.intermediate_size=47",
                   "model.num_attention_heads=4", "model.num_key_value_heads=2", "parallel.tensor_parallel=2",
                   "train.max_steps=2", f"output_dir={out}", script="run_causal_lm.py", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "47 out features" in lines[0] and "intermediate_size" in lines[0], lines
    assert not out.exists()


ROPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [4.0] * 4,
            "original_max_position_embeddings": 16}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_every_accepted_rope_type_keeps_packed_equal_to_alone(rope):
    """A row packing a 5-token and a 40-token sequence (positions restarting, document-causal attention) gives
    each sequence the logits transformers' LlamaForCausalLM gives it alone, for every rope type we accept
    (float64, 1e-10: only summation order differs). 40 tokens pass the yarn/llama3 original length (16) and stay
    below max_position_embeddings (64), as every sequence of the causal LM task does."""
    torch.manual_seed(0)
    config = tiny_llama(rope=ROPES[rope])
    hf = LlamaForCausalLM(config).double().eval()
    ours = PackedLlamaForCausalLM(config, "reference", max_sequences_per_pack=2).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    a, b = torch.randint(0, 50, (5,)), torch.randint(0, 50, (40,))
    ids = torch.cat([a, b])[None]
    positions = torch.cat([torch.arange(5), torch.arange(40)])[None]
    sequence_ids = torch.cat([torch.ones(5), torch.full((40,), 2)]).long()[None]
    with torch.no_grad():
        packed = ours(ids, positions, sequence_ids)[0]
        for part, seq in ((slice(0, 5), a), (slice(5, 45), b)):
            alone = hf(seq[None]).logits[0]
            assert (packed[part] - alone).abs().max() < 1e-10 * alone.abs().max(), rope


def test_a_rope_type_that_depends_on_the_longest_sequence_is_refused_for_packs():
    """longrope picks short or long factors by the largest position of the batch: in a pack, the 5-token sequence
    next to a 40-token one would rotate with the long factors (alone: the short ones). Refused for packed rows,
    accepted unpacked (one sequence a row, where the row is the sequence)."""
    config = tiny_llama(rope=LONGROPE)
    with pytest.raises(ValueError, match=r"rope type longrope .*\(data.algorithm=none\)"):
        PackedLlamaForCausalLM(config, "reference", max_sequences_per_pack=2)
    with pytest.raises(ValueError, match="longrope"):
        PackedLlamaForCausalLM(config, "reference")  # default K: the pack length
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).double().eval()
    unpacked = PackedLlamaForCausalLM(config, "reference", max_sequences_per_pack=1).double().eval()
    unpacked.load_state_dict(hf.state_dict(), strict=True)
    # why it is refused: fed a packed row anyway, the short sequence no longer gets its logits alone
    a, b = torch.randint(0, 50, (5,)), torch.randint(0, 50, (40,))
    with torch.no_grad():
        packed = unpacked(torch.cat([a, b])[None], torch.cat([torch.arange(5), torch.arange(40)])[None],
                          torch.cat([torch.ones(5), torch.full((40,), 2)]).long()[None])[0, :5]
        alone = hf(a[None]).logits[0]
        assert torch.allclose(unpacked(a[None], torch.arange(5)[None], torch.ones(1, 5, dtype=torch.long))[0], alone)
    assert (packed - alone).abs().max() > 1e-3 * alone.abs().max()


def test_flex_training_off_cuda_is_one_line_and_writes_nothing(dataset, tmp_path):
    """FlexAttention has no backward on the CPU: training with it crashed at the first backward (after writing
    the run folder); now one line naming the backends that train here, before anything is written. Evaluation
    may keep flex (its forward runs on the CPU)."""
    from bert_ipu.models.attention import check_device

    from training_helpers import entry

    out = tmp_path / "run"
    code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                 "model.max_position_embeddings=64", "data.max_seq_length=64",
                                 "model.attention_backend=flex"])
    assert code == 2 and not out.exists()
    with pytest.raises(ValueError, match="has no backward on cpu.*train with mask or reference"):
        check_device("flex", "cpu", training=True)
    check_device("flex", "cpu", training=False)
    with pytest.raises(ValueError, match="varlen needs CUDA"):
        check_device("varlen", "cpu", training=False)


def test_a_dead_worker_fails_the_job_instead_of_hanging():
    """A data job's worker that dies (killed, out of memory) raises BrokenProcessPool from `ordered_map` within
    seconds; `multiprocessing.Pool`, which create_pretraining_data used, waits forever for its result."""
    from concurrent.futures.process import BrokenProcessPool

    from bert_ipu.data.jobs import ordered_map, worker_pool

    start = time.perf_counter()
    with worker_pool(2) as pool:
        with pytest.raises(BrokenProcessPool):
            list(ordered_map(pool, os._exit, [3, 3, 3], in_flight=2))
    assert time.perf_counter() - start < 60
    with worker_pool(2) as pool:
        assert list(ordered_map(pool, abs, range(-5, 5), in_flight=3)) == [abs(i) for i in range(-5, 5)]


def test_a_launch_says_why_even_when_rank_0_was_stopped_first(tmp_path, capsys):
    """A self-launched run's ranks leave their one-line errors for the launcher: when every rank hits the same
    error and rank 1 exits first, the launcher stops rank 0 before it prints (seen in `make test`: exit 2, empty
    stderr). Then rank 1's line stands in; when rank 0 wrote, only its line is printed."""
    from bert_ipu.engine.launch import print_errors

    (tmp_path / "1").write_text("quiet error (rank 1): mlp.gate_proj has 47 out features")
    print_errors(tmp_path)
    assert capsys.readouterr().err.splitlines() == ["error (rank 1): mlp.gate_proj has 47 out features"]
    (tmp_path / "0").write_text("error: mlp.gate_proj has 47 out features")
    print_errors(tmp_path)
    assert capsys.readouterr().err.splitlines() == ["error: mlp.gate_proj has 47 out features"]


def test_a_launch_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch, capsys):
    """A self-launched run, finished or failed, leaves nothing behind in the temporary folder: the elastic agent
    made a torchelastic_* folder per launch and never removed it (about 20 per `make test`, 896 on this machine),
    and the ranks' error folder stayed too when the launcher was killed. Both now live in one folder the launch
    removes, and the failed launch still prints its rank's line."""
    import tempfile

    from bert_ipu.engine.launch import launch

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # the module caches its folder: read TMPDIR again
    script = tmp_path / "rank.py"
    script.write_text("import os, sys\nfrom bert_ipu.engine.runtime import RunError, report_error\n"
                      "if sys.argv[1] == 'fail' and os.environ['RANK'] == '1':\n"
                      "    report_error(RunError('rank 1 found it', local=True))\n    sys.exit(2)\n")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    assert launch(2, str(script), ["ok"]) == 0
    assert list(temp.iterdir()) == []
    assert launch(2, str(script), ["fail"]) == 2
    assert "error (rank 1): rank 1 found it" in capsys.readouterr().err.splitlines()
    assert list(temp.iterdir()) == []


RANKS_FAIL = """
import os, sys, time
from bert_ipu.engine.runtime import RunError, report_error
if os.environ["RANK"] == "0":
    time.sleep(3)  # rank 0 reaches the error the ranks share last
report_error(RunError("the model's num_attention_heads (2) does not divide"))
sys.exit(2)
"""


def test_under_torchrun_rank_0_says_why_even_when_it_fails_last(tmp_path):
    """Under torchrun itself (no launcher of ours to collect the lines) the agent stops every process once one
    exits: rank 1 leaving first killed rank 0 before it printed (CI: three ranks exited, no line on stderr). The
    other ranks now wait for rank 0 to report, and the agent's SIGTERM ends their wait."""
    script = tmp_path / "fail.py"
    script.write_text(RANKS_FAIL)
    start = time.perf_counter()
    proc = run_cli(nproc=3, script=str(script), check=False)
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert errors == ["error: the model's num_attention_heads (2) does not divide"], proc.stderr[-2000:]
    assert elapsed < RANK0_REPORTS_S, elapsed  # not waited out: stopped once rank 0 had failed
