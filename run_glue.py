r"""Fine-tune and evaluate BERT on a GLUE task, packed or unpacked.

    python run_glue.py --config glue_base_128_packed data.task=sst2 data.data_dir=glue/SST-2 \
        model.init_checkpoint=runs/pretrain_base_512_packed/hf               # packed (CGHP, auto depth)
    python run_glue.py --config glue_base_128 data.task=sst2 data.data_dir=glue/SST-2 ...   # the same, unpacked
    python run_glue.py --config glue_tiny_packed                          # about a minute on CPU: the test fixture
    python run_glue.py --config glue_base_128_packed --eval-only model.init_checkpoint=runs/glue/hf ...
    torchrun --nproc-per-node 2 run_glue.py --config glue_tiny_packed     # data parallel

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value). data.task is one of cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli; data.data_dir is
the task's folder of official GLUE TSV files (train.tsv, dev.tsv, test.tsv; MNLI dev_matched.tsv and
dev_mismatched.tsv) or a `datasets` dataset saved with save_to_disk in the glue/<task> layout.
model.init_checkpoint is any Hugging Face BERT folder (the classifier starts fresh when it has none). The run
writes OUTPUT/predictions_<split>.json (example id -> label), OUTPUT/results.json (GLUE metrics, packing,
what was left out), OUTPUT/metrics.jsonl, OUTPUT/checkpoints and OUTPUT/hf (a BertForSequenceClassification
with its tokenizer, label names and a model card: AutoModelForSequenceClassification and
pipeline("text-classification") load it). An OUTPUT that holds another run is an error unless --resume or
--overwrite.
"""

import argparse

from bert_ipu.config import ConfigError, GlueRunConfig, load_config
from bert_ipu.engine.launch import launch_if_needed
from bert_ipu.engine.runtime import RunError, finish, report_error


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config name in configs/ or path to a .yaml file")
    p.add_argument("--eval-only", action="store_true", help="no fine-tuning: evaluate model.init_checkpoint on "
                   "the dev split(s) (ignores data.train_split)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in output_dir")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="e.g. data.task=mrpc data.algorithm=none train.num_train_epochs=1 output_dir=runs/x")
    args = p.parse_args(argv)
    try:
        overrides = list(args.overrides) + (["data.train_split=null"] if args.eval_only else [])
        cfg = load_config(args.config, overrides, root=GlueRunConfig)
        code = launch_if_needed(cfg, __file__, argv)
        if code is not None:  # parallel.tensor_parallel > 1 without torchrun: its processes were launched here
            return code
        from bert_ipu.tasks.glue import main

        result = main(cfg, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, RunError) as e:
        report_error(e)
        return 2
    scores = {k: v for k, v in result.items() if k.startswith(("dev", "test")) and isinstance(v, float)}
    if scores:
        print(", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    return 0


if __name__ == "__main__":
    finish(cli())
