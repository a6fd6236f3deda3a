r"""Fine-tune and evaluate BERT on SQuAD v1.1, packed or unpacked.

    python run_squad.py --config squad_base_384_packed model.init_checkpoint=runs/pretrain_base_512_packed/hf \
        data.train_file=squad/train-v1.1.json data.predict_file=squad/dev-v1.1.json
    python run_squad.py --config squad_base_384 ...                       # the same, unpacked (data.algorithm=none)
    python run_squad.py --config squad_tiny_packed                        # ~15 s on CPU: the test fixture
    python run_squad.py --config squad_base_384_packed --eval-only model.init_checkpoint=runs/squad/hf ...
    torchrun --nproc-per-node 2 run_squad.py --config squad_tiny_packed   # data parallel

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value). model.init_checkpoint is any Hugging Face BERT folder: the hf/ export of
run_pretraining.py, a transformers BertForPreTraining/BertModel (the span head starts fresh), or a fine-tuned
BertForQuestionAnswering. The data files are the official SQuAD v1.1 JSON (train-v1.1.json, dev-v1.1.json) or
`datasets` folders saved with save_to_disk. The run writes OUTPUT/predictions.json (question id -> answer),
OUTPUT/results.json (EM, F1, packing, timings), OUTPUT/metrics.jsonl, OUTPUT/checkpoints (--resume continues
from the newest) and OUTPUT/hf (the fine-tuned model with its tokenizer and a model card), and prints exact
match and F1. An OUTPUT that holds another run is an error unless --resume or --overwrite.
"""

import argparse

from bert_ipu.config import ConfigError, SquadRunConfig, load_config
from bert_ipu.engine.launch import launch_if_needed
from bert_ipu.engine.runtime import RunError, finish, report_error


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config name in configs/ or path to a .yaml file")
    p.add_argument("--eval-only", action="store_true", help="no fine-tuning: evaluate model.init_checkpoint on "
                   "data.predict_file (ignores data.train_file)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in output_dir")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="e.g. data.algorithm=none train.num_train_epochs=1 output_dir=runs/x")
    args = p.parse_args(argv)
    try:
        overrides = list(args.overrides) + (["data.train_file=null"] if args.eval_only else [])
        cfg = load_config(args.config, overrides, root=SquadRunConfig)
        code = launch_if_needed(cfg, __file__, argv)
        if code is not None:  # parallel.tensor_parallel > 1 without torchrun: its processes were launched here
            return code
        from bert_ipu.tasks.squad import main

        result = main(cfg, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, RunError) as e:
        report_error(e)
        return 2
    if "exact_match" in result:
        print(f"exact match {result['exact_match']:.2f}, F1 {result['f1']:.2f} ({result['questions']} questions); "
              f"predictions in {result['predictions']}")
    return 0


if __name__ == "__main__":
    finish(cli())
