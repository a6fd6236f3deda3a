"""Pretrain packed BERT.

    python run_pretraining.py --config pretrain_tiny_128_packed                 # the main job (CPU, minutes)
    python run_pretraining.py --config pretrain_large_512_packed                # 4 pipeline stages: starts 4 processes
    torchrun --nproc-per-node 2 run_pretraining.py --config pretrain_tiny_128_packed   # data parallel
    python run_pretraining.py --config pretrain_tiny_128_packed --resume      # continue from the last checkpoint

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value). The run writes OUTPUT/config.yaml (with the data layout it trained on), metrics.jsonl,
tensorboard/, checkpoints/ (resumable on any number of processes) and, at the end, OUTPUT/hf (a folder
transformers loads as it is: model, tokenizer and a model card). An OUTPUT that holds another run is an
error unless --resume or --overwrite. A config with parallel.pipeline_stages N and parallel.tensor_parallel T
started without torchrun launches its N x T processes on this machine.
"""

import argparse
import sys

from bert_ipu.config import ConfigError, RunConfig, load_config
from bert_ipu.engine.launch import launch_if_needed
from bert_ipu.engine.runtime import RunError, finish, report_error


def cli(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config name in configs/ or path to a .yaml file")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir (on "
                   "any number of processes)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in output_dir")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. train.max_steps=50 output_dir=runs/x")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, root=RunConfig)
        m = cfg.model
        layer = 12 * m.hidden_size ** 2 + 2 * m.hidden_size * m.intermediate_size
        code = launch_if_needed(cfg, __file__, argv, m.num_hidden_layers * layer + 30522 * m.hidden_size)
        if code is not None:
            return code
        from bert_ipu.tasks.pretraining import main

        result = main(cfg, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, RunError) as e:
        report_error(e)
        return 2
    m = result["metrics"]
    if "val_mlm_accuracy" in m and result.get("export"):  # rank 0 speaks for the run
        print(f"final: step {result['step']}, loss {m.get('loss', float('nan')):.4f}, validation MLM accuracy "
              f"{m['val_mlm_accuracy']:.4f}, NSP accuracy {m['val_nsp_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    finish(cli())
