"""Fine-tune and evaluate BERT for token classification (named entities, CoNLL-style files), packed or unpacked.

    python -m bert_ipu --config ner_tiny_packed          # the test fixture: a tiny BERT, about 20 s on the CPU
    python -m bert_ipu --config ner_tiny                 # the same sentences, unpacked (data.algorithm=none)
    python -m bert_ipu --config ner_tiny_packed model.init_checkpoint=runs/pretrain_tiny_128_packed/hf

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value). data.train_file and data.eval_file are CoNLL-style text ("word ... TAG" per line, a blank
line between sentences). The run writes OUTPUT/predictions.json (each evaluation sentence's tags),
OUTPUT/results.json (entity precision, recall, F1, word accuracy, packing), OUTPUT/metrics.jsonl,
OUTPUT/checkpoints and OUTPUT/hf (a BertForTokenClassification with its tokenizer, label names and a model card:
pipeline("token-classification") loads it). This task is the worked example of docs/adding-a-task.md.
"""

from ..base import TaskSpec
from .config import TokenClassificationRunConfig


def _summary(result: dict) -> str | None:
    if "entity_f1" in result:
        return f"entity F1 {result['entity_f1']:.4f}, word accuracy {result['word_accuracy']:.4f}"
    return None


SPEC = TaskSpec(kind="token_classification", config=TokenClassificationRunConfig,
                task=f"{__name__}.task:TokenClassificationTask", summary=_summary, doc=__doc__)
