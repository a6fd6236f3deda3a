"""Inspect a dataset: statistics from its manifest, checksum verification, and one pack decoded to text.

    python data/inspect_packed_data.py data/packed_128 [--split train] [--pack 0]
"""

import argparse
import sys


from bert_ipu.data.layout import IGNORE_INDEX, unpack
from bert_ipu.data.shards import DatasetError, PackedDataset
from bert_ipu.packing import DEPTH_FREE
from bert_ipu.arguments import Parser


def describe_depth(manifest: dict, K: int) -> str:
    """How many sequences a row holds, from the layout (K = its NSP slots), with the packer's depth limit:
    "unpacked (1 sequence a row)", or "algorithm cghp, depth limit 3, at most 3 sequences a pack (3 NSP slots)"."""
    parts = []
    algorithm = manifest.get("algorithm")
    if algorithm is not None:
        parts.append(f"algorithm {algorithm}")
        limit = manifest.get("max_sequences_per_pack")
        if algorithm not in DEPTH_FREE and limit is not None:
            asked = manifest.get("depth_requested")
            parts.append(f"depth limit {limit}" + (f" ({asked})" if asked not in (None, limit) else ""))
    if K == 1:
        parts.append("unpacked (1 sequence a row)")
    else:
        parts.append(f"at most {K} sequences a pack ({K} NSP slots)")
    return ", ".join(parts)


def main(argv=None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--split", default="train")
    p.add_argument("--pack", type=int, default=0, help="index of the pack to decode")
    args = p.parse_args(argv)
    try:
        data = PackedDataset(args.dataset, verify=True)
        if data.manifest.get("kind") not in ("instances", "packed"):
            raise DatasetError(f"{args.dataset} is a dataset of kind {data.manifest.get('kind')!r}; this command decodes "
                               "BERT pretraining datasets (kind instances or packed, with their vocab.txt)")
        if not 0 <= args.pack < data.packs(args.split):
            raise DatasetError(f"--pack {args.pack} is out of range: split {args.split!r} has "
                               f"{data.packs(args.split)} packs")
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = data.manifest
    print(f"{args.dataset}: {m['kind']}, layout {m['layout']}, checksums OK")
    print(f"  {describe_depth(m, data.layout.max_sequences_per_pack)}")
    for split, info in m["splits"].items():
        print(f"  {split}: {info['packs']:,} packs in {len(info['shards'])} shards")
    print("  sequence lengths: " + ("stored (sequence_lengths.npy, verified against sequence_ids)"
                                    if data.has_derived("sequence_lengths") else
                                    "not stored (written before that field: readers compute them from sequence_ids)"))
    for split, info in m.get("packing", {}).items():
        used = info.get("max_depth_used")
        print(f"  {split}: {info['sequences']:,} sequences" + (f", at most {used} a pack" if used else "") +
              f", efficiency {info['efficiency']:.2%}, packing factor {info['packing_factor']:.3f}")
    vocab = (data.path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    pack = data.read(args.split, args.pack, args.pack + 1)
    print(f"\npack {args.pack} of {args.split}:")
    for j, inst in enumerate(unpack(pack)[0], start=1):
        words = [vocab[t] if lab == IGNORE_INDEX else f"[{vocab[t]}->{vocab[lab]}]"
                 for t, lab in zip(inst.input_ids, inst.masked_lm_labels)]
        nsp = "random next" if inst.next_sentence_label else "is next"
        print(f"  sequence {j} ({len(inst.input_ids)} tokens, {nsp}, "
              f"{int((inst.masked_lm_labels != IGNORE_INDEX).sum())} masked):")
        print("    " + " ".join(words).replace(" ##", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
