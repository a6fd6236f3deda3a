"""Packed GLUE-style sequence classification: packing per length distribution, and the realized fine-tuning
speed-up of packed over unpacked rows, measured in one run on the real classifier.

    .venv/bin/python benchmarks/glue_speedup.py [--size minilm|base] [--micro-batch 8] [--steps 4]
        [--rounds 8] [--time-limit 330] [--examples 4000] [--seed 0] [--json OUT]

Length distributions (max length 128), made from the built-in corpus (bert_ipu.data.text.builtin_documents)
with the default WordPiece vocab and GLUE's own featurize (bert_ipu.tasks.glue.data: [CLS] a [SEP] (b [SEP]),
longest-first truncation to 128), `--examples` drawn per distribution with `--seed`:

    single   [CLS] s [SEP], one sentence                              a CoLA / SST-2 stand-in
    pair     [CLS] a [SEP] b [SEP], two consecutive sentences         an MRPC / RTE stand-in
    short    [CLS] s [SEP] of at most 20 tokens in all                a CoLA-like distribution

Table 1 (packing): per distribution the examples, their mean length, the unpacked (NONE, one example per row)
efficiency, and CGHP at the depth bert_ipu.packing.auto_depth chooses: depth, packs, efficiency, packing
factor p (examples per row) and the theoretical speed-up bound = NONE's computed tokens / CGHP's (the
packing result's speedup_upper_bound: what packing gains if step time is proportional to row tokens).

Table 2 (realized speed-up): one PackedBertForSequenceClassification (random weights: speed does not depend
on their values; dropout on, as in training) trains (forward, backward, AdamW step) on micro-batches of
`--micro-batch` rows of 128 tokens: packed rows of CGHP (several examples per row, [CLS] positions and labels
per slot) and unpacked rows (NONE, depth 1: one example per row, padded to 128) of the same examples. Each
round's packed rows are a systematic sample over the packing's rows ordered by example count (so their mean
count represents p), every measured step a different micro-batch (the warm-up round runs the first
measured round's); the unpacked rows hold examples of those packed rows. Each round runs, per distribution,
`--steps` packed and `--steps` unpacked steps (which goes first alternates, step by step); the first round is
warm-up and dropped; no round starts that would likely end past `--time-limit` (on this 2-core machine a
round takes about 25 s when it is idle, and up to twice that when other jobs share it: then fewer rounds
are measured and the script says so). Reported from the median step times:

    ex/step    the real example count of a step's rows (unpacked: B), averaged over the timed steps
    realized   (examples/s packed) / (examples/s unpacked)
    of bound   realized / theoretical bound
    OH         packed step time / unpacked step time - 1 (medians): both are B x 128 tokens, so this is
               what the packed model costs beyond the unpacked one (K [CLS] slots, the block-diagonal mask)
    OH pair    the same from the median of the ratios of adjacent packed and unpacked steps: a check that
               is less sensitive to the shared machine's load changing during the run

OpenMP's threads wait passively (OMP_WAIT_POLICY=PASSIVE unless the environment sets it): on a shared
machine spinning threads make a step up to 10x slower whenever another job runs, sleeping ones about 2x.

A realized speed-up above the bound is noise of the shared machine (step times spread a few percent); the
script says so where it happens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# OpenMP threads that sleep instead of spinning while they wait: on this shared 2-core machine another job
# makes spinning threads several times slower (a step of 0.8 s became 8 s) where sleeping ones lose about
# 2x; idle, they cost ~10% on both layouts alike. Must be set before torch loads OpenMP; the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from transformers import BertConfig

from bert_ipu.files import is_benchmark_json, write_rows
from bert_ipu.arguments import Parser, at_least
from bert_ipu.data.contiguous import PackedSequences, pack_sequences
from bert_ipu.data.instances import WordPiece, default_vocab
from bert_ipu.data.layout import IGNORE_INDEX
from bert_ipu.data.text import builtin_documents
from bert_ipu.tasks.glue.data import GlueExample, featurize
from bert_ipu.models.bert import PackedBertForSequenceClassification
from bert_ipu.packing import auto_depth, pack
from bert_ipu.packing.histogram import histogram_of
from bert_ipu.tasks.profile.run import WithPrecision, timed_step

MAX_LEN = 128
SHORT = 20  # tokens in all, [CLS] and [SEP] included
VOCAB = 30522
SIZES = {"minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
         "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}
DISTRIBUTIONS = {"single": "[CLS] s [SEP] (SST-2/CoLA)", "pair": "[CLS] a [SEP] b [SEP] (MRPC/RTE)",
                 "short": f"[CLS] s [SEP] <= {SHORT} tokens (CoLA)"}


def say(message: str) -> None:
    print(f"[glue] {message}", flush=True)


# --- data ----------------------------------------------------------------------------------------------------

def distributions(n: int, seed: int) -> dict:
    """{name: GlueFeatures} of `n` examples each (fewer if the corpus has fewer), random binary labels."""
    rng = np.random.default_rng(seed)
    docs = [[s for s in d if s.strip()] for d in builtin_documents()]
    sentences = [s for d in docs for s in d]
    pairs = [(d[i], d[i + 1]) for d in docs for i in range(len(d) - 1)]
    wp = WordPiece(default_vocab())
    whole = np.array([len(t) + 2 for t in wp.encode(sentences)])   # [CLS] s [SEP], before truncation
    short = np.flatnonzero(whole <= SHORT)
    say(f"corpus: {len(docs):,} documents, {len(sentences):,} sentences, {len(pairs):,} consecutive pairs, "
        f"{len(short):,} sentences of <= {SHORT} tokens")

    def draw(pool: int, k: int) -> np.ndarray:
        return np.sort(rng.choice(pool, size=min(k, pool), replace=False))

    def label() -> int:
        return int(rng.integers(0, 2))

    chosen = {
        "single": [GlueExample(f"s{i}", sentences[i], None, label()) for i in draw(len(sentences), n)],
        "pair": [GlueExample(f"p{i}", *pairs[i], label()) for i in draw(len(pairs), n)],
        "short": [GlueExample(f"c{i}", sentences[i], None, label()) for i in short[draw(len(short), n)]],
    }
    return {name: featurize(examples, wp, MAX_LEN, regression=False) for name, examples in chosen.items()}


def packings(features, seed: int) -> dict:
    """Table 1's row and the two layouts (CGHP at the auto depth, NONE) of one distribution."""
    hist = histogram_of(features.lengths, MAX_LEN)
    depth = auto_depth(hist, "cghp")
    fields = {"input_ids": features.input_ids, "token_type_ids": features.token_type_ids}
    cghp = pack_sequences(features.lengths, fields, MAX_LEN, "cghp", depth, seed)
    none = pack_sequences(features.lengths, fields, MAX_LEN, "none", 1, seed)
    assert none.result.computed_tokens == pack(hist, "none", 1).computed_tokens
    return {"examples": len(features), "mean_length": float(features.lengths.mean()),
            "none_efficiency": none.efficiency, "depth": depth, "packs": cghp.packs,
            "efficiency": cghp.efficiency, "packing_factor": cghp.packing_factor,
            "bound": cghp.result.speedup_upper_bound, "layouts": {"cghp": cghp, "none": none}}


