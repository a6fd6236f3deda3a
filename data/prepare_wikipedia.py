"""From a Wikipedia dump to BERT's text format, in shards, ready for create_pretraining_data.py.

    python data/prepare_wikipedia.py --dump enwiki-latest-pages-articles.xml.bz2 --output wiki/ --workers 8
    python data/prepare_wikipedia.py --hf-dataset wikipedia_en/ --output wiki/        # a save_to_disk folder
    python data/prepare_wikipedia.py --dump enwiki-...xml.bz2 --output wiki/ --engine dask --address 10.0.0.1:8786
    python data/create_pretraining_data.py --input wiki/ --output inst_128 --max-seq-length 128

Input: a MediaWiki XML dump (https://dumps.wikimedia.org/enwiki/latest/, the pages-articles file; plain
.xml or compressed .bz2/.gz/.xz, streamed, never held in memory), or a Hugging Face `wikipedia` /
`wikimedia/wikipedia` dataset saved with save_to_disk (columns id, url, title, text; already plain text).

Kept: articles (namespace 0, not redirects, not disambiguation pages), as plain prose: templates,
infoboxes, tables, references, files and images, categories, comments and HTML tags removed, link text
kept, headings dropped, list items as paragraphs; split into sentences with sentencex.

Output: OUTPUT/wiki-00000.txt, wiki-00001.txt, ... (one sentence per line, a blank line between articles,
--docs-per-shard articles each), identical for any --workers and --engine; OUTPUT/wikipedia.json, the manifest
(counts of pages, articles, redirects, disambiguation pages, other namespaces, empty articles; shards; seconds), last.
--engine dask runs the cleaning on a Dask cluster (the one at --address, or a local one of --workers processes); this
process still reads the dump and writes the shards.

Interrupted? Run the same command again: complete shards (recorded in OUTPUT/progress.json) are kept and
the output is the same as an uninterrupted run's. Errors (bad input, an --output that is a file or holds
other files) are one line and exit code 2, and leave no shard or manifest behind.
"""

import argparse
import sys

from bert_ipu.data.jobs import EngineError, add_engine_arguments
from bert_ipu.data.wikipedia import DEFAULT_DOCS_PER_SHARD, WikipediaError, prepare
from bert_ipu.data.text import workers_arg
from bert_ipu.data.wikipedia.writer import DEFAULT_BATCH_BYTES
from bert_ipu.arguments import Parser


def positive_mb(text: str) -> float:
    """argparse type of --batch-mb: a size in MB (MiB), more than 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in MB above 0 (and finite)")
    return value


def main(argv=None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dump", metavar="FILE", help="MediaWiki XML dump (.xml, .xml.bz2, .xml.gz, .xml.xz)")
    source.add_argument("--hf-dataset", metavar="FOLDER", help="a wikipedia dataset saved with save_to_disk")
    p.add_argument("--output", required=True, metavar="DIR", help="folder for the shards (created)")
    p.add_argument("--workers", type=workers_arg(), default=1, help="processes that clean and split (the output does "
                   "not depend on it; the main process reads the dump and writes)")
    add_engine_arguments(p)
    p.add_argument("--batch-mb", type=positive_mb, default=DEFAULT_BATCH_BYTES / 2**20, metavar="MB",
                   help="wikitext in a worker's piece of work (default 0.5, at most 1024; on a large cluster larger "
                        "pieces cost the scheduler less: see docs/data.md; the output does not depend on it)")
    p.add_argument("--docs-per-shard", type=int, default=DEFAULT_DOCS_PER_SHARD,
                   help=f"articles per shard (default {DEFAULT_DOCS_PER_SHARD})")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming what DIR holds")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    args = p.parse_args(argv)
    try:
        manifest = prepare(args.dump or args.hf_dataset, args.output, args.workers, args.docs_per_shard,
                           progress=not args.quiet, overwrite=args.overwrite,
                           source_type="dump" if args.dump else "hf-dataset", engine=args.engine,
                           address=args.address, batch_bytes=max(1, round(args.batch_mb * 2**20)))
    except (WikipediaError, EngineError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to resume ({args.output}/progress.json)", file=sys.stderr)
        return 130
    c = manifest["counts"]
    print(f"{args.output}: {c['articles_kept']:,} articles ({c['sentences']:,} sentences, {c['bytes'] / 1e6:.1f} MB) "
          f"in {len(manifest['shards'])} shards from {c['pages']:,} pages; skipped {c['redirects']:,} redirects, "
          f"{c['disambiguation']:,} disambiguation pages, {c['other_namespaces']:,} pages of other namespaces, "
          f"{c['empty_after_cleaning']:,} articles empty after cleaning; {manifest['seconds']:.1f} s"
          + (f" ({manifest['resumed_shards']} shards kept from an earlier run)" if manifest["resumed_shards"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
