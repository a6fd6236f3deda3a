r"""Train a causal language model (Llama or GPT-2), packed or unpacked: pretraining on text, or supervised
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

import argparse

from bert_ipu.config import CausalLMRunConfig, ConfigError, load_config
from bert_ipu.engine.launch import launch_if_needed
from bert_ipu.engine.runtime import RunError, finish, report_error


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config name in configs/ or path to a .yaml file")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in output_dir")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="e.g. data.algorithm=none train.max_steps=50 output_dir=runs/x")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, root=CausalLMRunConfig)
        code = launch_if_needed(cfg, __file__, argv)
        if code is not None:  # parallel.tensor_parallel > 1 without torchrun: its processes were launched here
            return code
        from bert_ipu.tasks.causal_lm import main

        result = main(cfg, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, RunError) as e:
        report_error(e)
        return 2
    metrics = result.get("metrics", {})
    shown = {k: metrics[k] for k in ("loss", "val_loss", "val_perplexity") if k in metrics}
    if shown:
        print(", ".join(f"{k} {v:.4f}" for k, v in shown.items()))
    return 0


if __name__ == "__main__":
    finish(cli())
