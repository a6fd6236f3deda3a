"""Packing report: how much padding each algorithm removes from a length distribution.

    python -m bert_ipu.packing --histogram ../shared/benchmarks/histograms/wikipedia_512.json
    python -m bert_ipu.packing --lengths lengths.npy --max-len 512 --algorithm cghp lpfhp --json

Prints one row per (algorithm, depth limit), like Tables 1 and 7 of Krell et al. Exit code 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..arguments import Parser
from ..files import describe_os_error, is_png, output_file_problem, save_png
from .api import ALGORITHMS, DEPTH_FREE, applies, check_applies, pack
from .balance import MAX_RANKS
from .depth import depth_label, parse_depth
from .histogram import (MAX_PACK_LENGTH, PackingInputError, check_memory, check_pack_length, histogram_of,
                        load_histogram, load_lengths)

COLUMNS = [  # header, width, format
    ("algorithm", 9, "{}"), ("depth", 5, "{}"), ("packs", 11, "{:,}"), ("efficiency", 10, "{:.3%}"),
    ("padding", 13, "{:,}"), ("p", 6, "{:.3f}"), ("speed-up", 8, "{:.3f}x"), ("gap to LB", 10, "{:,}"),
    ("depth used", 10, "{}"), ("strategies", 10, "{:,}"), ("seconds", 8, "{:.3f}"),
]


def depth_arg(text: str) -> int | None:
    """argparse type of --max-sequences-per-pack: N or max (parse_depth's forms, without auto)."""
    try:
        return parse_depth(text, allow_auto=False)
    except PackingInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def max_len_arg(text: str) -> int | str:
    """argparse type of --max-len: a whole number, or "auto" (pick the pack length; see `auto_pack_length`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or 'auto'") from None


MAX_PACKS_PER_RANK = 1024  # --packs-per-update: at most this many per rank
BALANCE_WORK = 2 ** 16     # updates measured: at most BALANCE_WORK / ranks^2 of the first 100 (at least one)


AUTO_FACTORS = (1, 1.25, 1.5, 2, 3, 4)  # candidate pack lengths, as multiples of the longest sequence


def auto_pack_length(lengths, depth, quiet: bool = False) -> int:
    """The pack length with the best LPFHP efficiency among AUTO_FACTORS x the longest sequence (the longest
    itself, the longer ones rounded up to a multiple of 8; each tried once); a longer pack can pay when long
    sequences are rare (Krell et al., appendix on QM9). Ties go to the shorter pack. Prints the candidates to
    stderr unless quiet. (The longest was rounded up too: 5 and 7 tried 8 and 16, never 7, at 85.7%.)"""
    longest = int(lengths.max())
    best = None
    candidates = dict.fromkeys([longest] + [max(longest, -(-int(longest * f) // 8) * 8) for f in AUTO_FACTORS
                                            if f > 1])
    for candidate in candidates:
        if candidate > MAX_PACK_LENGTH:  # longer packs than the report handles (the longest itself is checked)
            break
        result = pack(histogram_of(lengths, candidate), "lpfhp", depth)
        if not quiet:
            print(f"pack length {candidate:,}: LPFHP efficiency {result.efficiency:.3%} ({result.packs:,} packs)",
                  file=sys.stderr)
        if best is None or result.efficiency > best[0] + 1e-12:
            best = (result.efficiency, candidate)
    if not quiet:
        print(f"--max-len auto: {best[1]:,}", file=sys.stderr)
    return best[1]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m bert_ipu.packing",
        description="Compare packing algorithms on a sequence-length distribution: packs, efficiency "
                    "(real tokens / computed tokens), packing factor p (sequences per pack), the speed-up "
                    "bound over no packing, and the gap to the proven lower bound on packs.",
        epilog="Algorithms: none (one sequence per row), sort (sorted batches padded to their longest), "
               "greedy (shuffle + concatenate), spfhp, lpfhp, nnlshp (depth <= 3) from Krell et al., and "
               "cghp (column generation, at or near its proven lower bound). 'gap to LB' compares packs with the best "
               "lower bound proven in this run for the same depth limit (cghp proves the LP bound).")
    src = p.add_argument_group("input (one of)")
    src.add_argument("--histogram", metavar="FILE.json",
                     help="JSON list of counts: element i = number of sequences of length i+1; its length is "
                          "the pack length")
    src.add_argument("--lengths", metavar="FILE",
                     help="one sequence length per line, or a .npy array of lengths")
    p.add_argument("--max-len", type=max_len_arg, metavar="N|auto",
                   help="pack length for --lengths (default: the longest sequence; auto: the best LPFHP "
                        "efficiency among 1, 1.25, 1.5, 2, 3 and 4 times the longest)")
    p.add_argument("--algorithm", nargs="+", metavar="NAME", default=None,
                   help=f"algorithms to run, from: {' '.join(ALGORITHMS)} (default: all that apply)")
    p.add_argument("--max-sequences-per-pack", nargs="+", type=depth_arg, metavar="N|max",
                   default=[None, 3], help="depth limit(s): most sequences in a pack (default: max 3)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size of SORT (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed of GREEDY (default: 0)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS", default=None,
                   help="stop each algorithm after SECONDS (> 0) with the best packing and bound found so far; "
                        "such rows are marked (json: time_limit_reached)")
    p.add_argument("--ranks", type=int, metavar="N", default=None,
                   help="also report balance over N data-parallel ranks: attention and data balance ratios "
                        "(ABR, DBR) of updates dealt in loader order and by balanced_order, and the padding ratio "
                        "(docs/packing.md, 'Balance across devices'), packs read in the loader's shuffled order; "
                        f"at most {MAX_RANKS}")
    p.add_argument("--packs-per-update", type=int, metavar="P", default=None,
                   help=f"packs per update for --ranks (default: 8 per rank; at most {MAX_PACKS_PER_RANK} per rank); "
                        "the first 100 updates are measured, fewer above 25 ranks (65,536 / ranks^2, at least one)")
    p.add_argument("--multi-size", nargs="+", type=int, metavar="S", default=None,
                   help="also pack into packs of several lengths S chosen together (multi-size cutting stock, "
                        "cost = computed tokens), one row per depth limit, with a proven bound on the computed "
                        "tokens of any such packing (e.g. --multi-size 8192 16384 32768)")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of a table")
    p.add_argument("--plot", metavar="OUT.png", help="also write the histogram and speed-up bounds as a PNG")
    return p


def load_input(args) -> tuple:
    if (args.histogram is None) == (args.lengths is None):
        raise PackingInputError("give exactly one of --histogram FILE.json or --lengths FILE")
    if args.histogram is not None:
        if args.max_len is not None:   # (it was ignored: the histogram's length is the pack length)
            raise PackingInputError("--max-len applies to --lengths; a --histogram's pack length is its length "
                                    "(one count per length 1..max_len): drop --max-len")
        return load_histogram(args.histogram), Path(args.histogram).name
    if args.max_len not in (None, "auto"):
        if args.max_len < 1:
            raise PackingInputError(f"--max-len is {args.max_len}; it must be >= 1")
        check_pack_length(args.max_len, "--max-len")
    if args.max_len == "auto":
        lengths = load_lengths(args.lengths, None)
        args.max_len = auto_pack_length(lengths, args.max_sequences_per_pack[0], quiet=args.json)
    lengths = load_lengths(args.lengths, args.max_len)
    return histogram_of(lengths, args.max_len or int(lengths.max())), Path(args.lengths).name


def plan(algorithms, depths, max_len: int | None = None, sequences: int | None = None) -> list[tuple[str, int | None]]:
    """The (algorithm, depth) rows to run: depth-free algorithms once, NNLSHP only where it applies and its
    dense matrix fits in memory at this pack length, GREEDY only below the sequences it handles, unless asked
    for by name (then a bad depth, a pack length too long or too many sequences is an error)."""
    from .baselines import GREEDY_MAX_SEQUENCES
    from .nnlshp import fits

    named = algorithms is not None
    rows = []
    for name in algorithms or ALGORITHMS:
        if name not in ALGORITHMS:
            raise PackingInputError(f"unknown algorithm {name!r}; choose from {' '.join(ALGORITHMS)}")
        for depth in ([depths[0]] if name in DEPTH_FREE else depths):
            if named or (applies(name, depth) and (name != "nnlshp" or max_len is None or fits(max_len, depth))
                         and (name != "greedy" or sequences is None or sequences < GREEDY_MAX_SEQUENCES)):
                if not isinstance(depth, str):  # before any row runs ("auto": resolved on the data, later)
                    check_applies(name, depth)
                rows.append((name, depth))
    return rows


def format_table(results) -> str:
    best = {}
    for r in results:
        best[r.max_sequences_per_pack] = max(best.get(r.max_sequences_per_pack, 0), r.lower_bound_packs)
    lines = ["  ".join(f"{h:>{w}}" for h, w, _ in COLUMNS)]
    for r in results:
        values = [r.algorithm, depth_label(r.max_sequences_per_pack), r.packs, r.efficiency, r.padding_tokens,
                  r.packing_factor, r.speedup_upper_bound, r.packs - best[r.max_sequences_per_pack], r.mixture.depth,
                  len(r.mixture.counts), r.seconds]
        lines.append("  ".join(f"{f.format(v):>{w}}" for (_, w, f), v in zip(COLUMNS, values)))
    return "\n".join(lines)


def balance_updates(ranks: int) -> int:
    """How many of the first updates --ranks measures: 100 up to 25 ranks, fewer above (at least one)."""
    return min(100, max(1, BALANCE_WORK // ranks ** 2))


def balance_of(result, ranks: int, per_update: int, seed: int) -> dict:
    """Balance metrics of `result`'s packs in the shuffled order the loader reads them, as `assign_ragged`
    deals them for `seed`, then updates of `per_update` packs dealt to `ranks`. A pack holds sequences of its
    strategy's lengths whichever sequences they are, so only the packs measured are built (assigning every
    sequence took most of a minute on 16M sequences)."""
    import numpy as np

    from .balance import update_balance

    if result.packs < per_update:
        raise PackingInputError(f"{result.algorithm} made {result.packs} packs, fewer than one update of "
                                f"{per_update}")
    updates = balance_updates(ranks)
    mixture = result.mixture
    check_memory(16 * result.packs, f"--ranks shuffles the {result.packs:,} packs of {result.algorithm}")
    try:  # the pack order of assign_ragged(..., seed=seed, shuffle_packs=True): its generator's first draw
        order = np.random.default_rng(seed).permutation(result.packs)[:updates * per_update]
    except (MemoryError, ValueError):  # ValueError: "array is too big" (beyond what any memory holds)
        raise PackingInputError(f"{result.algorithm} made {result.packs:,} packs, too many to shuffle in memory for "
                                "--ranks; use fewer sequences") from None
    strategy = np.searchsorted(np.cumsum(mixture.counts), order, side="right")
    sizes = mixture.sizes[strategy]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    flat = mixture.flat[np.repeat(mixture.offsets[strategy] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))]
    return update_balance(flat, offsets, ranks, per_update, result.max_len, updates)


def write_plot(path: str, histogram, results, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    ax1.bar(np.arange(1, len(histogram) + 1), histogram, width=1.0, color="tab:blue")
    ax1.set(title=f"{title}: {int(histogram.sum()):,} sequences", xlabel="sequence length", ylabel="sequences")
    labels = [f"{r.algorithm}\n{depth_label(r.max_sequences_per_pack)}" for r in results]
    speedups = [r.speedup_upper_bound for r in results]
    ax2.bar(labels, speedups, color="tab:green")
    for i, s in enumerate(speedups):
        ax2.text(i, s, f"{s:.3f}", ha="center", va="bottom", fontsize=8)
    ax2.set(title="theoretical speed-up over no packing", ylabel="x")
    ax2.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    # write next to the target and rename, so an interrupted run leaves no half-written image
    try:
        save_png(fig, path, dpi=120)  # (atomic, and with the umask's mode: mkstemp's file was 0600)
    finally:
        plt.close(fig)


def multi_size_row(histogram, pack_lengths, depth, time_limit, check_only: bool = False) -> dict:
    """One multi-size packing (`bert_ipu.packing.multisize`) as a JSON-ready row; `check_only`: only refuse bad
    pack lengths (a PackingInputError)."""
    import time

    import numpy as np

    from .multisize import MULTI_SIZE_BYTES, check_input, pack_multi_size

    if pack_lengths and max(pack_lengths) > len(histogram):  # longer packs than the histogram: no such sequences
        histogram = np.concatenate([histogram, np.zeros(max(pack_lengths) - len(histogram), dtype=np.int64)])
    sequences = int(histogram.sum())
    if check_only:
        check_input(histogram, pack_lengths, None, depth)
        check_memory(sequences * MULTI_SIZE_BYTES, f"--multi-size realises its packs with each of the {sequences:,} "
                                                   "sequences in memory")
        return {}
    start = time.perf_counter()
    try:
        r = pack_multi_size(histogram, pack_lengths, depth, time_limit=time_limit)
    except MemoryError:
        raise PackingInputError(f"--multi-size realises its packs with every sequence in memory, and the "
                                f"{sequences:,} sequences do not fit; use fewer") from None
    tokens = int((np.arange(1, len(histogram) + 1) * histogram).sum())
    row = {"algorithm": "multi-size", "pack_lengths": sorted(pack_lengths),
           "max_sequences_per_pack": "max" if depth is None else depth,   # (as the other rows: it was null)
           "packs": {int(s): int(r.packs.get(s, 0)) for s in sorted(pack_lengths)},   # (every length: 0 too)
           "computed_tokens": r.computed_tokens,
           "efficiency": tokens / r.computed_tokens, "lower_bound_tokens": r.lower_bound, "gap": r.gap,
           "grid": r.grid, "seconds": time.perf_counter() - start, "time_limit_reached": r.time_limit_reached}
    return row


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        histogram, title = load_input(args)
        if args.batch_size < 1:
            raise PackingInputError(f"--batch-size is {args.batch_size}; it must be >= 1")
        problem = args.plot and output_file_problem(args.plot, "--plot", is_png)  # a PNG of ours may be replaced
        if problem:
            raise PackingInputError(problem)
        if args.time_limit is not None and not args.time_limit > 0:
            raise PackingInputError(f"--time-limit is {args.time_limit}; it must be > 0 seconds")
        if args.ranks is not None and args.ranks < 1:
            raise PackingInputError(f"--ranks is {args.ranks}; it must be >= 1")
        if args.ranks is not None and args.ranks > MAX_RANKS:
            raise PackingInputError(f"--ranks is {args.ranks:,}; the balance report deals updates to at most "
                                    f"{MAX_RANKS} ranks (its work grows as ranks squared)")
        if args.packs_per_update is not None and args.ranks is None:   # (it was ignored)
            raise PackingInputError("--packs-per-update applies to the --ranks balance report: give --ranks N too")
        per_update = args.packs_per_update if args.packs_per_update is not None else 8 * (args.ranks or 1)
        if per_update < 1 or (args.ranks is not None and per_update % args.ranks):  # 0 once meant "default"
            raise PackingInputError(f"--packs-per-update {per_update} must be a positive multiple of "
                                    f"--ranks {args.ranks or 1}")
        if args.ranks is not None and per_update > MAX_PACKS_PER_RANK * args.ranks:
            raise PackingInputError(f"--packs-per-update {per_update:,} is more than {MAX_PACKS_PER_RANK} packs a rank "
                                    f"for --ranks {args.ranks}; give at most {MAX_PACKS_PER_RANK * args.ranks:,}")
        if args.seed < 0:
            raise PackingInputError(f"--seed is {args.seed}; it must be >= 0")
        if args.multi_size:  # refused before anything runs
            check_pack_length(max(args.multi_size), "--multi-size")
            multi_size_row(histogram, args.multi_size, None, None, check_only=True)
        rows = plan(args.algorithm, args.max_sequences_per_pack, len(histogram), int(histogram.sum()))
        results, balance, rows_json = [], {}, []
        for name, depth in rows:
            if not args.json:
                print(f"running {name} (depth {depth_label(depth)}) ...", file=sys.stderr)
            try:
                result = pack(histogram, name, depth, seed=args.seed, batch_size=args.batch_size,
                              time_limit=args.time_limit)
            except MemoryError:
                others = ", ".join(a for a in ("spfhp", "lpfhp", "nnlshp", "cghp") if a != name)
                raise PackingInputError(f"{name} handles every one of the {int(histogram.sum()):,} sequences and "
                                        f"they do not fit in memory; use another packer ({others}) or fewer "
                                        "sequences") from None
            results.append(result)
            row = result.to_json()
            if args.ranks is not None and name not in DEPTH_FREE:
                balance[len(results) - 1] = balance_of(result, args.ranks, per_update, args.seed)
                row.update(balance[len(results) - 1])
            rows_json.append(row)
        multi = [multi_size_row(histogram, args.multi_size, depth, args.time_limit)
                 for depth in dict.fromkeys(args.max_sequences_per_pack)] if args.multi_size else []
    except PackingInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:  # every row once all ran: an error found later (a --ranks update longer than a packing) left
        for row in rows_json + multi:  # the rows before it on stdout, a partial report
            print(json.dumps(row), flush=True)
    if not args.json:
        tokens = results[0].tokens
        print(f"{title}: {int(histogram.sum()):,} sequences, {tokens:,} tokens, pack length {len(histogram)}")
        print(format_table(results))
        if balance:
            print(f"\nbalance over {args.ranks} ranks, {per_update} packs per update (mean over the first updates; "
                  "ABR/DBR 0 = balanced):")
            print(f"{'algorithm':>9}  {'depth':>5}  {'ABR loader':>10}  {'ABR balanced':>12}  {'DBR loader':>10}  "
                  f"{'DBR balanced':>12}  {'padding':>8}  {'updates':>7}")
            for i, b in balance.items():
                r = results[i]
                print(f"{r.algorithm:>9}  {depth_label(r.max_sequences_per_pack):>5}  {b['abr_loader']:>10.4f}  "
                      f"{b['abr_balanced']:>12.4f}  {b['dbr_loader']:>10.4f}  {b['dbr_balanced']:>12.4f}  "
                      f"{b['padding_ratio']:>8.3%}  {b['updates']:>7}")
        if multi:
            print(f"\nmulti-size packing into {', '.join(map(str, args.multi_size))} tokens (cost = computed tokens; "
                  "bound: no packing into these lengths computes fewer):")
            print(f"{'depth':>5}  {'packs per length':>32}  {'computed tokens':>15}  {'efficiency':>10}  "
                  f"{'bound':>15}  {'gap':>8}  {'time':>7}")
            for m in multi:
                packs = ", ".join(f"{n:,} x {s}" for s, n in m["packs"].items())
                print(f"{depth_label(m['max_sequences_per_pack']):>5}  {packs:>32}  {m['computed_tokens']:>15,}  "
                      f"{m['efficiency']:>10.3%}  {int(m['lower_bound_tokens']):>15,}  {m['gap']:>8.4%}  "
                      f"{m['seconds']:>6.2f}s" + ("*" if m["time_limit_reached"] else ""))
        stopped = [f"{r.algorithm} ({depth_label(r.max_sequences_per_pack)})" for r in results if r.time_limit_reached]
        if stopped:
            print(f"time limit of {args.time_limit:g} s reached by {', '.join(stopped)}: best packing and bound "
                  "found so far")
    if args.plot:
        try:
            write_plot(args.plot, histogram, results, title)
        except OSError as e:  # checked before the run, but a disk can fill or a folder vanish since
            print(f"error: cannot write --plot {args.plot}: {describe_os_error(e)}", file=sys.stderr)
            return 2
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
