"""Tabu search with a pool of unpacked sequences: save packs one at a time on a packing just above its bound.

    fewer = pool_search(packs, max_len, depth, bound, stop)   # a list of packs (arrays of lengths), never more

After Buljubasic and Vasquez's consistent neighbourhood search for bin packing (2016). To save a pack, the
POOL_PACKS emptiest packs are emptied into a pool, and every move keeps the remaining packs valid: p of a pack's
sequences (0 to 2) change places with q of the pool's (1 or 2), the move that leaves the pool lightest is taken
(then the one that leaves more, shorter sequences in it; ties by a seeded random draw), never a swap of equal
totals, and a length that entered a pack may not leave it for a while (its tabu tenure, growing every second
time the same length enters the same pack; all forgotten whenever the pool is lighter than ever, or as light
with more sequences). The pool's sequences longer than half a pack weigh a whole pack: the pool must end
packable into POOL_PACKS - 1 packs, and two of them never share one. Once its tokens fit in those packs, a
subset sum decides whether its sequences do; where they do, the packing has a pack fewer (two, where they fit
one). A pool of more than MAX_POOL sequences (short sequences at an unlimited depth: a move weighs every pair of
them), or more than MAX_ROWS ways to take 0-2 sequences out of the packs, is not searched.

CGHP's last step with `neighbourhood.py` (`cghp._improve`), after the room is gathered and before groups of
packs are repacked. On the small histograms whose exact pricing is dear
(`benchmarks/packing_small.py --family dear`: a few thousand sequences, most lengths distinct, a depth limit of 6
to 16 at 4,096-8,192 tokens) the gathering and group search left 10 of 80 a pack or a few above the bound, the
room of a fraction of a pack spread over hundreds of packs; the pool reaches the bound on 7 of them
(docs/results/packing-scale.md, "A pool of unpacked sequences").

A count, not a clock: each search's setup and each move's effort are estimated (PACK_SECONDS a pack and
ROW_SECONDS a pack row; MOVE_SECONDS, ROW_SECONDS a pack row, PAIR_SECONDS for each pair of pack and pool rows
weighed, and the subset sum's bitset words) and counted as the call's (`effort.py`); `stop()` ends the search,
and so do STALL_MOVES moves without a better pool (outside a packing call nothing counts effort). The draws are
seeded, so the same packing always searches the same way.
"""

from __future__ import annotations

import numpy as np

from .effort import spend
from .fill import subset_sums, subset_with

# The emptiest packs emptied into the pool to save one (it must end packable into one pack fewer). On the 10
# dear misses, in 20 s each, with the pool weighed by its true lengths: 2 packs into 1 reached the bound on 1,
# 3 into 2 on 5 (7 with long sequences weighing a pack).
POOL_PACKS = 3
# Estimated seconds of one move: the Python bookkeeping, and each (pack row, pool row) pair weighed
# (numpy, a few comparisons and a score each).
MOVE_SECONDS = 1e-4
ROW_SECONDS = 1e-7
PACK_SECONDS = 3e-5  # each search's setup, a pack
PAIR_SECONDS = 4e-9
# Pack rows weighed against every pool row at a time, best ceiling first (`_one_fewer`).
CHUNK = 64
# A search ends after this many moves without a better pool (lighter, or as light with more sequences; also
# outside a packing call, where no effort is counted): the 7 pools that fitted, on the dear family's misses, had
# gone at most 329 moves without one.
STALL_MOVES = 1_000
# Not searched: a pool of more sequences (a move weighs every pair of them; at an unlimited depth with short
# sequences one move took over 1 s), or packs with more ways to give up 0-2 sequences (their rows are held in
# memory: 3 x 8 bytes each). On the dear family's 10 misses the pools held 3-15 sequences, the packs
# 2,100-7,600 rows.
MAX_POOL = 64
MAX_ROWS = 2_000_000
SPLIT_WORD_SECONDS = 2e-8  # the subset sum's bitsets, a 64-bit word (as effort.FILL_WORD_SECONDS)


