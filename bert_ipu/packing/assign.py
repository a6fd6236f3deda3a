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

from .histogram import PackingInputError, histogram_of, validate_lengths, whole_number
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


def _longer_pack(mixture: Mixture, max_len: int) -> int:
    """The tokens of the mixture's first pack longer than `max_len`, or 0 where none is."""
    tokens = mixture.pack_lengths()
    fat = np.nonzero(tokens > max_len)[0]
    return int(tokens[fat[0]]) if len(fat) else 0


def assign_ragged(lengths, mixture: Mixture, max_len: int, seed: int = 0,
                  shuffle_packs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns (offsets, indices): pack p holds the sequences indices[offsets[p]:offsets[p + 1]] of `lengths`,
    longest first; offsets is (n_packs + 1,), indices (n_sequences,), both int64. `mixture` may be the
    PackingResult itself."""
    mixture = getattr(mixture, "mixture", mixture)
    if not isinstance(mixture, Mixture):
        raise PackingInputError(f"mixture is a {type(mixture).__name__}; give a Mixture (result.mixture of pack())")
    max_len, seed = whole_number(max_len, "max_len", 1), whole_number(seed, "seed")
    lengths = validate_lengths(lengths, max_len)
    have, want = histogram_of(lengths, max_len), mixture.coverage(max_len)
    if not np.array_equal(have, want):
        bad = int(np.argmax(have != want)) + 1
        raise PackingInputError(
            f"the mixture packs {want[bad - 1]} sequences of length {bad} but the data has {have[bad - 1]}; "
            "compute the mixture from this data's histogram")
    fat = _longer_pack(mixture, max_len)
    if fat:   # (a mixture of a longer pack length: its packs were returned longer than max_len)
        raise PackingInputError(f"the mixture has a pack of {fat} tokens, more than max_len {max_len}; pack the "
                                f"histogram at max_len {max_len}")
    # small keys let numpy's stable sort use radix sort: several times faster on millions of sequences
    # (docs/results/packing.md, "Assignment")
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


def assign_multi_size(lengths, mixtures, seed: int = 0,
                      shuffle_packs: bool = True) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Assign real sequences to the packs of several lengths (`multisize.pack_multi_size`).

    mixtures: {pack length: Mixture} (a MultiSizeResult's `mixtures`, or the result itself), whose coverages
    add up to the histogram of `lengths`. Returns {pack length: (offsets, indices)} in ascending pack length,
    one entry per mixture, each as `assign_ragged`'s (indices into `lengths`).

    The sequences of each length are split between the pack lengths by how many of that length each one's
    mixture takes: the sequences of length l, in a random order (deterministic for `seed`), go first to the
    smallest pack length's slots of length l, then to the next one's, and so on. `assign_ragged` then fills
    each pack length's slots from its share with a seed of its own derived from `seed`, so every sequence
    lands in exactly one pack of exactly one pack length. Vectorised like `assign_ragged` (the only Python
    loop is over the few pack lengths).
    """
    mixtures = getattr(mixtures, "mixtures", mixtures)
    if not isinstance(mixtures, dict) or not mixtures:
        raise PackingInputError("mixtures: give {pack length: Mixture} (or a MultiSizeResult) with at least one")
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in mixtures):
        raise PackingInputError(f"mixtures' keys are {sorted(map(repr, mixtures))}; give pack lengths as whole "
                                "numbers")
    seed = whole_number(seed, "seed")
    mixtures = {int(s): m for s, m in mixtures.items()}
    sizes = sorted(mixtures)
    top = sizes[-1]
    lengths = validate_lengths(lengths, top)
    coverage = np.stack([mixtures[s].coverage(top) for s in sizes])  # (pack lengths, top)
    have, want = histogram_of(lengths, top), coverage.sum(axis=0)
    if not np.array_equal(have, want):
        bad = int(np.argmax(have != want)) + 1
        raise PackingInputError(
            f"the mixtures pack {want[bad - 1]} sequences of length {bad} but the data has {have[bad - 1]}; "
            "compute the multi-size packing from this data's histogram")
    for s in sizes:
        fat = _longer_pack(mixtures[s], s)
        if fat:
            raise PackingInputError(f"the mixture of pack length {s} has a pack of {fat} tokens")
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(lengths))
    by_length = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    sorted_lengths = lengths[by_length]
    group_start = np.concatenate([[0], np.cumsum(have)])[sorted_lengths - 1]
    rank = np.arange(len(lengths)) - group_start                    # k-th sequence of its length
    upper = np.cumsum(coverage, axis=0)                               # (pack lengths, top): end of each share
    share = (rank[None, :] >= upper[:, sorted_lengths - 1]).sum(axis=0)  # pack length index of each sequence
    out = {}
    for k, s in enumerate(sizes):
        mine = by_length[share == k]
        if len(mine) == 0:  # a mixture with no packs
            out[s] = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
            continue
        mine = np.sort(mine)  # indices ascending: the share does not depend on the order within it
        sub_seed = int(np.random.SeedSequence([seed, s]).generate_state(1, np.uint64)[0])
        offsets, indices = assign_ragged(lengths[mine], mixtures[s], s, seed=sub_seed, shuffle_packs=shuffle_packs)
        out[s] = (offsets, mine[indices])
    return out
