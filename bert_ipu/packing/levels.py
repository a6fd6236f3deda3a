"""Choosing the pack lengths of a run (Hierarchical Balance Packing's levels), from a model of a step's time.

    model = StepModel(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, devices=8,
                      vocab=128256, flops_per_second=400e12, bytes_per_second=100e9, memory_tokens=32768)
    choice = choose_levels(histogram, model, tokens_per_update=4_000_000, max_levels=3)
    print(format_choice(choice))            # the table it decided from
    choice.lengths, choice.settings         # e.g. [8192, 32768, 131072], [(1, 0), (2, 0), (8, 4)]

A level's packs are trained with their own sequence-parallel size S and activation checkpointing: the smallest
S (dividing the devices and the pack length) whose share of a pack, L / S tokens, fits `memory_tokens`, and when
even the largest S does not, that S with every layer checkpointed (recomputation trades memory for about a third more
compute). The time of a pack of length L holding sequences of lengths l_i, on its S devices, is modelled as

    compute  = (6 x N x L + 12 x layers x hidden x sum_i l_i^2) x (4 / 3 if checkpointed) / (S x flops_per_second)
    exchange = layers x 2 x 2 x (L / S) x (hidden + kv_hidden) x 2 bytes x (S - 1) / S / bytes_per_second

(N the parameters of the layers and the output head; 6 N per token for the linear layers forward and backward; the attention scores
and values 4 x hidden x l^2 a layer forward, 3x that with the backward, half of it under a causal kernel, and
with a mask backend l = L, the whole pack, whatever it holds; the exchange Ulysses' two all-to-alls of
queries and outputs and two of keys and values, forward and backward, in bf16). An epoch of a level is its
updates (about `tokens_per_update` tokens each, dealt to its devices / S replicas), each as long as its slowest
replica, so the attention imbalance between packs (a pack of one 128K document against one of two hundred short
ones) costs waiting time. `choose_levels` tries every set of up to `max_levels` power-of-two lengths ending at the
longest pack length, lets the multi-size packer choose the mixture with each length's modelled cost of a full
pack, deals each update's packs with `balance.balanced_order`, and keeps the set the model times fastest, beside
the naive packing (every sequence in packs of the longest length, in loader order). It is a model: what it prints
is modelled seconds, not measured ones.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .histogram import PackingInputError, validate_histogram, whole_number
from .multisize import pack_multi_size


@dataclass(frozen=True)
class StepModel:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    devices: int = 1
    flops_per_second: float = 1e12
    bytes_per_second: float = 1e10
    memory_tokens: int | None = None
    """tokens of one pack a device holds with its activations (None: any pack fits one device)"""
    document_attention: bool = True
    """attention costs each document's square (varlen, flex compiled on GPU: masked blocks skipped); False: the
    whole pack's square (a mask backend computes every pair and masks it)"""
    causal: bool = True
    """with document attention, a causal kernel computes about half of each square"""
    vocab: int = 0
    """the output head's rows (its 6 x vocab x hidden FLOPs a token count with the layers')"""

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "devices"):
            whole_number(getattr(self, name), f"StepModel.{name}", 1)
        if not (self.flops_per_second > 0 and self.bytes_per_second > 0):
            raise PackingInputError("StepModel's flops_per_second and bytes_per_second must be > 0")

    @property
    def layer_parameters(self) -> int:
        kv_hidden = self.hidden * self.kv_heads // self.heads
        return self.layers * (2 * self.hidden * self.hidden + 2 * self.hidden * kv_hidden
                              + 3 * self.hidden * self.intermediate) + self.vocab * self.hidden

    def setting(self, pack_length: int) -> tuple[int, int]:
        """(sequence-parallel size, checkpointed layers) of packs of this length: the smallest size that divides
        the devices and the pack length and whose share fits the memory, else the largest with every layer
        checkpointed."""
        sizes = [s for s in range(1, self.devices + 1) if self.devices % s == 0 and pack_length % s == 0]
        for size in sizes:
            if not self.memory_tokens or pack_length / size <= self.memory_tokens:
                return size, 0
        return sizes[-1], self.layers

    def exchange_seconds(self, pack_length: int, size: int) -> float:
        """Modelled seconds of one pack's all-to-alls on `size` devices (0 without sequence parallelism)."""
        kv_hidden = self.hidden * self.kv_heads // self.heads
        volume = self.layers * 4 * (pack_length / size) * (self.hidden + kv_hidden) * 2 * (size - 1) / size
        return volume / self.bytes_per_second

    def pack_seconds(self, pack_length: int, squares: float, size: int, checkpointed: int) -> float:
        """Modelled seconds of one pack of `pack_length` tokens whose sequences' squared lengths sum to `squares`,
        on `size` devices (the module docstring's formula)."""
        if not self.document_attention:
            squares = float(pack_length) ** 2
        elif self.causal:
            squares = squares / 2
        flops = 6 * self.layer_parameters * pack_length + 12 * self.layers * self.hidden * squares
        compute = flops * (4 / 3 if checkpointed else 1.0) / (size * self.flops_per_second)
        return compute + self.exchange_seconds(pack_length, size)


