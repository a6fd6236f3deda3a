"""The packed layout: MLM tokens first, [CLS] tokens last, positions restart, ids per sequence."""

import numpy as np
import pytest

from bert_ipu.data.layout import IGNORE_INDEX, PAD_ID, Instance, PackLayout, pack_instances
from packed_bert_helpers import random_instances

LAYOUT = PackLayout(pack_len=48, mlm_slots=8, max_sequences_per_pack=3)


def test_layout_invariants():
    """Every token of every sequence appears once with its own position; masked tokens fill the first
    slots; [CLS] tokens sit at the end with NSP weights; padding has id 0 and sequence id 0."""
    instances = random_instances(np.random.default_rng(0), 2, 8, 16, 50)
    pack = pack_instances(instances, LAYOUT)
    S, M, K, k = 48, 8, 3, 2
    seq, pos = pack["sequence_ids"], pack["position_ids"]
    for j, x in enumerate(instances, start=1):
        here = np.nonzero(seq == j)[0]
        assert sorted(pos[here].tolist()) == list(range(len(x))), "positions restart at every sequence"
        for p in range(len(x)):
            (at,) = here[pos[here] == p]
            assert pack["input_ids"][at] == x.input_ids[p] and pack["token_type_ids"][at] == x.token_type_ids[p]
        assert here[pos[here] == 0] == S - k + j - 1, "[CLS] of sequence j at S - k + j - 1"
    n_masked = sum(int((x.masked_lm_labels != IGNORE_INDEX).sum()) for x in instances)
    assert (pack["masked_lm_labels"][:n_masked] != IGNORE_INDEX).all()
    assert (pack["masked_lm_labels"][n_masked:] == IGNORE_INDEX).all()
    assert pack["masked_lm_labels"].shape == (M,)
    assert pack["next_sentence_weights"].tolist() == [0, 1, 1]
    assert pack["next_sentence_labels"][1:].tolist() == [x.next_sentence_label for x in instances]
    padding = seq == 0
    assert padding.sum() == S - sum(len(x) for x in instances)
    assert (pack["input_ids"][padding] == PAD_ID).all()


def test_full_pack_of_three():
    """A pack filled to the last token: three [CLS] in the three NSP slots, no padding."""
    lengths = [20, 20, 8]
    instances = [Instance(np.arange(n) + 5, np.zeros(n, dtype=np.int64), np.full(n, IGNORE_INDEX), 1)
                 for n in lengths]
    pack = pack_instances(instances, LAYOUT)
    assert (pack["sequence_ids"] > 0).all()
    assert pack["next_sentence_weights"].tolist() == [1, 1, 1]
    assert (pack["position_ids"][-3:] == 0).all()


def test_refuses_what_does_not_fit():
    x = random_instances(np.random.default_rng(1), 4, 10, 12, 50)
    with pytest.raises(ValueError, match="1..3 sequences"):
        pack_instances(x, LAYOUT)
    long = random_instances(np.random.default_rng(1), 1, 40, 40, 50) * 2
    with pytest.raises(ValueError, match="more than the pack length"):
        pack_instances(long, LAYOUT)
    many = Instance(np.arange(20) + 5, np.zeros(20, dtype=np.int64), np.arange(20) + 5, 0)
    with pytest.raises(ValueError, match="only 8 MLM slots"):
        pack_instances([many], LAYOUT)


def test_a_micro_batch_of_only_empty_rows_has_the_rows_shapes(dataset):
    """Evaluation pads a replica's last micro-batches with empty rows; one made of empty rows only came out 1-D
    (fetching no rows gives no row shape) and crashed the attention mask in a 4-process pipeline."""
    from bert_ipu.data.loader import ShardSource
    from bert_ipu.data.shards import PackedDataset

    source = ShardSource(PackedDataset(dataset), "validation")
    real, empty = source.gather(np.array([0, 1])), source.gather(np.array([-1, -1]))
    for k in real:
        assert empty[k].shape == real[k].shape and empty[k].dtype == real[k].dtype, k
    assert (empty["sequence_ids"] == 0).all() and (empty["masked_lm_labels"] < 0).all()
