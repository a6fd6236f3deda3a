"""The custom op `torch.ops.bert_ipu.packed_attention_mask`: loader, fake kernel and pure-PyTorch reference.

The C++/CUDA kernels live in custom_ops/ and are built by `make` into bert_ipu/bert_ipu_ops.so. This module
loads that library when imported, registers the fake (meta) kernel so that `torch.compile(fullgraph=True)`
and `torch.export` can trace the op, and keeps a reference implementation beside it for tests.

    from bert_ipu.ops import packed_attention_mask
    mask = packed_attention_mask(sequence_ids)          # (B, S) int -> (B, 1, S, S) float32 additive mask
    mask = packed_attention_mask(sequence_ids, causal=True)   # decoders: j <= i of the same sequence only
"""

from __future__ import annotations

from pathlib import Path

import torch

LIBRARY = Path(__file__).resolve().parent / "bert_ipu_ops.so"


class CustomOpNotBuilt(RuntimeError):
    pass


def _load() -> bool:
    """Load the library at import time (so compiled graphs never see file-system calls) if it is built."""
    if not LIBRARY.is_file():
        return False
    torch.ops.load_library(str(LIBRARY))

    @torch.library.register_fake("bert_ipu::packed_attention_mask")
    def _(sequence_ids, dtype=None, causal=False):
        torch._check(sequence_ids.dim() == 2, lambda: "sequence_ids must be (batch, pack_len)")
        batch, length = sequence_ids.shape
        return sequence_ids.new_empty((batch, 1, length, length), dtype=dtype or torch.float32)

    return True


LOADED = _load()


def packed_attention_mask(sequence_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                          causal: bool = False) -> torch.Tensor:
    """sequence_ids: (B, S) int, 1..k per sequence and 0 for padding -> (B, 1, S, S) additive mask in
    `dtype`: 0 where query i and key j share a sequence id (and, with `causal`, j <= i: a decoder's
    document-causal mask), the dtype's lowest finite value elsewhere."""
    if not LOADED:
        raise CustomOpNotBuilt(f"the custom op library {LIBRARY} is not built: run `make` in the repository root")
    return torch.ops.bert_ipu.packed_attention_mask(sequence_ids, dtype, causal)


def reference_packed_attention_mask(sequence_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                                    causal: bool = False) -> torch.Tensor:
    """Pure-PyTorch reference of the op, with the same contract."""
    same = sequence_ids[:, None, :, None] == sequence_ids[:, None, None, :]  # (B, 1, S, S)
    if causal:
        S = sequence_ids.shape[1]
        same = same & torch.ones(S, S, dtype=torch.bool, device=sequence_ids.device).tril()
    zero = torch.zeros((), dtype=dtype, device=sequence_ids.device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=sequence_ids.device)
    return torch.where(same, zero, blocked)