@dataclass(frozen=True)
class LevelRow:
    lengths: tuple[int, ...]
    packs: tuple[int, ...]
    settings: tuple[tuple[int, int], ...]
    seconds: float            # modelled wall-clock time of one epoch (every update waits for its slowest replica)
    computed_tokens: int
    communication: float      # share of the devices' modelled time in all-to-alls
    abr: float                # mean attention balance ratio of the updates (1 - mean / max replica time)


@dataclass(frozen=True)
class LevelChoice:
    rows: list[LevelRow]      # every set tried, fastest first
    naive: LevelRow           # one level: every sequence in packs of the longest length, dealt in loader order

    @property
    def best(self) -> LevelRow:
        return self.rows[0]

    @property
    def lengths(self) -> list[int]:
        return list(self.best.lengths)

    @property
    def settings(self) -> list[tuple[int, int]]:
        return list(self.best.settings)

    @property
    def speedup(self) -> float:
        return self.naive.seconds / self.best.seconds


def level_costs(model: StepModel, lengths: list[int]) -> list[float]:
    """The cost of a full pack of each length for the multi-size packer: its modelled device-seconds (one
    document filling it, on its level's ranks), in units where the shortest costs its tokens (the packer's
    default scale, which keeps its LP well scaled). `pack_levels(..., costs=)` packs with them."""
    costs = [model.pack_seconds(n, float(n) ** 2, *model.setting(n)) * model.setting(n)[0] for n in lengths]
    shortest = int(np.argmin(lengths))
    return [c * lengths[shortest] / costs[shortest] for c in costs]


def candidates(histogram: np.ndarray) -> list[int]:
    """Power-of-two pack lengths from the one that holds the median sequence to the one that holds the longest
    (that one the histogram's own length when it is not a power of two)."""
    lengths = np.repeat(np.arange(1, len(histogram) + 1), histogram)
    low = 2 ** math.ceil(math.log2(max(int(np.median(lengths)), 8)))
    out = [n for n in (2 ** k for k in range(3, 40)) if low <= n < len(histogram)]
    return out + [len(histogram)]


