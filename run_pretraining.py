"""Pretrain packed BERT.

    python run_pretraining.py --config pretrain_tiny_128_packed                 # the main job (CPU, minutes)
    python run_pretraining.py --config pretrain_large_512_packed train.micro_batch_size=3
    torchrun --nproc-per-node 2 run_pretraining.py --config pretrain_tiny_128_packed   # data parallel
    python run_pretraining.py --config pretrain_tiny_128_packed --resume      # continue from the last checkpoint

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value). The run writes OUTPUT/metrics.jsonl, OUTPUT/tensorboard, OUTPUT/checkpoints and, at
the end, OUTPUT/hf (a folder transformers loads).
"""

import argparse
import sys

from bert_ipu.config import ConfigError, load_config
from bert_ipu.training import TrainingError, main


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config name in configs/ or path to a .yaml file")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. train.max_steps=50 output_dir=runs/x")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        result = main(cfg, resume=args.resume)
    except (ConfigError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = result["metrics"]
    if "val_mlm_accuracy" in m:
        print(f"final: step {result['step']}, loss {m.get('loss', float('nan')):.4f}, validation MLM accuracy "
              f"{m['val_mlm_accuracy']:.4f}, NSP accuracy {m['val_nsp_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
