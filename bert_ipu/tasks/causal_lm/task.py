"""Causal language modelling (GPT-2, Llama), packed or unpacked, pretraining or SFT: a task of the engine.

    python run_causal_lm.py --config causal_tiny_llama_packed

1. Tokenize the source (data.py): text cut into sequences of at most the pack length, or SFT
   chats / prompt-response pairs with labels on the assistant's tokens only. Labels are next tokens of the
   same sequence: none crosses a boundary. Hold out `data.validation_fraction` of the sequences.
2. Pack the sequences whole, back to back (bert_ipu/data/contiguous.py), with any packing algorithm
   (`none` = one per row, padded) at depth K; positions restart in every sequence.
3. Train PackedLlamaForCausalLM / PackedGPT2LMHeadModel (bert_ipu/models/; document-causal attention) on
   the engine: about `train.global_batch_size` sequences per update, the loss of `data.loss_mode` with the
   update's global counts (all micro-batches, all ranks).
4. Validate (loss and perplexity per label token, over the ranks) and export a folder that
   `AutoModelForCausalLM`, `AutoTokenizer` and `pipeline("text-generation")` load.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch

from ...data.contiguous import pack_levels, pack_sequences
from ...data.layout import IGNORE_INDEX
from ...data.loader import ArraySource, Level, evaluation_rows
from ...data.text import DataInputError
from ...engine.parallel import global_counts
from ...engine.runtime import RunError, Runtime
from ...models import causal_lm_class, causal_lm_classes, plans
from ...models.hf_io import export_model
from ...models.llama import PackedLlamaForCausalLM
from ...models.losses import (HiddenStates, causal_lm_loss, causal_lm_loss_sums, chunked_causal_lm_loss_sums,
                              sequence_label_weights, whole)
from ...packing import PackingInputError
from ..base import TaskBase
from ..common import command, pack_depth, packing_line, require_checkpoint_folder
from .data import (CausalReport, bos_first, load_tokenizer, sft_sequences, source_texts, text_sequences,
                  train_tokenizer, turn_end_token)

INPUTS = ("input_ids", "position_ids", "sequence_ids")
FIELDS = (*INPUTS, "labels", "label_weights")  # every one per token: sequence parallelism splits them all
NORMALIZER = {"token": "label_tokens", "sequence": "labelled_sequences", "sum": None}


class CausalLMTask(TaskBase):
    name = "causal_lm"
    input_fields = INPUTS
    target_fields = ("labels", "label_weights")
    sequence_fields = FIELDS
    stat_names = ("token_loss_sum", "sequence_loss_sum", "correct")
    pipeline_plan = None
    drop_last = False
    has_evaluation = True
    headline = ("val_loss", "val_perplexity")
    progress_keys = ("loss", "val_loss", "tokens_per_second")

    def __init__(self, cfg, progress: bool = True):
        self.cfg, self.progress = cfg, progress

    # --- data ----------------------------------------------------------------------------------------------
    def prepare(self, rt: Runtime) -> None:
        self.rt = rt
        d, m = self.cfg.data, self.cfg.model
        say = lambda msg: rt.say(msg, "causal_lm")  # noqa: E731
        S = d.max_seq_length
        try:
            if d.tokenizer:
                self.tokenizer = load_tokenizer(d.tokenizer)
            elif m.init_checkpoint:
                require_checkpoint_folder(m.init_checkpoint)
                self.tokenizer = load_tokenizer(m.init_checkpoint)
            else:
                say(f"training a byte-level BPE tokenizer of {d.vocab_size} tokens on {d.source}")
                self.tokenizer = train_tokenizer(source_texts(d.format, d.source), d.vocab_size)
            self.report = CausalReport()
            seqs = (text_sequences([d.source], self.tokenizer, S, self.report) if d.format == "text" else
                    sft_sequences(d.source, self.tokenizer, S, d.too_long, self.report))
            say(f"{d.source}: {self.report.summary()}")
            order = np.random.default_rng(self.cfg.train.seed).permutation(len(seqs))
            held = int(round(d.validation_fraction * len(seqs))) if d.validation_fraction else 0
            held = min(max(held, 1 if d.validation_fraction else 0), len(seqs) - 1)
            self.sequences = {"train": seqs.subset(np.sort(order[held:]))}
            if held:
                self.sequences["validation"] = seqs.subset(np.sort(order[:held]))
            self.depth = pack_depth(self.sequences["train"].lengths, S, d.algorithm, d.max_sequences_per_pack)
            self.packed_splits = {split: self._pack(s) for split, s in self.sequences.items()}
            self.by_length = self._pack_levels(self.sequences["train"]) if d.pack_lengths else None
        except (DataInputError, PackingInputError, OSError) as e:
            raise RunError(str(e)) from None
        for split, p in self.packed_splits.items():
            say(packing_line(split, d.algorithm, "sequences", p, S))
        for length, p in (self.by_length or {}).items():
            say(packing_line(f"train, level {length}", d.algorithm, "sequences", p, length))
        if self.by_length:  # the model's slots (varlen's segments) cover every level's deepest pack
            self.depth = max(self.depth, *(p.max_sequences_per_pack for p in self.by_length.values()))
        self.packing_factor = self.packed_splits["train"].packing_factor
        self.packed = self.depth > 1

    def _pack(self, seqs):
        d = self.cfg.data
        packed = pack_sequences(seqs.lengths, {"input_ids": seqs.input_ids, "labels": seqs.labels}, d.max_seq_length,
                                d.algorithm, self.depth, seed=self.cfg.train.seed, fill={"labels": IGNORE_INDEX})
        return self._weighted(packed)

    def _pack_levels(self, seqs) -> dict:
        """The training sequences in packs of every data.pack_lengths (those the packer used), each level's rows
        with their label weights; with pack_lengths auto, the lengths `choose_pack_lengths` picks."""
        d = self.cfg.data
        limit = None if d.max_sequences_per_pack == "max" else self.depth  # auto: the depth resolved for one length
        lengths, costs = d.pack_lengths, None
        self.auto_settings = {}
        if lengths == "auto":
            lengths, costs = self.choose_pack_lengths(seqs.lengths, limit)
        levels = pack_levels(seqs.lengths, {"input_ids": seqs.input_ids, "labels": seqs.labels}, lengths,
                             limit, seed=self.cfg.train.seed, fill={"labels": IGNORE_INDEX}, costs=costs)
        return {length: self._weighted(p) for length, p in levels.items()}

    def choose_pack_lengths(self, lengths: np.ndarray, limit: int | None) -> tuple[list[int], list[float]]:
        """data.pack_lengths auto: HBP's level selection on a model of the step time (bert_ipu.packing.levels) for
        this model's shape, the run's processes and data.level_memory_tokens; says the table it chose from.
        (the lengths, the modelled cost of a full pack of each: the packer packs with the costs it chose by)"""
        from ...packing.histogram import histogram_of
        from ...models.attention import backend
        from ...packing.levels import StepModel, choose_levels, format_choice, level_costs

        m, d = self.cfg.model, self.cfg.data
        skips = backend(m.attention_backend).skips_masked and self.rt.device.type == "cuda"
        model = StepModel(m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                          m.intermediate_size, devices=self.rt.world, memory_tokens=d.level_memory_tokens,
                          document_attention=skips, vocab=len(self.tokenizer))
        tokens = self.cfg.train.global_batch_size * float(np.mean(lengths))
        choice = choose_levels(histogram_of(lengths, d.max_seq_length), model, int(tokens), max_levels=3,
                               max_sequences_per_pack=limit)
        self.rt.say("pack lengths chosen by the modelled step time (bert_ipu.packing.levels; seconds are the model's):\n"
                    + format_choice(choice, 6), "causal_lm")
        self.level_choice, self.auto_settings = choice, dict(zip(choice.lengths, choice.settings))
        return choice.lengths, level_costs(model, choice.lengths)

    @staticmethod
    def _weighted(packed):
        """Each label token's weight in its sequence's mean, added to the rows: a per-token field any split of the
        tokens keeps (sequence parallelism)."""
        rows = packed.rows
        rows["label_weights"] = sequence_label_weights(torch.from_numpy(rows["labels"]),
                                                       torch.from_numpy(rows["sequence_ids"]),
                                                       packed.max_sequences_per_pack).to(torch.float32).numpy()
        return packed

    def train_levels(self) -> list[Level]:
        """One level (data.max_seq_length), or one a pack length the packer used (data.pack_lengths), with
        train.levels' settings: micro-batches of about as many tokens as train.micro_batch_size packs of the
        longest length unless set, no sequence parallelism or checkpointing unless set."""
        if self.by_length is None:
            return super().train_levels()
        d, t = self.cfg.data, self.cfg.train
        if self.auto_settings:  # (sequence-parallel size, checkpointed layers) the level model chose
            settings = {n: {"sequence_parallel": s, "checkpointed_layers": c} for n, (s, c) in self.auto_settings.items()}
        else:
            settings = dict(zip(d.pack_lengths, (t.levels or []) + [None] * len(d.pack_lengths)))
        top, out = max(self.by_length), []
        for length, packed in self.by_length.items():
            chosen = settings.get(length) or {}
            micro = chosen.get("micro_batch_size") or max(1, round(t.micro_batch_size * top / length))
            out.append(Level(length, ArraySource({k: packed.rows[k] for k in FIELDS}, label_fields=("labels",)),
                             micro, chosen.get("sequence_parallel") or 1, chosen.get("checkpointed_layers") or 0,
                             packed.packing_factor))
        return out

    def _source(self, split: str) -> ArraySource:
        return ArraySource({k: self.packed_splits[split].rows[k] for k in FIELDS}, label_fields=("labels",))

    def train_source(self):
        return self._source("train")

    def layout_record(self) -> dict:
        d = self.cfg.data
        return {"pack_len": d.max_seq_length, "max_sequences_per_pack": self.depth, "algorithm": d.algorithm,
                "packing_factor": self.packing_factor, "format": d.format, "vocab_size": len(self.tokenizer),
                "tokenizer_sha256": hashlib.sha256(self.tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
                if self.tokenizer.is_fast else None} | ({"pack_lengths": list(self.by_length)} if self.by_length else {})

    def describe(self) -> str:
        p = self.packed_splits["train"]
        return (f"{self.cfg.data.format} {self.cfg.data.source}: {p.packs} rows of {len(p.row)} sequences "
                f"(S={self.cfg.data.max_seq_length}, K={self.depth}, p={p.packing_factor:.3f}), "
                f"loss per {self.cfg.data.loss_mode}")

    # --- model and loss ------------------------------------------------------------------------------------
    def build_model(self):
        m, S = self.cfg.model, self.cfg.data.max_seq_length
        kwargs = dict(attention_backend=m.attention_backend, max_sequences_per_pack=self.depth)
        if m.init_checkpoint:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(m.init_checkpoint, local_files_only=True)
            try:  # a model type we have no file for, or a rope type packing cannot keep exact: one line
                model = causal_lm_class(config).from_pretrained(m.init_checkpoint, **kwargs)
            except ValueError as e:
                raise RunError(f"model.init_checkpoint {m.init_checkpoint}: {e}") from None
        else:
            model = causal_lm_classes()[m.family](m.hf_config(self.tokenizer, S), **kwargs)
        model.head_in_loss = m.loss_chunk_tokens is not None
        if model.head_in_loss and self.cfg.parallel.tensor_parallel > 1:
            raise RunError("model.loss_chunk_tokens computes the LM head in the loss, and under tensor parallelism "
                           "the head is split over the vocabulary (its own parallel loss); set "
                           "model.loss_chunk_tokens=null or parallel.tensor_parallel=1")
        if model.config.vocab_size < len(self.tokenizer):
            raise RunError(f"the tokenizer has {len(self.tokenizer)} tokens but the model only "
                           f"{model.config.vocab_size}; give the tokenizer the model was trained with (data.tokenizer)")
        if model.config.max_position_embeddings < S:
            raise RunError(f"data.max_seq_length {S} is longer than the model's {model.config.max_position_embeddings} "
                           "positions; lower data.max_seq_length")
        return model

    def tensor_plan(self, model):
        return plans.LLAMA if isinstance(model, PackedLlamaForCausalLM) else None

    def counts(self, micro: list[dict]) -> dict:
        K = self.depth
        labelled = []
        for b in micro:
            has = (b["labels"] != IGNORE_INDEX).to(torch.int64)
            per = torch.zeros(len(has), K + 1, dtype=torch.int64, device=has.device).scatter_add(
                1, b["sequence_ids"].long(), has)[:, 1:]
            labelled.append((per > 0).sum())
        return {"label_tokens": sum((b["labels"] != IGNORE_INDEX).sum() for b in micro),
                "labelled_sequences": sum(labelled),
                "sequences": sum(torch.amax(b["sequence_ids"], 1).sum() for b in micro),  # ids are 1..k in order
                "tokens": sum((b["sequence_ids"] > 0).sum() for b in micro)}

    def normalizers(self, counts: dict) -> dict:
        key = NORMALIZER[self.cfg.data.loss_mode]
        return {} if key is None else {key: max(counts[key], 1.0)}

    def loss(self, logits, targets: dict, normalizers: dict):
        labels = targets["labels"]
        if isinstance(logits, HiddenStates):  # model.loss_chunk_tokens: the head applied chunk by chunk
            sums, correct = chunked_causal_lm_loss_sums(logits, labels, targets["label_weights"],
                                                        self.cfg.model.loss_chunk_tokens)
        else:
            sums = causal_lm_loss_sums(logits, labels, targets["label_weights"])
            with torch.no_grad():
                correct = ((whole(logits.argmax(-1)) == labels) & (labels != IGNORE_INDEX)).sum()
        loss = causal_lm_loss(sums, self.cfg.data.loss_mode, normalizers)
        return loss, {"token_loss_sum": sums.token_loss_sum, "sequence_loss_sum": sums.sequence_loss_sum,
                      "correct": correct}

    @staticmethod
    def summarize(s: dict) -> dict:
        n, k = max(s.get("label_tokens", 0.0), 1.0), max(s.get("labelled_sequences", 0.0), 1.0)
        loss = s["token_loss_sum"] / n
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "sequence_loss": s["sequence_loss_sum"] / k,
                "accuracy": s["correct"] / n, "sequences": s.get("sequences", 0.0), "tokens": s.get("tokens", 0.0)}

    # --- evaluation and export -----------------------------------------------------------------------------
    def evaluate(self, engine, rt: Runtime, step: int) -> dict:
        """Loss and perplexity per label token over the first `validation_batches` x `micro_batch_size` packs of
        the held-out sequences (or all), each evaluated once over the data-parallel replicas (evaluation_rows)."""
        if "validation" not in self.packed_splits:
            return {}
        t = self.cfg.train
        source = self._source("validation")
        rows = evaluation_rows(source.packs, t.validation_batches * t.micro_batch_size, t.micro_batch_size,
                               rt.dp_rank, rt.dp_world, engine.eval_group)
        micro = [{k: torch.from_numpy(v).to(rt.device) for k, v in source.gather(chunk).items()} for chunk in rows]
        counts = global_counts(self, engine, micro)
        sums = engine.evaluate(micro, self.normalizers(counts)) | counts
        out = self.summarize(sums)
        return {"val_loss": out["loss"], "val_perplexity": out["perplexity"], "val_accuracy": out["accuracy"]}

    def export(self, model, folder: Path, info: dict) -> None:
        d = self.cfg.data
        family = {"gpt2": "GPT-2", "llama": "Llama"}.get(model.config.model_type, model.config.model_type)
        what = "supervised fine-tuning (loss on the assistant's tokens)" if d.format == "sft" else "causal language modelling"
        card = {"task": what, "architecture": family, "pipeline_tag": "text-generation",
                "tags": [model.config.model_type, "packed-bert", "causal-lm"],
                "base_model": self.cfg.model.init_checkpoint or "from scratch",
                "data": f"{d.source} ({len(self.sequences['train']):,} training sequences)",
                "steps": info["steps"], "sequences_seen": int(info["sequences_seen"]),
                "packing": {"algorithm": d.algorithm, "max_sequences_per_pack": self.depth,
                            "packing_factor": round(self.packing_factor, 4)},
                "metrics": {k: v for k, v in info["metrics"].items() if k in ("loss", "val_loss", "val_perplexity")},
                "command": command(self.cfg)}
        self._stop_at_turn_end(model)
        tokenizer = bos_first(self.tokenizer) if self.cfg.data.format == "text" else self.tokenizer
        export_model(model, folder, card=card, tokenizer=tokenizer)

    def _stop_at_turn_end(self, model) -> None:
        """SFT teaches the model to end the assistant's turn with the chat template's end token (`<|end|>` here),
        which generation must stop at: added to the export's generation_config.eos_token_id (it stopped at the
        EOS only, which SFT's labels never hold, so a pipeline ran on into invented turns)."""
        stop = turn_end_token(self.sequences["train"].labels, self.tokenizer) if self.cfg.data.format == "sft" \
            else None
        if stop is None:
            return
        eos = model.config.eos_token_id
        eos = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
        if stop not in eos:
            model.generation["eos_token_id"] = eos + [stop]

    def result_extra(self) -> dict:
        return {"format": self.cfg.data.format, "source": self.cfg.data.source, "algorithm": self.cfg.data.algorithm,
                "max_sequences_per_pack": self.depth, "loss_mode": self.cfg.data.loss_mode,
                "packing": {split: {"rows": p.packs, "sequences": len(p.row), "packing_factor": p.packing_factor,
                                    "efficiency": p.efficiency} for split, p in self.packed_splits.items()},
                "input": vars(self.report)}

