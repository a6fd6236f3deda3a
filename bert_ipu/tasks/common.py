"""What the tasks that pack their data in memory (SQuAD, GLUE, causal LM) share: the fine-tuning train
section, the vocab, the depth of their packs, the checks that a model fits the data, the packing line they
say, and the model card of their export."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import TrainConfig
from ..data.instances import default_vocab
from ..engine.runtime import RunError
from ..packing import pack, resolve_depth
from ..packing.histogram import histogram_of


@dataclass
class FinetuneConfig(TrainConfig):
    """TrainConfig with fine-tuning defaults (the reference's SQuAD recipe)."""
    micro_batch_size: int = 4
    global_batch_size: int = 32
    """about this many sequences (features) per update: packed data takes 1/p as many packs"""
    batch_unit: str = "sequences"
    optimizer: str = "adamw"
    learning_rate: float = 3e-5
    max_steps: int | None = None
    """stop after this many updates (None: num_train_epochs)"""
    num_train_epochs: float | None = 2.0
    warmup_steps: int | None = None
    warmup_proportion: float = 0.1
    """linear warm-up over this fraction of the updates, then polynomial decay"""
    validate_every: int | None = None
    checkpoint_every: int | None = None


def resolve_vocab(cfg) -> Path:
    """data.vocab; else the init checkpoint's vocab.txt if it has one; else bert-base-uncased's."""
    if cfg.data.vocab:
        return Path(cfg.data.vocab)
    if cfg.model.init_checkpoint and (Path(cfg.model.init_checkpoint) / "vocab.txt").is_file():
        return Path(cfg.model.init_checkpoint) / "vocab.txt"
    return default_vocab()


def pack_depth(lengths: np.ndarray, max_len: int, algorithm: str, requested) -> int:
    """The K slots of every row: 1 unpacked; N; auto (the smallest depth that packs as tightly as unlimited
    depth); max (as many as the deepest pack of unlimited depth holds)."""
    histogram = histogram_of(lengths, max_len)
    limit = resolve_depth(requested, histogram, algorithm)
    return pack(histogram, algorithm, None).mixture.depth if limit is None else limit


def packing_line(split: str, algorithm: str, noun: str, packed, pack_len: int) -> str:
    """What a task says of one split's packing (`packed`: data.contiguous.PackedSequences)."""
    return (f"{split}: {algorithm} packs {len(packed.row):,} {noun} into {packed.packs:,} rows of {pack_len} (at most "
            f"{packed.max_sequences_per_pack} a row): packing factor {packed.packing_factor:.3f}, efficiency "
            f"{packed.efficiency:.1%}")


PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                   "model.ckpt.index")
"""weight files that only a pickle (or another framework) reads: refused, loading a pickle can run code"""


