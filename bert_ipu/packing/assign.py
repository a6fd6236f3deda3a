"""Assignment: turn a strategy mixture into concrete packs of real sequence indices.

A mixture says "8,000,000 packs of [300, 200, 12], ..."; training needs "pack 17 holds sequences 4, 99
and 12,345". Given the length of every sequence of a dataset and a mixture whose coverage equals the
dataset's histogram, `assign` fills every slot of every pack with a sequence of that slot's length:

- every sequence lands in exactly one pack, and a slot never holds a sequence of another length;
- which sequence of a given length fills which slot is random but deterministic for a seed, and so is
  the order of the packs (so that consecutive packs do not all share one strategy).

It is fully vectorised (sorts and scatters, no Python loop over sequences): 16 million sequences take a
few seconds.
"""

from __future__ import annotations

import numpy as np

from .histogram import PackingInputError, histogram_of, validate_lengths
from .mixture import Mixture

EMPTY = -1


def assign(lengths, mixture: Mixture, max_len: int, seed: int = 0, shuffle_packs: bool = True) -> np.ndarray:
    """Returns packs: (n_packs, depth) int64 sequence indices into `lengths`, EMPTY (-1) for unused slots.

    Within a pack, sequences are ordered longest first (the strategy's order). The same packs as
    `assign_ragged`, padded into one matrix; for deep mixtures (long context, unlimited depth) prefer
    `assign_ragged`, whose memory is one integer per sequence.
    """
    offsets, indices = assign_ragged(lengths, mixture, max_len, seed=seed, shuffle_packs=shuffle_packs)
    sizes = np.diff(offsets)
    packs = np.full((len(sizes), max(int(sizes.max()), 1)), EMPTY, dtype=np.int64)
    row = np.repeat(np.arange(len(sizes)), sizes)
    packs[row, np.arange(len(indices)) - offsets[row]] = indices
    return packs


def assign_ragged(lengths, mixture: Mixture, max_len: int, seed: int = 0,
                  shuffle_packs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns (offsets, indices): pack p holds the sequences indices[offsets[p]:offsets[p + 1]] of `lengths`,
    longest first; offsets is (n_packs + 1,), indices (n_sequences,), both int64."""
    lengths = validate_lengths(lengths, max_len)
    have, want = histogram_of(lengths, max_len), mixture.coverage(max_len)
    if not np.array_equal(have, want):
        bad = int(np.argmax(have != want)) + 1
        raise PackingInputError(
            f"the mixture packs {want[bad - 1]} sequences of length {bad} but the data has {have[bad - 1]}; "
            "compute the mixture from this data's histogram")
    # small keys let numpy's stable sort use radix sort: ~5x faster on 16M sequences
    key = np.int16 if max_len < 2**15 else np.int32
    lengths = lengths.astype(key)
    rng = np.random.default_rng(seed)
    slots, offsets = mixture.expand_ragged()                              # lengths of every pack's slots
    slots = slots.astype(key)
    if shuffle_packs:
        order = rng.permutation(len(offsets) - 1)
        sizes = np.diff(offsets)[order]
        starts = np.repeat(offsets[:-1][order], sizes)
        new_offsets = np.concatenate([[0], np.cumsum(sizes)])
        slots = slots[starts + np.arange(len(slots)) - np.repeat(new_offsets[:-1], sizes)]
        offsets = new_offsets
    # Sequences grouped by length in a random order within each group ...
    shuffled = rng.permutation(len(lengths))
    by_length = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    # ... and slots grouped by length in slot order: the k-th slot of length l gets the k-th sequence of
    # length l. Both groupings have the same group sizes because coverage == histogram.
    indices = np.empty(len(slots), dtype=np.int64)
    indices[np.argsort(slots, kind="stable")] = by_length
    return offsets.astype(np.int64), indices
