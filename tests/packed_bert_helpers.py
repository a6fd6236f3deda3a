"""Shared helpers of the model tests: random pretraining instances, and the same instances as an unpacked
Hugging Face batch and as packed batches."""

from __future__ import annotations

import numpy as np
import torch
from transformers import BertConfig

from bert_ipu.data.layout import IGNORE_INDEX, Instance, PackLayout, pack_instances, stack_packs

CLS, SEP = 2, 3


def tiny_config(**overrides) -> BertConfig:
    kwargs = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, hidden_act="gelu")
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def random_instances(rng: np.random.Generator, n: int, min_len: int, max_len: int, vocab: int) -> list[Instance]:
    """[CLS] A [SEP] B [SEP] with random tokens, about 15% of the non-[CLS] tokens masked (at least one)."""
    out = []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        ids = rng.integers(5, vocab, size=length)
        split = int(rng.integers(2, length - 1))
        ids[0], ids[split], ids[-1] = CLS, SEP, SEP
        types = np.zeros(length, dtype=np.int64)
        types[split + 1:] = 1
        n_masked = max(1, round(0.15 * (length - 1)))
        where = rng.choice(np.arange(1, length), size=n_masked, replace=False)
        labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
        labels[where] = ids[where]
        masked_ids = ids.copy()
        masked_ids[where] = 4  # [MASK]
        out.append(Instance(masked_ids, types, labels, int(rng.integers(0, 2))))
    return out


def unpacked_batch(instances: list[Instance]) -> dict[str, torch.Tensor]:
    """One instance per row, padded to the longest, as vanilla BERT sees them (HF argument names)."""
    n, width = len(instances), max(len(x) for x in instances)
    batch = {
        "input_ids": torch.zeros(n, width, dtype=torch.long),
        "token_type_ids": torch.zeros(n, width, dtype=torch.long),
        "attention_mask": torch.zeros(n, width, dtype=torch.long),
        "labels": torch.full((n, width), IGNORE_INDEX, dtype=torch.long),
        "next_sentence_label": torch.tensor([x.next_sentence_label for x in instances]),
    }
    for i, x in enumerate(instances):
        batch["input_ids"][i, : len(x)] = torch.from_numpy(x.input_ids)
        batch["token_type_ids"][i, : len(x)] = torch.from_numpy(x.token_type_ids)
        batch["attention_mask"][i, : len(x)] = 1
        batch["labels"][i, : len(x)] = torch.from_numpy(x.masked_lm_labels)
    return batch


def packed_batch(instances: list[Instance], groups: list[list[int]], layout: PackLayout) -> dict[str, torch.Tensor]:
    packs = [pack_instances([instances[i] for i in group], layout) for group in groups]
    return {k: torch.from_numpy(v) for k, v in stack_packs(packs).items()}


def packed_to_unpacked_index(batch: dict[str, torch.Tensor], groups: list[list[int]], K: int):
    """For every masked MLM slot (b, m): the instance and position it came from; for every present NSP slot
    (b, i): the instance. Returns (mlm_slots, mlm_sources, nsp_slots, nsp_sources) as index tensors."""
    labels = batch["masked_lm_labels"]
    b, m = torch.nonzero(labels != IGNORE_INDEX, as_tuple=True)
    seq = batch["sequence_ids"][b, m]
    inst = torch.tensor([groups[bb][s - 1] for bb, s in zip(b.tolist(), seq.tolist())])
    pos = batch["position_ids"][b, m]
    nb, ni = torch.nonzero(batch["next_sentence_weights"] > 0, as_tuple=True)
    nsp_inst = torch.tensor([groups[bb][ii - (K - len(groups[bb]))] for bb, ii in zip(nb.tolist(), ni.tolist())])
    return (b, m), (inst, pos), (nb, ni), nsp_inst