def rows_batch(ps: PackedSequences, rows: np.ndarray, labels: np.ndarray) -> dict:
    """The model's inputs for these rows of a layout: tokens, and [CLS] positions and labels per slot."""
    batch = {k: ps.rows[k][rows] for k in ("input_ids", "position_ids", "token_type_ids", "sequence_ids")}
    batch["cls_positions"] = ps.slot_values(ps.offset, 0)[rows]
    batch["labels"] = ps.slot_values(labels, IGNORE_INDEX)[rows]
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in batch.items()}


def timing_batches(features, layouts: dict, B: int, steps: int, rounds: int, rng) -> tuple[dict, dict]:
    """steps x rounds micro-batches of B rows per layout (round by round), and the real example count of each.
    Every round's packed rows are a systematic sample over the packing's rows ordered by example count (ties
    in random order), so that any whole number of rounds has a mean count that represents the packing's p, as
    a small random sample would not; its unpacked rows hold examples of those packed rows, one per row."""
    cghp, none = layouts["cghp"], layouts["none"]
    n_rows = B * steps
    counts = np.bincount(cghp.row, minlength=cghp.packs)
    order = np.lexsort((rng.permutation(cghp.packs), counts))
    batches, ex = {"cghp": [], "none": []}, {"cghp": [], "none": []}
    for _ in range(rounds):
        picks = order[np.floor((np.arange(n_rows) + rng.random()) * cghp.packs / n_rows).astype(np.int64)]
        picks = rng.permutation(picks)
        members = np.concatenate([np.flatnonzero(cghp.row == r) for r in picks])  # in the order they lie there
        unpacked = none.row[np.resize(members, n_rows)]  # p >= 1: enough (resize only guards a corner case)
        for s in range(steps):
            rows = picks[s * B:(s + 1) * B]
            batches["cghp"].append(rows_batch(cghp, rows, features.labels))
            ex["cghp"].append(int(counts[rows].sum()))
            batches["none"].append(rows_batch(none, unpacked[s * B:(s + 1) * B], features.labels))
            ex["none"].append(B)
    return batches, ex


# --- measurement ---------------------------------------------------------------------------------------------

