"""Fine-tune and evaluate BERT on SQuAD v1.1, packed or unpacked.

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

from ..base import TaskSpec
from .config import SquadRunConfig


def _summary(result: dict) -> str | None:
    if "exact_match" in result:
        return (f"exact match {result['exact_match']:.2f}, F1 {result['f1']:.2f} ({result['questions']} questions); "
                f"predictions in {result['predictions']}")
    return None


SPEC = TaskSpec(kind="squad", config=SquadRunConfig, task=f"{__name__}.task:SquadTask", summary=_summary,
                eval_only=("data.train_file=null",), doc=__doc__)
