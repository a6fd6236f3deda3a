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
and balanced, and the padding ratio (docs/packing.md, "Balance across devices").
"""

from ..base import TaskSpec
from .config import ProfilingRunConfig


def _job(cfg, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    from ...engine.runtime import RunError
    from .run import run

    try:
        return run(cfg, say=lambda message: print(message, flush=True))
    except ValueError as e:  # packing.PackingInputError, ProfilingError: bad input, one line
        raise RunError(str(e)) from None


# every flag sets the profile field of its name, so a YAML file alone can say the same (flags win over the file
# and the key=value pairs)
ARGUMENTS = (
    ("--algorithms", dict(nargs="+", metavar="NAME", help="packing algorithms to measure (NONE is always measured: "
                          "the baseline)"), "profile.algorithms"),
    ("--max-sequences-per-pack", dict(type=int, metavar="N"), "profile.max_sequences_per_pack"),
    ("--json", dict(metavar="OUT", help="write one JSON object per algorithm"), "profile.json"),
    ("--trace-dir", dict(metavar="DIR", help="torch.profiler traces and op tables per algorithm"), "profile.trace_dir"),
    ("--plot", dict(metavar="OUT.png"), "profile.plot"),
    ("--scaling", dict(metavar="OUT.png", help="also the Section E study: speed-up of packing over un-padded "
                       "batches against the number of data-parallel devices, printed and plotted"), "profile.scaling"),
    ("--scaling-batches", dict(type=int, help="batches timed for --scaling (default 40)"), "profile.scaling_batches"),
    ("--compile", dict(action="store_true", help="also time torch.compile per algorithm: one compilation per "
                       "distinct batch shape (SORT recompiles for every new shape)"), "profile.compile"),
    ("--step-modes", dict(nargs="+", metavar="MODE", help="how the steps run, each mode timed as its own rows: "
                          "eager (default), compile (torch.compile, static shapes), cudagraphs (compiled and "
                          "replayed as CUDA graphs; CUDA only)"), "profile.step_modes"),
    ("--engine", dict(action="store_true", help="also time the training application's step (the engine: its "
                      "train.compile = each step mode, LAMB multi-tensor, clipping, pinned copies) on the packed "
                      "algorithms' batches, rows 'BACKEND+engine[+MODE]'"), "profile.engine"),
    ("--backends", dict(nargs="+", metavar="NAME", help="attention backends to measure, each with every algorithm "
                        "(default: model.attention_backend); speed-ups are over NONE on the same backend"),
     "profile.backends"),
    ("--hf-baseline", dict(action="store_true", help="also time transformers' BertForPreTraining on NONE's rows "
                           "(row 'hf'): the model a user would otherwise run; OH of the others is still over our "
                           "NONE"), "profile.hf_baseline"),
    ("--ranks", dict(type=int, help="also the balance of updates of RANKS x micro-batch packs over RANKS "
                     "data-parallel ranks, dealt in order and balanced: ABR, DBR, padding ratio per algorithm"),
     "profile.ranks"),
)

SPEC = TaskSpec(kind="profile", config=ProfilingRunConfig, job=_job, arguments=ARGUMENTS, launches=False,
                resumable=False, doc=__doc__)
