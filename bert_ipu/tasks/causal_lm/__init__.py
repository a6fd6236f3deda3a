"""Train a causal language model (Llama or GPT-2), packed or unpacked: pretraining on text, or supervised
fine-tuning (SFT) on chats or prompt/response pairs with the loss on the assistant's tokens only.

    python run_causal_lm.py --config causal_tiny_llama_packed     # the CPU main job of this task: minutes
    python run_causal_lm.py --config causal_tiny_llama            # the same sequences, unpacked
    python run_causal_lm.py --config sft_tiny_chat_packed         # SFT on tests/fixtures/sft/chat.jsonl
    python run_causal_lm.py --config sft_tiny_chat_packed model.init_checkpoint=runs/causal_tiny_llama_packed/hf
    torchrun --nproc-per-node 2 run_causal_lm.py --config causal_tiny_llama_packed   # data parallel

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs override single fields
(section.key=value), e.g. data.algorithm=none (unpacked), data.loss_mode=sequence, model.family=gpt2,
data.source=my_chats.jsonl. Packs never mix sequences: attention is document-causal, positions restart in
every sequence, and no label crosses a sequence boundary. The run writes OUTPUT/metrics.jsonl (loss,
validation loss and perplexity), OUTPUT/checkpoints, OUTPUT/results.json (what was read, skipped and why;
the packing) and OUTPUT/hf (the model with its tokenizer and a model card: AutoModelForCausalLM,
AutoTokenizer and pipeline("text-generation") load it). An OUTPUT that holds another run is an error unless
--resume or --overwrite.
"""

from ..base import TaskSpec
from .config import CausalLMRunConfig


def _summary(result: dict) -> str | None:
    metrics = result.get("metrics", {})
    shown = {k: metrics[k] for k in ("loss", "val_loss", "val_perplexity") if k in metrics}
    return ", ".join(f"{k} {v:.4f}" for k, v in shown.items()) or None


SPEC = TaskSpec(kind="causal_lm", config=CausalLMRunConfig, task=f"{__name__}.task:CausalLMTask", summary=_summary,
                doc=__doc__)