def require_checkpoint_folder(init_checkpoint: str, model_types: tuple[str, ...] = ()) -> None:
    """A local Hugging Face model folder that is safe to load (checked by the command line before anything
    starts, and by the tasks): its config.json is a JSON object that maps to no custom code (we never pass
    trust_remote_code), and its weights are safetensors (pickled weights are refused for safety); where
    `model_types` are given, its model_type is one of them."""
    import json

    folder = Path(init_checkpoint)
    if not (folder / "config.json").is_file():
        made_by = folder.parent if folder.name == "hf" else None
        hint = f" (the export of the run {made_by}: run that config first)" if made_by else ""
        raise RunError(f"model.init_checkpoint {init_checkpoint} is not a Hugging Face model folder (no "
                       f"config.json){hint}; give the hf/ folder of a run or a transformers model folder")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:  # (ValueError: JSON's, and an integer of 4,300+ digits)
        why = str(e).split(";")[0][:120]
        raise RunError(f"{folder / 'config.json'} is not JSON ({why}); give a transformers model folder") from None
    except RecursionError:
        raise RunError(f"{folder / 'config.json'} is not JSON (nested too deeply to read); give a transformers "
                       "model folder") from None
    if not isinstance(config, dict):
        raise RunError(f"{folder / 'config.json'} is not a JSON object; give a transformers model folder")
    if model_types and config.get("model_type") not in model_types:  # (a Llama export for a BERT task)
        raise RunError(f"model.init_checkpoint {init_checkpoint} is a {config.get('model_type') or 'model of no type'} "
                       f"checkpoint; this task fine-tunes {' or '.join(model_types)}: give such a checkpoint")
    if config.get("auto_map"):
        raise RunError(f"{folder / 'config.json'} maps the model to custom code (auto_map: "
                       f"{', '.join(map(str, config['auto_map']))}), which is refused for safety (it would run code "
                       "from the folder); give a model of a transformers architecture")
    if not any(folder.glob("*.safetensors")) and not (folder / "model.safetensors.index.json").is_file():
        pickled = [name for name in PICKLED_WEIGHTS if (folder / name).exists()]
        if pickled:
            raise RunError(f"{folder / pickled[0]}: the folder holds only pickled weights, which are refused for "
                           "safety (loading a pickle can run code); convert them to safetensors (transformers: "
                           "from_pretrained then save_pretrained, in a trusted environment)")
        raise RunError(f"model.init_checkpoint {init_checkpoint} holds no weights (no *.safetensors); give the "
                       "hf/ folder of a run or a transformers model folder")
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):  # the header and the file's length only: no tensor is read
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as e:  # SafetensorError (cut short, bad header) or OSError
            detail = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise RunError(f"model.init_checkpoint: {weights} is damaged ({detail}); copy the model folder again or "
                           "re-export it") from None


def load_checkpoint(init_checkpoint: str, model_types: tuple[str, ...], load):
    """`load(init_checkpoint)` after `require_checkpoint_folder`; a config the packed model refuses (a ValueError:
    an untied BERT decoder, a causal BERT, a rope type packing cannot keep exact) is one line naming the folder."""
    require_checkpoint_folder(init_checkpoint, model_types)
    try:
        return load(init_checkpoint)
    except ValueError as e:
        raise RunError(f"model.init_checkpoint {init_checkpoint}: {e}") from None


def check_model_fits(model, vocab_size: int, max_seq_length: int):
    """The model covers the tokenizer's vocab and the data's lengths; returns the model."""
    if model.config.vocab_size < vocab_size:
        raise RunError(f"the vocab has {vocab_size} tokens but the model only {model.config.vocab_size}; give "
                       "the vocab the model was trained with (data.vocab=PATH/vocab.txt)")
    if model.config.max_position_embeddings < max_seq_length:
        raise RunError(f"data.max_seq_length {max_seq_length} is longer than the model's "
                       f"{model.config.max_position_embeddings} positions; lower data.max_seq_length")
    return model


def card(cfg, task: str, pipeline_tag: str, data: str, depth: int, packing_factor: float, info: dict,
         metric_keys) -> dict:
    """The model card of a fine-tuning export (bert_ipu.export.model_card)."""
    return {"task": task, "pipeline_tag": pipeline_tag, "base_model": cfg.model.init_checkpoint or "from scratch",
            "data": data, "steps": info["steps"], "sequences_seen": int(info["sequences_seen"]),
            "packing": {"algorithm": cfg.data.algorithm, "max_sequences_per_pack": depth,
                        "packing_factor": round(packing_factor, 4)},
            "metrics": {k: v for k, v in info["metrics"].items() if k in metric_keys},
            "command": command(cfg)}


def command(cfg) -> str:
    """The command line that runs `cfg` (model cards say how a model was made): its config as named and its
    overrides (without them a card's command trained something else: the fixture's data, from scratch)."""
    config, *overrides = getattr(cfg, "invocation", ()) or (cfg.name,)
    return shlex.join(["python", cfg.script, "--config", config, *overrides])
