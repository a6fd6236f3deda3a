"""The custom op bert_ipu::packed_attention_mask against its pure-PyTorch reference (extension-cpp pattern:
sample inputs -> reference, opcheck, torch.compile(fullgraph=True); CUDA variants skip without CUDA)."""

import pytest
import torch
from torch.library import opcheck

from bert_ipu import ops
from bert_ipu.ops import packed_attention_mask, reference_packed_attention_mask

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def sample_inputs(device, id_dtype=torch.int64):
    """(B, S) sequence ids covering the edge cases: all padding, one sequence filling the pack, every token
    its own sequence (k = S), and random interleavings (the packed layout does not keep sequences
    contiguous: masked tokens come first and the [CLS] tokens last)."""
    g = torch.Generator().manual_seed(0)
    S = 37
    cases = [
        torch.zeros(2, S, dtype=torch.long),                               # all padding
        torch.ones(1, S, dtype=torch.long),                                # one sequence fills the pack
        torch.arange(1, S + 1).unsqueeze(0),                               # k = pack length
        torch.randint(0, 4, (3, S), generator=g),                          # random, k up to 3, with padding
        torch.randint(0, S + 1, (2, S), generator=g),                      # many sequences
        torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0] + [0] * (S - 8)]),          # contiguous with padding
    ]
    return [c.to(device=device, dtype=id_dtype) for c in cases]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32, torch.int16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(device, dtype, id_dtype, causal):
    """Exactly the reference: 0 within a sequence (padding with padding; causal: keys j <= i only), the dtype's
    lowest value elsewhere."""
    for ids in sample_inputs(device, id_dtype):
        got = packed_attention_mask(ids, dtype, causal=causal)
        assert got.shape == (ids.shape[0], 1, ids.shape[1], ids.shape[1]) and got.dtype == dtype
        assert got.device.type == device
        torch.testing.assert_close(got, reference_packed_attention_mask(ids, dtype, causal), rtol=0, atol=0)


def test_causal_mask_is_document_causal():
    """Causal: token i sees exactly the tokens j <= i of its own sequence (itself included); written out by
    hand for a pack of [1 1 1 2 2 0 0], not from the reference."""
    ids = torch.tensor([[1, 1, 1, 2, 2, 0, 0]])
    open_ = packed_attention_mask(ids, causal=True)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0, 0],
                             [0, 0, 0, 1, 0, 0, 0],
                             [0, 0, 0, 1, 1, 0, 0],
                             [0, 0, 0, 0, 0, 1, 0],
                             [0, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(open_, expected)
    assert torch.equal(packed_attention_mask(ids, causal=False)[0, 0] == 0, ids[0, :, None] == ids[0, None, :])


def test_no_token_attends_across_sequences():
    """No token attends across sequences, and every row has at least one open entry (its own token)."""
    ids = torch.tensor([[1, 2, 1, 0, 3, 2, 0]])
    mask = packed_attention_mask(ids)[0, 0]
    open_ = mask == 0
    assert torch.equal(open_, ids[0, :, None] == ids[0, None, :])
    assert open_.diagonal().all()
    assert (mask[~open_] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for ids in sample_inputs(device)[:4]:
        opcheck(torch.ops.bert_ipu.packed_attention_mask.default, (ids,), {"dtype": torch.float32})
        opcheck(torch.ops.bert_ipu.packed_attention_mask.default, (ids,), {"dtype": torch.bfloat16})
        opcheck(torch.ops.bert_ipu.packed_attention_mask.default, (ids,), {"dtype": torch.float32, "causal": True})


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_and_export(device):
    """The fake kernel lets torch.compile(fullgraph=True) and torch.export trace the op."""

    class Masked(torch.nn.Module):
        def forward(self, ids, scores):
            return torch.softmax(scores + packed_attention_mask(ids, scores.dtype)
                                 + packed_attention_mask(ids, scores.dtype, causal=True), dim=-1)

    ids = sample_inputs(device)[3]
    scores = torch.randn(ids.shape[0], 1, ids.shape[1], ids.shape[1], device=device)
    eager = Masked()(ids, scores)
    torch.testing.assert_close(torch.compile(Masked(), fullgraph=True)(ids, scores), eager)
    exported = torch.export.export(Masked(), (ids, scores))
    assert "bert_ipu.packed_attention_mask" in str(exported.graph)
    torch.testing.assert_close(exported.module()(ids, scores), eager)


def test_bad_arguments_name_the_problem():
    with pytest.raises(RuntimeError, match=r"must be \(batch, pack_len\)"):
        packed_attention_mask(torch.ones(5, dtype=torch.long))
    with pytest.raises(RuntimeError, match="must be an integer tensor"):
        packed_attention_mask(torch.ones(2, 5))
    with pytest.raises(RuntimeError, match="must be a floating type"):
        torch.ops.bert_ipu.packed_attention_mask(torch.ones(2, 5, dtype=torch.long), torch.int32)


def test_unbuilt_library_says_run_make(monkeypatch):
    monkeypatch.setattr(ops, "LOADED", False)
    with pytest.raises(ops.CustomOpNotBuilt, match="run `make`"):
        packed_attention_mask(torch.ones(1, 4, dtype=torch.long))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine with no GPU visible")
def test_the_cuda_build_names_its_targets_when_no_gpu_is_visible(monkeypatch):
    """With no GPU visible and no TORCH_CUDA_ARCH_LIST, torch's cpp_extension cannot choose the CUDA targets (an
    IndexError inside torch: how `custom_ops/build.py` died with a CUDA torch on a build machine); build.py names
    Ampere and Hopper first, and the flags then hold sm_80 and sm_90. A target the user set is kept."""
    import importlib.util
    from pathlib import Path

    from torch.utils import cpp_extension

    spec = importlib.util.spec_from_file_location(
        "build_ops", Path(__file__).resolve().parent.parent / "custom_ops" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(IndexError):
        cpp_extension._get_cuda_arch_flags()
    build.choose_cuda_targets()
    flags = " ".join(cpp_extension._get_cuda_arch_flags())
    assert "sm_80" in flags and "sm_90" in flags
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6")
    build.choose_cuda_targets()
    assert cpp_extension._get_cuda_arch_flags() == ["-gencode=arch=compute_86,code=sm_86"]