def evaluate(histogram: np.ndarray, lengths: list[int], model: StepModel, tokens_per_update: int,
             balanced: bool = True, max_sequences_per_pack: int | None = None, seed: int = 0) -> LevelRow:
    """Pack `histogram` into `lengths` (the multi-size packer, each length costing its modelled full pack) and
    time an epoch of it: every level's packs in updates of about `tokens_per_update` tokens over its replicas
    (devices / its sequence-parallel size), each update as long as its slowest replica, its packs dealt by
    `balance.balanced_order` (`balanced`) or in a seeded random order."""
    from .balance import balance_ratio, balanced_order

    settings = [model.setting(n) for n in lengths]
    result = pack_multi_size(histogram, lengths, max_sequences_per_pack, costs=level_costs(model, lengths))
    rng = np.random.default_rng(seed)
    seconds = exchange = busy = 0.0
    packs, computed, ratios = [], 0, []
    for n, (s, c) in zip(lengths, settings):
        mixture = result.mixtures.get(n)
        count = 0 if mixture is None else mixture.n_packs
        packs.append(count)
        computed += count * n
        if not count:
            continue
        squares = (mixture.strategies.astype(np.float64) ** 2).sum(axis=1)
        each = np.repeat([model.pack_seconds(n, q, s, c) for q in squares], mixture.counts)
        each = each[rng.permutation(count)]
        replicas = max(1, model.devices // s)
        per_update = max(replicas, round(tokens_per_update / n / replicas) * replicas)
        for lo in range(0, count, per_update):
            update = each[lo:lo + per_update]
            update = np.pad(update, (0, (-len(update)) % replicas))
            if balanced:
                update = update[balanced_order(update, replicas)]
            per_replica = update.reshape(replicas, -1).sum(axis=1)
            seconds += float(per_replica.max())
            ratios.append(balance_ratio(per_replica))
        busy += float(each.sum()) * s
        exchange += model.exchange_seconds(n, s) * count * s
    return LevelRow(tuple(lengths), tuple(packs), tuple(settings), seconds, computed,
                    exchange / busy if busy else 0.0, float(np.mean(ratios)) if ratios else 0.0)


def choose_levels(histogram, model: StepModel, tokens_per_update: int, max_levels: int = 3,
                  max_sequences_per_pack: int | None = None, candidate_lengths: list[int] | None = None) -> LevelChoice:
    """Every set of up to `max_levels` candidate lengths ending at the longest (default `candidates`), each
    timed by `evaluate` with balanced dealing; fastest first; and beside them the naive packing: one level of
    the longest length dealt in loader order."""
    histogram = validate_histogram(histogram)
    whole_number(tokens_per_update, "tokens_per_update", 1)
    whole_number(max_levels, "max_levels", 1)
    if candidate_lengths:
        pool = [whole_number(n, "a candidate length", 1) for n in candidate_lengths]
        if pool != sorted(set(pool)):
            raise PackingInputError(f"candidate_lengths {list(candidate_lengths)}: give distinct pack lengths in "
                                    "ascending order (the longest last: every set of levels ends there)")
    else:
        pool = candidates(histogram)
    top = pool[-1]
    rows = []
    for k in range(max_levels):
        for shorter in itertools.combinations(pool[:-1], k):
            rows.append(evaluate(histogram, [*shorter, top], model, tokens_per_update, True, max_sequences_per_pack))
    rows.sort(key=lambda r: r.seconds)
    naive = evaluate(histogram, [top], model, tokens_per_update, False, max_sequences_per_pack)
    return LevelChoice(rows, naive)


def format_choice(choice: LevelChoice, limit: int = 8) -> str:
    """The table the choice was made from: the fastest sets, and the naive one-level packing."""
    lines = [f"{'levels':28} {'packs':28} {'(S, checkpointed)':26} {'modelled s':>11} {'vs naive':>9} {'ABR':>6} "
             f"{'comm':>6}"]
    for r, note in [(r, "") for r in choice.rows[:limit]] + [(choice.naive, " naive (loader order)")]:
        lines.append(f"{str(list(r.lengths)):28} {str(list(r.packs)):28} {str(list(r.settings)):26} "
                     f"{r.seconds:>11.4g} {choice.naive.seconds / r.seconds:>8.2f}x {r.abr:>6.3f} "
                     f"{r.communication:>6.1%}{note}")
    return "\n".join(lines)
