"""Profile packing on the real model: efficiency, packing factor, overhead and realized speed-up per algorithm.

    python run_profiling.py --config profile_quick                            # CPU, a few minutes
    python run_profiling.py --config profile_quick --algorithms none spfhp cghp --json out.jsonl --plot out.png
    python run_profiling.py --config profile_large_512 --trace-dir traces/    # on a GPU

NAME is a file in configs/ (profile_*.yaml) or a path; KEY=VALUE pairs override fields (profile.steps=5).
Columns: EFF (real / computed tokens), p (sequences per pack), theory (speed-up bound over NONE), realized
(measured sequences/s over NONE's), OH (step time over NONE's at the same shape, minus 1), sequences/s,
tokens/s, median step time with its min-max spread, FLOPs per step (torch.utils.flop_counter), shapes
(distinct batch shapes: SORT compiles one graph per shape), peak memory (GPU only), and with --compile the
seconds torch.compile spends on each algorithm's batches (a recompilation per new shape). With --ranks N, a
second table: the attention and data balance ratios (ABR, DBR) of updates dealt to N ranks in loader order
and balanced, and the padding ratio (README, "Balance across devices").
"""

import argparse
import functools
import json
import sys

from bert_ipu import packing, profiling
from bert_ipu.config import ConfigError, ProfilingRunConfig, load_config
from bert_ipu.modeling import ATTENTION_BACKENDS


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--algorithms", nargs="+", choices=packing.ALGORITHMS)
    ap.add_argument("--max-sequences-per-pack", type=int)
    ap.add_argument("--json", metavar="OUT", help="write one JSON object per algorithm")
    ap.add_argument("--trace-dir", metavar="DIR", help="torch.profiler traces and op tables per algorithm")
    ap.add_argument("--plot", metavar="OUT.png")
    ap.add_argument("--scaling", metavar="OUT.png", help="also the Section E study: speed-up of packing over "
                    "un-padded batches against the number of data-parallel devices, printed and plotted")
    ap.add_argument("--scaling-batches", type=int, help="batches timed for --scaling (default 40)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile per algorithm: one compilation "
                    "per distinct batch shape (SORT recompiles for every new shape)")
    ap.add_argument("--backends", nargs="+", choices=ATTENTION_BACKENDS, help="attention backends to measure, "
                    "each with every algorithm (default: model.attention_backend); speed-ups are over NONE on the "
                    "same backend")
    ap.add_argument("--hf-baseline", action="store_true", help="also time transformers' BertForPreTraining on "
                    "NONE's rows (row 'hf'): the model a user would otherwise run; OH of the others is still over "
                    "our NONE")
    ap.add_argument("--ranks", type=int, help="also the balance of updates of RANKS x micro-batch packs over RANKS "
                    "data-parallel ranks, dealt in order and balanced: ABR, DBR, padding ratio per algorithm")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return ap


# every flag (argparse dest) sets the profile field of its name, so a YAML file alone can say the same
FLAGS = ("algorithms", "max_sequences_per_pack", "json", "trace_dir", "plot", "scaling", "scaling_batches", "compile",
         "backends", "hf_baseline", "ranks")


def parse(argv=None) -> tuple[str, list[str]]:
    """(config name, overrides): the KEY=VALUE pairs as given, then one profile.FIELD=VALUE per flag given
    (flags win over the file and the pairs, as before)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # KEY=VALUE pairs may come anywhere, also after --algorithms (which would otherwise swallow them)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = parser().parse_args([a for a in argv if a not in overrides])
    for name in FLAGS:
        value = getattr(args, name)
        if value is None or value is False:  # not given: the config decides
            continue
        overrides.append(f"profile.{name}={json.dumps(value)}")  # JSON is YAML: paths stay strings, lists lists
    return args.config, overrides


def config(argv=None) -> ProfilingRunConfig:
    """The effective config of a command line."""
    name, overrides = parse(argv)
    return load_config(name, overrides, root=ProfilingRunConfig)


def main(argv=None) -> int:
    try:
        profiling.run(config(argv), say=functools.partial(print, flush=True))
    except (ConfigError, ValueError) as e:  # ConfigError, packing.PackingInputError, profiling.ProfilingError
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
