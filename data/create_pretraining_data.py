"""Create BERT pretraining instances (MLM + NSP) from text, as unpacked shards (packs of one).

    python data/create_pretraining_data.py --output data/instances_128                  # built-in corpus
    python data/create_pretraining_data.py --input wiki/*.txt --output out --max-seq-length 512 --workers 2
    python data/create_pretraining_data.py --input wiki/ --output out --engine dask --address 10.0.0.1:8786

Input: files or folders of BERT's text format (.txt: one sentence per line, blank line between documents),
raw documents (--raw: one document per file) or JSON lines (.jsonl with a "text" field); default: the
built-in corpus (Python's own documentation prose; no download). Next step: data/pack_pretraining_data.py.
"""

import argparse
import sys

from bert_ipu.data.instances import InstanceConfig
from bert_ipu.data.jobs import EngineError, add_engine_arguments
from bert_ipu.data.pipeline import create_pretraining_data
from bert_ipu.data.shards import DatasetError
from bert_ipu.data.text import BUILTIN, DataInputError, at_least, workers_arg
from bert_ipu.arguments import Parser


def main(argv=None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", default=[BUILTIN], metavar="PATH",
                   help=f"text files or folders, or '{BUILTIN}' (default)")
    p.add_argument("--output", required=True, help="dataset folder to create")
    p.add_argument("--raw", action="store_true", help=".txt files are raw documents (one per file), split into "
                   "sentences here, instead of one sentence per line")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument("--vocab", help="WordPiece vocab.txt (default: bert-base-uncased, shipped offline)")
    vocab.add_argument("--train-vocab", type=at_least(6), metavar="SIZE",
                       help="train a WordPiece vocab of about SIZE tokens on the input instead (more where the "
                            "input's characters alone are more: every one is kept, and the 5 special tokens)")
    p.add_argument("--max-seq-length", type=int, default=128,
                   help="tokens an instance holds at most, [CLS] and [SEP]s included (default 128)")
    p.add_argument("--max-predictions-per-seq", type=at_least(1),
                   help="masked tokens an instance holds at most (default: 20 at 128, 56 at 384, 76 at 512, "
                        "round(--max-seq-length x --masked-lm-prob) otherwise)")
    p.add_argument("--masked-lm-prob", type=float, default=0.15, help="share of tokens masked (default 0.15)")
    p.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="share of instances made shorter than --max-seq-length, as BERT's recipe (default 0.1)")
    p.add_argument("--whole-word-masking", action="store_true",
                   help="mask every WordPiece of a word together (default: each piece on its own)")
    p.add_argument("--dupe-factor", type=at_least(1), default=1,
                   help="passes over the input with different masks (default 1)")
    p.add_argument("--seed", type=at_least(0), default=12345,
                   help="seed of the segments, masks and validation split (default 12345)")
    p.add_argument("--workers", type=workers_arg(), default=1, help="worker processes (output does not depend on it)")
    add_engine_arguments(p)
    p.add_argument("--docs-per-shard", type=at_least(1), default=2000, help="documents per chunk (= per shard)")
    p.add_argument("--validation-fraction", type=float, default=0.02,
                   help="share of documents held out for validation (default 0.02; 0: none)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--if-changed", action="store_true",
                   help="keep an OUTPUT made from the same input and arguments (nothing redone); remake one made "
                        "from others (a dataset of this tool only; make wikipedia reruns use it)")
    args = p.parse_args(argv)
    try:
        config = InstanceConfig(args.max_seq_length, args.short_seq_prob, args.masked_lm_prob,
                                args.max_predictions_per_seq, args.whole_word_masking, args.dupe_factor, args.seed)
        manifest = create_pretraining_data(args.input, args.output, config, args.vocab, args.train_vocab, args.raw,
                                           args.workers, args.docs_per_shard, args.validation_fraction,
                                           args.overwrite, engine=args.engine, address=args.address,
                                           if_changed=args.if_changed)
    except (DataInputError, DatasetError, EngineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the writer removed its partial folder: nothing is left, the old output is whole
        print(f"interrupted: nothing was written to {args.output}; run the same command again", file=sys.stderr)
        return 130
    c, t = manifest["counts"], manifest["text"]
    documents = c.get("documents", {})  # per split: not in a dataset made before they were counted

    def split(name: str) -> str:
        n = documents.get(name)
        of = f" ({n:,} document{'s' if n != 1 else ''})" if n is not None else ""
        return f"{c['instances'][name]:,} {name} instances{of}"
    print(f"{args.output}: {split('train')} + {split('validation')} "
          f"from {t['documents']:,} documents ({t['bytes'] / 1e6:.1f} MB) "
          f"{'made earlier, ' if manifest.get('kept') else ''}in {manifest['seconds']:.1f} s; skipped "
          f"{t['skipped_empty_files']} empty files and {t['skipped_empty_documents']} empty documents; "
          f"{c.get('truncated', 0):,} pairs truncated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
