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

from ..base import TaskSpec
from .config import PretrainingRunConfig


def _summary(result: dict) -> str | None:
    m = result["metrics"]
    if "val_mlm_accuracy" in m and result.get("export"):  # rank 0 speaks for the run
        return (f"final: step {result['step']}, loss {m.get('loss', float('nan')):.4f}, validation MLM accuracy "
                f"{m['val_mlm_accuracy']:.4f}, NSP accuracy {m['val_nsp_accuracy']:.4f}")
    return None


def _preflight(cfg) -> None:
    from .task import preflight

    preflight(cfg)


SPEC = TaskSpec(kind="pretraining", config=PretrainingRunConfig, task=f"{__name__}.task:PretrainingTask",
                summary=_summary, preflight=_preflight, doc=__doc__)
