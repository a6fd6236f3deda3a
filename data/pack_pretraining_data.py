"""Pack pretraining instances into fixed-length packs (or write the unpacked baseline in the same format).

    python data/pack_pretraining_data.py --input data/instances_128 --output data/packed_128
    python data/pack_pretraining_data.py --input data/instances_128 --output data/unpacked_128 --algorithm none
    python data/pack_pretraining_data.py --input inst_512 --output packed_512 --engine dask --address 10.0.0.1:8786

Histogram of the instance lengths -> bert_ipu.packing (default: CGHP, at most 3 sequences a pack; N, max or
auto) -> assignment of every instance to one pack -> shards in the packed layout (MLM tokens first, [CLS]
tokens last; as many NSP slots as the fullest pack holds). Inspect the result with data/inspect_packed_data.py.
"""

import argparse
import sys

from bert_ipu.data.jobs import EngineError, add_engine_arguments
from bert_ipu.data.pipeline import pack_pretraining_data
from bert_ipu.data.shards import DatasetError
from bert_ipu.data.text import DataInputError, at_least, workers_arg
from bert_ipu.packing import ALGORITHMS, PackingInputError, parse_depth
from bert_ipu.arguments import Parser


def depth_arg(text: str):
    """argparse type of --max-sequences-per-pack: N, max or auto (bert_ipu.packing.parse_depth)."""
    try:
        return parse_depth(text)
    except PackingInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="output of data/create_pretraining_data.py")
    p.add_argument("--output", required=True, help="dataset folder to create")
    p.add_argument("--algorithm", default="cghp", choices=[a for a in ALGORITHMS if a != "sort"],
                   help="packing algorithm (default: cghp); none = unpacked baseline")
    p.add_argument("--max-sequences-per-pack", type=depth_arg, default=3, metavar="N|max|auto",
                   help="depth limit: most sequences in a pack; max = unlimited, auto = the smallest limit at "
                        "which CGHP needs no more packs than unlimited (on the train split) (default: 3)")
    p.add_argument("--seed", type=at_least(0), default=0, help="assignment shuffle (and GREEDY's)")
    p.add_argument("--packs-per-shard", type=at_least(1), default=4096)
    p.add_argument("--workers", type=workers_arg(), default=1, help="processes that read the lengths and write the "
                   "shards (the output does not depend on it); the packing is solved in the main process")
    add_engine_arguments(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--if-changed", action="store_true",
                   help="keep an OUTPUT made from the same input and arguments (nothing redone); remake one made "
                        "from others (a dataset of this tool only; make wikipedia reruns use it)")
    args = p.parse_args(argv)
    try:
        manifest = pack_pretraining_data(args.input, args.output, args.algorithm, args.max_sequences_per_pack,
                                         args.seed, args.packs_per_shard, args.overwrite, workers=args.workers,
                                         engine=args.engine, address=args.address, if_changed=args.if_changed)
    except (DataInputError, DatasetError, PackingInputError, EngineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the writer removed its partial folder: nothing is left, the old output is whole
        print(f"interrupted: nothing was written to {args.output}; run the same command again", file=sys.stderr)
        return 130
    for split, info in manifest["packing"].items():
        print(f"{split}: {info['sequences']:,} sequences in {info['packs']:,} packs, efficiency "
              f"{info['efficiency']:.2%}, packing factor {info['packing_factor']:.3f}")
    K = manifest["layout"]["max_sequences_per_pack"]
    print(f"depth limit {manifest['max_sequences_per_pack']} (asked: {manifest['depth_requested']}): at most {K} "
          f"sequence{'s' if K > 1 else ''} a pack")
    made = "kept" if manifest.get("kept") else "wrote"
    print(f"{made} {args.output} (layout {manifest['layout']}), made in {manifest['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
