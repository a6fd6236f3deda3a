"""Seeded synthetic length distributions for benchmarks and tests of packing at long context.

    from bert_ipu.packing.synthetic import long_context_lengths, stretch_histogram
    lengths = long_context_lengths(1_000_000, max_len=32768, seed=0)   # int64 lengths in 1..32768
    hist_1024 = stretch_histogram(wikipedia_512, 2, seed=0)           # a Wikipedia-style 1024 histogram

`long_context_lengths` draws log-normal lengths with a heavy tail, the shape of long-context fine-tuning
data (chat, code, books mixed): by default the median is 600 tokens and 1% of the sequences are longer than
16,384. Sequences longer than the pack length are truncated to it (what packers are usually fed), so at 8K a
few percent of the sequences fill a pack alone.
"""

from __future__ import annotations

import math

import numpy as np

from .histogram import PackingInputError, validate_histogram

_Z_99 = 2.3263478740408408  # the standard normal's 99th percentile


def long_context_lengths(n: int, max_len: int, seed: int = 0, median: float = 600.0, tail_length: float = 16384.0,
                         tail_fraction: float = 0.01) -> np.ndarray:
    """`n` log-normal lengths in 1..max_len: median `median`, a fraction `tail_fraction` above `tail_length`
    (before truncation to max_len). Deterministic for a seed."""
    if n < 1 or max_len < 1:
        raise PackingInputError(f"need n >= 1 and max_len >= 1, got n={n}, max_len={max_len}")
    if not 0 < tail_fraction < 0.5 or not tail_length > median > 0:
        raise PackingInputError("need 0 < tail_fraction < 0.5 and tail_length > median > 0")
    z = _Z_99 if tail_fraction == 0.01 else _normal_quantile(1 - tail_fraction)
    sigma = math.log(tail_length / median) / z
    raw = np.random.default_rng(seed).lognormal(math.log(median), sigma, size=n)
    return np.clip(np.rint(raw), 1, max_len).astype(np.int64)


def stretch_histogram(histogram, factor: int, seed: int = 0) -> np.ndarray:
    """A histogram at `factor` times the pack length with the same shape: each sequence of length l becomes
    one of length in (factor (l - 1), factor l], uniformly at random (seeded). Counts are split with a
    multinomial draw, so the number of sequences is unchanged."""
    histogram = validate_histogram(histogram)
    if not isinstance(factor, int) or factor < 1:
        raise PackingInputError(f"factor must be a whole number >= 1, got {factor!r}")
    rng = np.random.default_rng(seed)
    out = np.zeros(len(histogram) * factor, dtype=np.int64)
    for i in np.nonzero(histogram)[0]:
        out[i * factor:(i + 1) * factor] = rng.multinomial(int(histogram[i]), np.full(factor, 1 / factor))
    return out


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm
    return float(norm.ppf(p))
