"""Histogram packing: put variable-length sequences into fixed-length packs with as little padding as
possible, and assign real sequences to the packs.

    from bert_ipu.packing import pack, assign
    result = pack(histogram, "cghp", max_sequences_per_pack=3)   # a PackingResult
    packs = assign(lengths, result.mixture, max_len=len(histogram), seed=0)

The depth limit (`max_sequences_per_pack`) is `N | max | auto` everywhere: `parse_depth` reads it, `depth_label`
writes it, `auto_depth(histogram)` resolves "auto" on the data, `resolve_depth` gives the limit a packer runs
with.

Run `python -m bert_ipu.packing --help` for the report that compares every algorithm on a histogram.

Algorithms (all work on the length histogram, not on the sequences):
  none    one sequence per pack (vanilla BERT with padding)
  sort    sorted batching, each batch padded to its longest sequence (dynamic shapes; not packing)
  greedy  shuffle and concatenate, close a pack when the next sequence does not fit (T5/RoBERTa)
  spfhp   shortest-pack-first histogram packing (Krell et al.)
  lpfhp   longest-pack-first histogram packing (Krell et al.)
  nnlshp  non-negative least-squares histogram packing, depth <= 3 (Krell et al.)
  cghp    column-generation histogram packing: at or near its proven lower bound (ours)
"""

from __future__ import annotations

from .api import ALGORITHMS, DEPTH_FREE, PackingResult, applies, auto_depth, lower_bound, pack, resolve_depth
from .assign import EMPTY, assign, assign_multi_size, assign_ragged
from .depth import depth_label, parse_depth
from .histogram import (PackingInputError, expand_histogram, histogram_of, load_histogram, load_lengths,
                        validate_histogram, validate_lengths)
from .mixture import Mixture

__all__ = ["ALGORITHMS", "DEPTH_FREE", "EMPTY", "Mixture", "PackingInputError", "PackingResult", "applies",
           "assign", "assign_multi_size", "assign_ragged", "auto_depth", "depth_label", "expand_histogram",
           "histogram_of", "load_histogram", "load_lengths", "lower_bound", "pack", "parse_depth", "resolve_depth",
           "validate_histogram", "validate_lengths"]