def pool_search(packs: list[np.ndarray], max_len: int, depth: int | None, bound: int, stop,
                rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """`packs` (arrays of lengths, each at most `max_len` tokens and `depth` sequences) with packs saved one at
    a time while above `bound`, until one search fails or `stop()`; `packs` itself where none is saved."""
    rng = np.random.default_rng(0) if rng is None else rng
    while len(packs) > bound and not stop():
        fewer = _one_fewer(packs, max_len, depth or max_len, stop, rng)
        if fewer is None:
            break
        packs = fewer
    return packs


def _one_fewer(packs: list[np.ndarray], max_len: int, depth: int, stop, rng: np.random.Generator):
    """The sequences of `packs` in fewer packs (one fewer, or two where the pool fits one), or None where the
    search ends (no move, STALL_MOVES without a better pool, a pool of more than MAX_POOL sequences, or
    `stop()`)."""
    if len(packs) <= POOL_PACKS:
        return None
    spend(len(packs) * PACK_SECONDS)
    w = np.concatenate(packs).astype(np.int64)
    n = len(w)
    wz = np.append(w, 0)                                              # index n: no sequence
    weight = np.append(np.where(2 * w > max_len, max_len, w), 0)     # its weight in the pool
    fills = np.array([int(p.sum()) for p in packs])
    dropped = set(np.argsort(fills, kind="stable")[:POOL_PACKS].tolist())
    bins, pool, start = [], [], 0
    for i, p in enumerate(packs):
        ids = list(range(start, start + len(p)))
        start += len(p)
        if i in dropped:
            pool.extend(ids)
        else:
            bins.append(ids)
    count = np.array([len(b) for b in bins], dtype=np.int64)   # sequences in each pack
    if len(pool) > MAX_POOL or int((1 + count * (count + 1) // 2).sum()) > MAX_ROWS:
        return None
    fill = np.array([int(w[b].sum()) for b in bins], dtype=np.int64)
    rows = np.concatenate([_rows(k, ids, n) for k, ids in enumerate(bins)])   # (pack, first, second)
    spend(len(rows) * ROW_SECONDS)
    dead = 0
    entered: dict[tuple[int, int], int] = {}   # (pack, length) -> times it entered the pack
    tabu: dict[tuple[int, int], int] = {}      # (pack, length) -> last move at which it may not leave
    best = (int(weight[pool].sum()), -len(pool))
    move = last_best = 0
    while True:
        split = _split(w[pool], max_len, depth, POOL_PACKS - 1) if w[pool].sum() <= (POOL_PACKS - 1) * max_len else None
        if split is not None:
            return [w[b] for b in bins] + [p for p in split if len(p)]
        if stop() or move - last_best >= STALL_MOVES or len(pool) > MAX_POOL:
            return None
        move += 1
        if dead > len(rows) // 2:
            rows, dead = rows[rows[:, 0] >= 0], 0
        b, i1, i2 = rows[:, 0], rows[:, 1], rows[:, 2]
        live = b >= 0
        if tabu:
            held = np.zeros(n + 1, dtype=bool)
            for (k, length), until in tabu.items():
                if until >= move:
                    held[[x for x in bins[k] if w[x] == length]] = True
            live &= ~(held[i1] | held[i2])
        b, i1, i2 = b[live], i1[live], i2[live]
        pw, po = wz[i1] + wz[i2], weight[i1] + weight[i2]
        pc = (i1 < n).astype(np.int64) + (i2 < n)
        cap = max_len - fill[b] + pw
        slots = depth - count[b] + pc
        q1, q2 = _pairs(np.array(pool, dtype=np.int64), n)
        qw, qo, qc = wz[q1] + wz[q2], weight[q1] + weight[q2], 1 + (q2 < n)
        row_draw, col_draw = rng.random(len(b)), rng.random(len(q1))
        # the pool's weight first, then its count, then the draw (each step larger than all that follows);
        # each pack row's best score is at most `ceiling` (the heaviest pool row that fits its room), so only the
        # rows whose ceiling reaches the best score found are weighed against every pool row
        by_length = np.argsort(qw, kind="stable")
        fit = np.searchsorted(qw[by_length], cap, side="right")
        heaviest = np.maximum.accumulate(qo[by_length])[np.maximum(fit - 1, 0)]
        ceiling = np.where(fit > 0, (heaviest - po) * 8.0 + (pc - 1) * 2.0 + (row_draw + col_draw.max()) / 2, -np.inf)
        ranked = np.argsort(-ceiling, kind="stable")
        found, at, weighed = -np.inf, None, 0
        while weighed < len(ranked) and ceiling[ranked[weighed]] > found:
            chunk = ranked[weighed: weighed + CHUNK]
            chunk = chunk[ceiling[chunk] > found]
            weighed += CHUNK
            score = (qo[None, :] - po[chunk, None]) * 8.0 + (pc[chunk, None] - qc[None, :]) * 2.0 \
                + (row_draw[chunk, None] + col_draw[None, :]) / 2
            score[(qw[None, :] > cap[chunk, None]) | (qc[None, :] > slots[chunk, None])
                  | (qw[None, :] == pw[chunk, None])] = -np.inf
            spend(len(chunk) * len(q1) * PAIR_SECONDS)
            top = int(np.argmax(score))
            if score.flat[top] > found:
                found, at = score.flat[top], (int(chunk[top // len(q1)]), top % len(q1))
        spend(MOVE_SECONDS + len(b) * ROW_SECONDS)
        if at is None:
            return None
        r, c = at
        k = int(b[r])
        for x in (int(i1[r]), int(i2[r])):
            if x < n:
                bins[k].remove(x)
                pool.append(x)
        for x in (int(q1[c]), int(q2[c])):
            if x < n:
                pool.remove(x)
                bins[k].append(x)
                key = (k, int(w[x]))
                entered[key] = entered.get(key, 0) + 1
                tabu[key] = move + entered[key] // 2 + 1
        fill[k], count[k] = int(w[bins[k]].sum()), len(bins[k])
        old = rows[:, 0] == k
        dead += int(old.sum())
        rows[old, 0] = -1
        rows = np.concatenate([rows, _rows(k, bins[k], n)])
        now = (int(weight[pool].sum()), -len(pool))
        if now < best:
            best, last_best = now, move
            entered.clear()
            tabu.clear()


def _rows(k: int, ids: list[int], none: int) -> np.ndarray:
    """(pack, first, second) for every way to take 0, 1 or 2 of pack k's sequences `ids` (`none`: no
    sequence)."""
    first, second = _pairs(np.array(ids, dtype=np.int64), none)
    return np.stack([np.full(len(first) + 1, k), np.append(none, first), np.append(none, second)], axis=1)


def _pairs(ids: np.ndarray, none: int) -> tuple[np.ndarray, np.ndarray]:
    """Every single (second = `none`) and every pair of `ids`."""
    i, j = np.triu_indices(len(ids), 1)
    return np.concatenate([ids, ids[i]]), np.concatenate([np.full(len(ids), none), ids[j]])


def _split(lengths: np.ndarray, max_len: int, depth: int, packs: int) -> list[np.ndarray] | None:
    """`lengths` in at most `packs` (1 or 2) packs of `max_len` tokens and `depth` sequences, or None where they
    do not fit: subset sum in bitsets (bit t of reach[k]: a total of t with exactly k sequences)."""
    n, total = len(lengths), int(lengths.sum())
    if packs == 1 or n == 0:
        return [lengths] if n <= depth and total <= max_len else None
    if total > 2 * max_len or n > 2 * depth or int((2 * lengths > max_len).sum()) > 2:
        return None
    most, least, lo = min(depth, n), max(0, n - depth), max(0, total - max_len)
    spend(n * (most + 1) * (max_len // 64 + 1) * SPLIT_WORD_SECONDS)
    history = subset_sums(lengths, max_len, most)
    reach = history[-1]
    for k in range(least, most + 1):
        above = reach[k] >> lo
        if not above:
            continue
        t = lo + (above & -above).bit_length() - 1     # the least total >= lo with k sequences
        if t > max_len:
            continue
        taken = subset_with(history, lengths, k, t)
        return [lengths[taken], lengths[~taken]]
    return None