def measure(model, batches: dict, rounds: int, steps: int, device, time_limit: float) -> tuple[dict, int]:
    """Interleaved step times: {(distribution, layout): [seconds of the measured steps]}, and the measured
    rounds. Within a round every packed step sits next to an unpacked one, their order alternating (P U, U P,
    ...), so that a change of the shared machine's load hits both layouts alike. The warm-up round runs the
    first measured round's batches. After a round, no further round starts if it would likely end past
    `time_limit` seconds (at least one measured round always runs)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for per_layout in batches.values():
        for bs in per_layout.values():
            bs[:] = [{k: v.to(device) for k, v in b.items()} for b in bs]
    times = {(d, lay): [] for d in batches for lay in ("cghp", "none")}
    began = time.perf_counter()
    for r in range(rounds):
        start = time.perf_counter()
        for d, per_layout in batches.items():
            for s in range(steps):
                for lay in (("cghp", "none") if (r + s) % 2 == 0 else ("none", "cghp")):
                    seconds = timed_step(model, opt, per_layout[lay][max(r - 1, 0) * steps + s], device)
                    if r:  # round 0 is warm-up
                        times[(d, lay)].append(seconds)
        now = time.perf_counter()
        say(f"round {r + 1}/{rounds} done in {now - start:.0f} s{' (warm-up)' if r == 0 else ''}")
        if r >= 1 and r + 1 < rounds and now - began + (now - start) > time_limit:
            say(f"stopping after {r} measured rounds: another would end past --time-limit {time_limit:.0f} s "
                f"(other jobs on this machine make steps several times slower)")
            return times, r
    return times, rounds - 1


def realized_rows(table1: dict, times: dict, ex: dict) -> list[dict]:
    rows = []
    for d, t1 in table1.items():
        # the real example counts of the batches measured (the first len(times) of each layout)
        per_step = {lay: statistics.mean(ex[d][lay][:len(times[(d, lay)])]) for lay in ("cghp", "none")}
        median = {lay: statistics.median(times[(d, lay)]) for lay in ("cghp", "none")}
        rate = {lay: per_step[lay] / median[lay] for lay in ("cghp", "none")}
        realized = rate["cghp"] / rate["none"]
        rows.append({"distribution": d, "packing_factor": t1["packing_factor"], "bound": t1["bound"],
                     "examples_per_step_packed": per_step["cghp"], "examples_per_step_unpacked": per_step["none"],
                     "step_ms_packed": median["cghp"] * 1e3, "step_ms_unpacked": median["none"] * 1e3,
                     "step_ms_packed_range": [min(times[(d, "cghp")]) * 1e3, max(times[(d, "cghp")]) * 1e3],
                     "step_ms_unpacked_range": [min(times[(d, "none")]) * 1e3, max(times[(d, "none")]) * 1e3],
                     "examples_per_second_packed": rate["cghp"], "examples_per_second_unpacked": rate["none"],
                     "realized_speedup": realized, "of_bound": realized / t1["bound"],
                     "overhead": median["cghp"] / median["none"] - 1,
                     "overhead_paired": statistics.median(
                         p / u for p, u in zip(times[(d, "cghp")], times[(d, "none")])) - 1})
    return rows


# --- tables --------------------------------------------------------------------------------------------------

def table(header: list[tuple[str, int]], lines: list[list[str]]) -> str:
    out = ["  ".join(f"{h:>{w}}" for h, w in header)]
    out += ["  ".join(f"{c:>{w}}" for (_, w), c in zip(header, line)) for line in lines]
    return "\n".join(out)


def packing_table(table1: dict) -> str:
    header = [("distribution", 12), ("examples", 8), ("mean len", 8), ("NONE eff", 8), ("depth", 5),
              ("packs", 6), ("CGHP eff", 8), ("p", 6), ("bound", 7)]
    return table(header, [[d, f"{r['examples']:,}", f"{r['mean_length']:.1f}", f"{r['none_efficiency']:.2%}",
                           f"{r['depth']}", f"{r['packs']:,}", f"{r['efficiency']:.2%}",
                           f"{r['packing_factor']:.3f}", f"{r['bound']:.3f}x"] for d, r in table1.items()])


def speedup_table(rows: list[dict]) -> str:
    header = [("distribution", 12), ("p", 6), ("bound", 7), ("ex/step P", 9), ("ex/step U", 9),
              ("step ms P", 9), ("min-max P", 11), ("step ms U", 9), ("min-max U", 11), ("ex/s P", 7),
              ("ex/s U", 7), ("realized", 8), ("of bound", 8), ("OH", 6), ("OH pair", 7)]
    lines = []
    for r in rows:
        lines.append([r["distribution"], f"{r['packing_factor']:.3f}", f"{r['bound']:.3f}x",
                      f"{r['examples_per_step_packed']:.2f}", f"{r['examples_per_step_unpacked']:.0f}",
                      f"{r['step_ms_packed']:.0f}", "{:.0f}-{:.0f}".format(*r["step_ms_packed_range"]),
                      f"{r['step_ms_unpacked']:.0f}", "{:.0f}-{:.0f}".format(*r["step_ms_unpacked_range"]),
                      f"{r['examples_per_second_packed']:.1f}", f"{r['examples_per_second_unpacked']:.1f}",
                      f"{r['realized_speedup']:.3f}x", f"{r['of_bound']:.1%}", f"{r['overhead']:+.1%}",
                      f"{r['overhead_paired']:+.1%}"])
    return table(header, lines)


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="minilm",
                    help="minilm: hidden 384, 6 layers, 12 heads, intermediate 1536 (default); base: BERT-base")
    ap.add_argument("--micro-batch", type=at_least(1), default=8,
                    help="B: rows of 128 per step, packed and unpacked alike")
    ap.add_argument("--steps", type=at_least(1), default=4, help="steps per layout per distribution per round")
    ap.add_argument("--rounds", type=at_least(1), default=8, help="interleaved rounds at most; the first is warm-up")
    ap.add_argument("--time-limit", type=float, default=330, metavar="SECONDS",
                    help="start no round that would likely end past this many seconds of timing (the machine "
                         "is shared: a busy one makes steps several times slower); 0 = warm-up + 1 round")
    ap.add_argument("--examples", type=at_least(1), default=4000, help="examples drawn per distribution")
    ap.add_argument("--seed", type=at_least(0), default=0, help="sampling, labels, packing and the model's weights")
    ap.add_argument("--backend", default="mask", choices=["mask", "reference", "flex"], help="attention backend")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast (a GPU run)")
    ap.add_argument("--threads", type=at_least(1), default=len(os.sched_getaffinity(0)),
                    help="torch threads (default: this machine's cores)")
    ap.add_argument("--json", metavar="OUT", help="write both tables as JSON")
    args = ap.parse_args()
    ap.check_output(args.json, "--json", is_benchmark_json)  # before anything is measured
    if args.rounds < 2 or args.steps < 1 or args.micro_batch < 1 or args.examples < 1:
        ap.error("need --rounds >= 2 (the first is warm-up), --steps, --micro-batch and --examples >= 1")
    torch.set_num_threads(args.threads)
    began = time.perf_counter()

    features = distributions(args.examples, args.seed)
    table1 = {}
    for name, f in features.items():
        table1[name] = packings(f, args.seed)
    print(f"\nTable 1: packing at max length {MAX_LEN} (CGHP at the auto depth; bound = NONE's computed tokens / "
          f"CGHP's)")
    print(packing_table(table1))
    print("".join(f"\n  {d:<7} {desc}" for d, desc in DISTRIBUTIONS.items()) + "\n", flush=True)

    rng = np.random.default_rng(args.seed)
    batches, ex = {}, {}
    for name, t1 in table1.items():
        batches[name], ex[name] = timing_batches(features[name], t1["layouts"], args.micro_batch,
                                                 args.steps, args.rounds - 1, rng)
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=VOCAB, max_position_embeddings=512, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, num_labels=2, **SIZES[args.size])
    depth = max(t1["depth"] for t1 in table1.values())
    model = PackedBertForSequenceClassification(config, depth, args.backend).train()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    say(f"{args.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, micro-batch "
        f"{args.micro_batch} rows of {MAX_LEN}, {args.steps} steps per layout per distribution x {args.rounds} "
        f"rounds (first dropped), {device}, {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    times, measured = measure(WithPrecision(model, device, args.precision), batches, args.rounds, args.steps,
                              device, args.time_limit)
    rows = realized_rows(table1, times, ex)

    print(f"\nTable 2: realized fine-tuning speed-up, packed (P, CGHP) over unpacked (U, NONE), one run, "
          f"{args.size}, B = {args.micro_batch} rows of {MAX_LEN}, forward + backward + AdamW, medians of "
          f"{measured * args.steps} steps each ({measured} measured rounds)")
    print(speedup_table(rows))
    for r in rows:
        verdict = "meets" if r["of_bound"] >= 0.9 else "misses"
        note = ("  ABOVE the bound: noise of the shared machine (its step times spread), not a real gain "
                "beyond it" if r["realized_speedup"] > r["bound"] else "")
        print(f"  {r['distribution']:<7} realized {r['realized_speedup']:.3f}x of bound {r['bound']:.3f}x = "
              f"{r['of_bound']:.1%} ({verdict} the 90% aim), OH {r['overhead']:+.1%}{note}")
    say(f"done in {time.perf_counter() - began:.0f} s")
    if args.json:
        out = {"table1": {d: {k: v for k, v in t1.items() if k != "layouts"} for d, t1 in table1.items()},
               "table2": rows, "args": vars(args)}
        write_rows(args.json, out, "glue_speedup.py", lines=False)


if __name__ == "__main__":
    main()
