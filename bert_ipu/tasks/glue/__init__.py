"""Fine-tune and evaluate BERT on a GLUE task, packed or unpacked.

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

from ..base import TaskSpec
from .config import GlueRunConfig


def _summary(result: dict) -> str | None:
    scores = {k: v for k, v in result.items() if k.startswith(("dev", "test")) and isinstance(v, float)}
    return ", ".join(f"{k} {v:.4f}" for k, v in scores.items()) or None


SPEC = TaskSpec(kind="glue", config=GlueRunConfig, task=f"{__name__}.task:GlueTask", summary=_summary,
                eval_only=("data.train_split=null",), doc=__doc__)
