"""bert_ipu.hf: pack_dataset on `datasets`, PackedDataCollator and token_loss in `transformers.Trainer`.

Tiny models built from configs (no download), float32 on the CPU. The invariants: every source token lands in
exactly one pack, positions restart in every document and labels never cross one; on the packs, HF's eager and
sdpa attention see each document alone; a packed Trainer run (gradient accumulation 2) ends with the loss and
weights of the unpacked padded run on the same sequences; packed predictions map back to the source rows equal
to unpacked ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_ipu import hf  # noqa: E402
from bert_ipu.data.layout import IGNORE_INDEX  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def source(n=200, low=1, high=30, seed=0, labels=False):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=n)
    ids = [rng.integers(5, 60, size=int(length)).tolist() for length in lengths]
    columns = {"input_ids": ids, "token_type_ids": [[i % 2] * len(x) for i, x in enumerate(ids)]}
    if labels:  # static MLM masking: about 1 token in 4 is a target
        columns["labels"] = [np.where(rng.random(len(x)) < 0.25, x, IGNORE_INDEX).tolist() for x in ids]
    return datasets.Dataset.from_dict(columns)


def documents(row, values) -> list:
    """A pack's (pack_length,) values cut by its sequence_lengths: its documents' values, then its padding's."""
    return np.split(np.asarray(values), np.cumsum(row["sequence_lengths"]))


# ---------------------------------------------------------------------------------------------- pack_dataset

@pytest.mark.parametrize("causal,labels", [(True, False), (False, True), (True, True)],
                         ids=["causal", "encoder", "causal-with-labels"])
def test_every_token_lands_once_positions_restart_and_labels_stay_inside_documents(tmp_path, causal, labels,
                                                                                    capsys):
    """Every source token appears exactly once, in its own document's slot and order (the pack's
    sequence_lengths); the collator's position_ids restart at 0; a causal LM's labels are its tokens but
    IGNORE_INDEX at each document's first token and on padding (made by the collator where the packs store none);
    an encoder's labels are the source's. The packs store ids, labels only where the source has them, and
    lengths: nothing that follows from the lengths. The report is printed and kept in the info."""
    src = source(labels=labels)
    packed = hf.pack_dataset(src, 48, columns=("input_ids", "token_type_ids"), causal=causal, cache_dir=tmp_path)
    report = hf.packing_report(packed)
    assert "packs over the proven lower bound" in capsys.readouterr().out
    assert report["packs"] == len(packed) and report["sequences"] == len(src) and report["lower_bound_packs"] >= 1
    assert report["packs"] >= report["lower_bound_packs"] and report["gap_to_bound"] >= 0
    assert set(packed.column_names) == {"input_ids", "token_type_ids", "sequence_lengths", "source_rows"} | (
        {"labels"} if labels else set())
    batch = hf.PackedDataCollator(attn_implementation="sdpa", causal=causal)(list(packed))
    seen = []
    for p, row in enumerate(packed):
        assert len(row["input_ids"]) == 48 and len(row["sequence_lengths"]) == len(row["source_rows"])
        ids, types, pos, lab = (documents(row, x) for x in (row["input_ids"], row["token_type_ids"],
                                                             batch["position_ids"][p], batch["labels"][p]))
        assert (lab[-1] == IGNORE_INDEX).all() and (pos[-1] == 0).all()     # the padding
        for j, r in enumerate(row["source_rows"]):
            want = src[r]
            np.testing.assert_array_equal(ids[j], want["input_ids"])
            np.testing.assert_array_equal(types[j], want["token_type_ids"])
            np.testing.assert_array_equal(pos[j], np.arange(len(ids[j])))
            expected = np.array(want["labels"] if labels else want["input_ids"])
            if causal:
                expected[0] = IGNORE_INDEX
            np.testing.assert_array_equal(lab[j], expected)
            if labels:   # stored as the model takes them, also without the collator
                np.testing.assert_array_equal(documents(row, row["labels"])[j], expected)
            seen.append(r)
    assert sorted(seen) == list(range(len(src)))


def test_too_long_rows_error_truncate_or_drop(tmp_path):
    """A row longer than pack_length is a one-line ValueError naming it and the fixes; "truncate" keeps its first
    pack_length tokens, "drop" leaves it out; the report counts both."""
    src = datasets.Dataset.from_dict({"input_ids": [[1] * 5, [2] * 12, [3] * 3, [4] * 9]})
    with pytest.raises(ValueError, match=r"row 1 has 12 tokens, more than pack_length 8 \(2 such rows\).*too_long"):
        hf.pack_dataset(src, 8, cache_dir=tmp_path, verbose=False)
    cut = hf.pack_dataset(src, 8, too_long="truncate", cache_dir=tmp_path, verbose=False)
    rows = {r: doc for p in cut for r, doc in zip(p["source_rows"], documents(p, p["input_ids"]))}
    assert rows[1].tolist() == [2] * 8 and rows[3].tolist() == [4] * 8 and rows[0].tolist() == [1] * 5
    assert hf.packing_report(cut)["truncated"] == 2 and hf.packing_report(cut)["dropped"] == 0
    dropped = hf.pack_dataset(src, 8, too_long="drop", cache_dir=tmp_path, verbose=False)
    assert sorted(r for p in dropped for r in p["source_rows"]) == [0, 2]
    assert hf.packing_report(dropped)["dropped"] == 2 and hf.packing_report(dropped)["sequences"] == 2


def test_bad_input_is_one_clear_error(tmp_path):
    """Bad arguments and data are ValueErrors that say what is wrong and what to do."""
    good = source(5)
    cases = [
        (dict(dataset=good, pack_length=0), "pack_length must be a whole number"),
        (dict(dataset=good, pack_length=32, too_long="cut"), "too_long must be one of error, truncate, drop"),
        (dict(dataset=good, pack_length=32, columns=("input_ids", "nope")), "no column 'nope'"),
        (dict(dataset=good, pack_length=32, columns=("token_type_ids",)), "must start with 'input_ids'"),
        (dict(dataset={"input_ids": [[1]]}, pack_length=32), "takes a datasets.Dataset"),
        (dict(dataset=datasets.Dataset.from_dict({"input_ids": [[1], []]}), pack_length=32), "row 1 is empty"),
        (dict(dataset=datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1]]}), pack_length=32),
         "row 0: 1 labels for 2 input_ids"),
        (dict(dataset=good.to_iterable_dataset(), pack_length=32), "needs a datasets.Dataset.*pack_iterable"),
        # (None, GPT-2's and Llama's tokenizers' pad_token_id, failed inside numpy after the packing; 1.5 packed as 1)
        (dict(dataset=good, pack_length=32, pad_token_id=None), "pad_token_id must be a whole number.*eos_token_id"),
        (dict(dataset=good, pack_length=32, pad_token_id=1.5), "pad_token_id must be a whole number"),
        (dict(dataset=good, pack_length=32, pad_token_id=2**31), "pad_token_id must be a whole number within int32"),
        # (0 looped for ever on empty batches)
        (dict(dataset=good, pack_length=32, batch_size=0), "batch_size must be a whole number >= 1"),
        (dict(dataset=good, pack_length=32, batch_size=None), "batch_size must be a whole number >= 1"),
        # (a label per row in the label column: the advice was to leave it out of columns, where it is not)
        (dict(dataset=datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [1]}), pack_length=32,
              causal=False), "column 'labels' holds int64.*label_column=None, or sequence_label_column='labels'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            hf.pack_dataset(**kwargs, cache_dir=tmp_path, verbose=False)


def test_a_numpy_pad_token_id_packs_as_its_int(tmp_path):
    """A numpy integer pad_token_id (a tokenizer's, read from an array) packs as the same int (it failed in the
    cache key: int64 is not JSON serializable)."""
    packed = hf.pack_dataset(source(5), 32, pad_token_id=np.int64(7), cache_dir=tmp_path, verbose=False)
    row = packed[0]
    assert row["input_ids"][sum(row["sequence_lengths"]):] == [7] * (32 - sum(row["sequence_lengths"]))
    with pytest.raises(ValueError, match="pad_token_id must be a whole number"):
        hf.pack_iterable([{"input_ids": [1, 2]}], 32, pad_token_id=None)


def test_num_proc_2_writes_the_same_packs_as_num_proc_1(tmp_path, monkeypatch):
    """The packs, their order and the report do not depend on num_proc (several shards, two processes)."""
    monkeypatch.setattr(hf, "CHUNK_TOKENS", 32 * 8)      # 8 packs a chunk, 16 chunks a shard: several shards
    monkeypatch.setattr(hf, "SHARD_CHUNKS", 2)
    src = source(600)
    one = hf.pack_dataset(src, 32, cache_dir=tmp_path / "one", num_proc=1, verbose=False)
    two = hf.pack_dataset(src, 32, cache_dir=tmp_path / "two", num_proc=2, verbose=False)
    assert len(list((tmp_path / "two").rglob("*.arrow"))) > 2
    assert one.to_dict() == two.to_dict() and len(one) > 16
    assert hf.packing_report(one) | {"seconds": 0} == hf.packing_report(two) | {"seconds": 0}


def test_a_dataset_on_disk_larger_than_the_memory_allowed_is_packed(tmp_path):
    """pack_dataset of a dataset saved to disk (~96 MB of int32 tokens) raises the process's peak RSS by less
    than half the dataset's size (it reads lengths and chunks of rows, and writes Arrow shards), and every
    source token is in the packs exactly once (count and sum of tokens, and each row's length)."""
    script = textwrap.dedent(f"""
        import resource, sys, numpy as np, pyarrow as pa, datasets
        from datasets.arrow_writer import ArrowWriter
        from bert_ipu import hf
        path = {str(tmp_path / "src.arrow")!r}
        rng = np.random.default_rng(0)
        total = count = 0
        features = datasets.Features({{"input_ids": datasets.Sequence(datasets.Value("int32"))}})
        with ArrowWriter(path=path, features=features) as w:
            for _ in range(24):
                lengths = rng.integers(1, 2048, size=1000)
                flat = rng.integers(1, 30000, size=int(lengths.sum()), dtype=np.int32)
                total += int(flat.astype(np.int64).sum()); count += flat.size
                off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                w.write_table(pa.table({{"input_ids": pa.ListArray.from_arrays(off, flat)}}))
                del flat
            w.finalize()
        src = datasets.Dataset.from_file(path)
        size = count * 4
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        packed = hf.pack_dataset(src, 2048, max_sequences_per_pack=8, causal=False, cache_dir={str(tmp_path / "out")!r},
                                 verbose=False)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        got_total = got_count = 0
        for batch in packed.with_format("numpy").iter(batch_size=4096):
            used = np.array([lengths.sum() for lengths in batch["sequence_lengths"]])
            real = np.arange(batch["input_ids"].shape[1]) < used[:, None]
            got_total += int(batch["input_ids"][real].astype(np.int64).sum()); got_count += int(real.sum())
        print(size, grown, total == got_total, count == got_count, len(src), hf.packing_report(packed)["sequences"])
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    size, grown, same_total, same_count, rows, packed_rows = out.stdout.split()[-6:]
    assert int(size) > 90e6 and int(grown) < int(size) / 2, (size, grown)
    assert same_total == same_count == "True" and rows == packed_rows


# ---------------------------------------------------------------------------------------------- the collator

def llama(impl="sdpa"):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation=impl)
    return transformers.LlamaForCausalLM(config)


def gemma3(impl="sdpa"):
    """A causal LM with sliding layers (window 3) beside full ones: the collator gives it a mask per layer type."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                                           layer_types=["sliding_attention", "full_attention"],
                                           attn_implementation=impl)
    return transformers.Gemma3ForCausalLM(config)


def bert(impl="sdpa"):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, attn_implementation=impl)
    return transformers.BertForMaskedLM(config)


def roberta(impl="sdpa"):
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=80, pad_token_id=1,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                        attn_implementation=impl)
    return transformers.RobertaForMaskedLM(config)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("make", [llama, bert, roberta], ids=["llama", "bert", "roberta"])
def test_each_document_of_a_pack_sees_only_itself(tmp_path, make, impl):
    """On packed rows through PackedDataCollator, every document's logits equal the model's logits on that
    document alone (no padding, positions from HF's defaults, RoBERTa's padding_idx + 1 offset included): no
    token attends across documents, positions restart. Tolerance 1e-5 absolute on float32 logits of size ~1:
    the packed and lone runs differ only in the order of float32 sums (measured ~1e-7)."""
    model = make(impl).eval()
    src = source(12, high=20, seed=3, labels=make is not llama)
    packed = hf.pack_dataset(src, 40, causal=make is llama, cache_dir=tmp_path, verbose=False)
    collator = hf.PackedDataCollator(model)
    assert collator.causal == (make is llama) and collator.position_offset == (2 if make is roberta else 0)
    batch = collator([packed[i] for i in range(len(packed))])
    assert batch["attention_mask"].shape == (len(packed), 1, 40, 40)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        for p, row in enumerate(packed):
            for r, doc in zip(row["source_rows"], documents(row, logits[p])):
                alone = model(input_ids=torch.tensor([src[r]["input_ids"]])).logits[0]
                torch.testing.assert_close(torch.from_numpy(doc), alone, rtol=0, atol=1e-5)


def test_a_model_that_would_attend_across_documents_is_refused():
    """An attention implementation not known to honour the block mask is a ValueError naming it and the fix;
    so are packs whose sequence_lengths the Trainer removed, packs of two lengths in one batch, a collator
    given nothing to decide with, and an encoder-decoder (a BART classifier ran on packed rows without an error,
    its decoder reading across their documents), to the collator and to packed_sequence_classifier."""
    with pytest.raises(ValueError, match=r"'flex_attention' is not known to keep packed documents apart.*eager, sdpa"):
        hf.PackedDataCollator(attn_implementation="flex_attention", causal=True)
    model = llama()
    model.config._attn_implementation = "paged|eager"
    with pytest.raises(ValueError, match=r"'paged\|eager' is not known to keep packed documents apart"):
        hf.PackedDataCollator(model)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        hf.PackedDataCollator(llama())([{"input_ids": [1, 2], "position_ids": [0, 1]}])
    with pytest.raises(ValueError, match=r"pack 1 has sequence_lengths \[2, 2\]: .* at most its 3 tokens"):
        hf.PackedDataCollator(llama())([{"input_ids": [1, 2, 0], "sequence_lengths": [2]},
                                        {"input_ids": [1, 2, 3], "sequence_lengths": [2, 2]}])
    with pytest.raises(ValueError, match="one batch holds packs of 2 and 3 tokens: batch packs of one pack_length"):
        hf.PackedDataCollator(llama())([{"input_ids": [1, 2], "sequence_lengths": [2]},
                                        {"input_ids": [1, 2, 3], "sequence_lengths": [3]}])
    with pytest.raises(ValueError, match="needs the model, or both attn_implementation and causal"):
        hf.PackedDataCollator(attn_implementation="sdpa")
    bart = transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32))
    for make in (hf.PackedDataCollator, hf.packed_sequence_classifier):
        with pytest.raises(ValueError, match=r"BartForSequenceClassification is an encoder-decoder .* unpacked"):
            make(bart)


def test_flash_inputs_equal_transformers_own_flattening(tmp_path):
    """For flash_attention_* the collator gives what DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    gives for the same documents in the same order: one row without padding, restarting position_ids, labels with
    IGNORE_INDEX at each document's first token, cu_seq_lens and max lengths (the varlen kernels' inputs; the
    kernels themselves need a GPU and are not run here)."""
    packed = hf.pack_dataset(source(30), 64, cache_dir=tmp_path, verbose=False)
    rows = [packed[0], packed[1]]
    ours = hf.PackedDataCollator(attn_implementation="flash_attention_2", causal=True)(rows)
    src = source(30)
    docs = [{"input_ids": src[r]["input_ids"]} for row in rows for r in row["source_rows"]]
    theirs = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(docs, return_tensors="pt")
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(ours[key].to(value.dtype), value, rtol=0, atol=0, msg=key)
        else:
            assert ours[key] == value, key


# ---------------------------------------------------------------------------------------------- Trainer

class OrderedTrainer(transformers.Trainer):
    """A Trainer whose micro-batches are the given lists of rows, in order (the unpacked run's batches)."""

    def __init__(self, *args, batches, **kwargs):
        self.batches = batches
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self):
        loader = torch.utils.data.DataLoader(self.train_dataset, batch_sampler=self.batches,
                                             collate_fn=self.data_collator)
        return self.accelerator.prepare(loader)


def pad_collator(causal):
    """The unpacked reference: right padding, a 2D attention mask, IGNORE_INDEX labels on padding."""
    def collate(features):
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, IGNORE_INDEX)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n], mask[i, :n] = torch.tensor(f["input_ids"]), 1
            labels[i, :n] = torch.tensor(f["input_ids"] if causal else f["labels"])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return collate


def train(model, dataset, collator, out, loss=None, batches=None, per_device=2):
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=per_device, gradient_accumulation_steps=2, max_steps=2,
        optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no", remove_unused_columns=False,
        train_sampling_strategy="sequential", use_cpu=True, seed=0, disable_tqdm=True)
    kwargs = dict(model=model, args=args, train_dataset=dataset, data_collator=collator, compute_loss_func=loss)
    trainer = OrderedTrainer(**kwargs, batches=batches) if batches is not None else transformers.Trainer(**kwargs)
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log], model.state_dict()


@pytest.mark.parametrize("make", [llama, bert], ids=["llama-hf-loss", "bert-token-loss"])
def test_packed_trainer_run_equals_the_unpacked_run(tmp_path, make):
    """Trainer, gradient accumulation 2, 2 SGD updates: packs (PackedDataCollator, 2 packs a micro-batch) and the
    same sequences unpadded-order padded (each update's sequences cut into micro-batches of 2 and the rest, so
    micro-batches differ from the packed run's) give the same loss per update and the same weights.

    Data order: the packed run reads packs sequentially; the unpacked run reads, per update, exactly the source
    rows of that update's 4 packs (an OrderedTrainer with explicit batches). Llama uses HF's own loss
    (num_items_in_batch: the update's labels[..., 1:]), BERT MLM `token_loss(causal=False)` (BertForMaskedLM
    averages per micro-batch, which no packing can match). SGD, no clipping: the weights are linear in the
    gradients, so they differ only by float32 summation order; the bound 2e-6 absolute / 1e-5 relative is
    ~20x float32 epsilon on values of size ~1. Step 1's loss is also checked against the token mean computed one
    document at a time without any padding (float64 accumulation of float32 losses, 1e-5 relative)."""
    causal = make is llama
    src = source(80, high=24, seed=1, labels=not causal)
    packed = hf.pack_dataset(src, 48, causal=causal, cache_dir=tmp_path / "packs", verbose=False)
    loss = None if causal else hf.token_loss(causal=False)
    model = make()
    packed_loss, packed_weights = train(model, packed, hf.PackedDataCollator(model), tmp_path / "a", loss=loss)

    updates = [[r for p in range(4 * u, 4 * u + 4) for r in packed[p]["source_rows"]] for u in range(2)]
    batches = [b for rows in updates for b in (rows[:2], rows[2:])]
    reference = make()
    with torch.no_grad():
        total, count = 0.0, 0
        for r in updates[0]:
            ids = torch.tensor([src[r]["input_ids"]])
            labels = ids if causal else torch.tensor([src[r]["labels"]])
            logits = reference(input_ids=ids).logits[0]
            if causal:
                logits, labels = logits[:-1], labels[:, 1:]
            total += torch.nn.functional.cross_entropy(logits, labels[0], ignore_index=IGNORE_INDEX,
                                                       reduction="sum").double().item()
            count += int(labels.ne(IGNORE_INDEX).sum())
    plain_loss, plain_weights = train(reference, src, pad_collator(causal), tmp_path / "b", loss=loss, batches=batches)

    assert len(packed_loss) == len(plain_loss) == 2
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    np.testing.assert_allclose(packed_loss[0], total / count, rtol=1e-5)
    moved = 0
    for name, weight in packed_weights.items():
        torch.testing.assert_close(weight, plain_weights[name], rtol=1e-5, atol=2e-6, msg=name)
        moved += int(not torch.equal(weight, make().state_dict()[name]))
    assert moved > 10  # the updates changed the weights: equal weights are not two untouched models


@pytest.mark.parametrize("make", [llama, gemma3], ids=["llama", "gemma3"])
def test_trl_sft_trainer_packed_equals_unpacked(tmp_path, make):
    """TRL's SFTTrainer with PackedDataCollator on packs (its own preparation skipped) ends, after 2 SGD updates
    of gradient accumulation 2, with the weights and losses of SFTTrainer on the same sequences padded (the
    unpacked run's micro-batches cut differently, as in the Trainer test above): 1e-5 relative / 2e-6 absolute.
    Gemma 3 (window 3, documents up to 24 tokens) takes a mask per layer type, a `LayerMasks` dict: a plain dict
    made SFTTrainer fail (it logs attention_mask.sum() as its token count).
    SFTConfig turns bf16 autocast on by default (on the CPU too, with use_cpu): bf16=False here, float32 being
    what an equivalence can be checked in; with bf16 the two runs differ by about 1e-3, as any two bf16 runs of
    differently cut micro-batches do."""
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, models

    vocab = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=vocab, pad_token="t0", eos_token="t1")

    class OrderedSFTTrainer(trl.SFTTrainer):
        def __init__(self, *args, batches, **kwargs):
            self.batches = batches
            super().__init__(*args, **kwargs)

        get_train_dataloader = OrderedTrainer.get_train_dataloader

    def sft(model, dataset, collator, out, batches=None):
        args = trl.SFTConfig(
            output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2,
            optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no", remove_unused_columns=False,
            train_sampling_strategy="sequential", use_cpu=True, seed=0, disable_tqdm=True, bf16=False,
            dataset_kwargs={"skip_prepare_dataset": True})
        kwargs = dict(model=model, args=args, train_dataset=dataset, data_collator=collator, processing_class=tokenizer)
        trainer = OrderedSFTTrainer(**kwargs, batches=batches) if batches is not None else trl.SFTTrainer(**kwargs)
        trainer.train()
        return [log["loss"] for log in trainer.state.log_history if "loss" in log], model.state_dict()

    src = source(80, high=24, seed=1)
    packed = hf.pack_dataset(src, 48, causal=True, cache_dir=tmp_path / "packs", verbose=False)
    model = make()
    packed_loss, packed_weights = sft(model, packed, hf.PackedDataCollator(model), tmp_path / "a")
    updates = [[r for p in range(4 * u, 4 * u + 4) for r in packed[p]["source_rows"]] for u in range(2)]
    batches = [b for rows in updates for b in (rows[:2], rows[2:])]
    plain_loss, plain_weights = sft(make(), src, pad_collator(True), tmp_path / "b", batches=batches)
    assert len(packed_loss) == len(plain_loss) == 2
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    start = make().state_dict()
    assert sum(not torch.equal(w, start[name]) for name, w in packed_weights.items()) > 10  # the weights moved
    for name, weight in packed_weights.items():
        torch.testing.assert_close(weight, plain_weights[name], rtol=1e-5, atol=2e-6, msg=name)


@pytest.mark.parametrize("make", [llama, bert], ids=["llama", "bert"])
def test_packed_predict_maps_back_to_source_rows_equal_to_unpacked(tmp_path, make):
    """Trainer.predict on the packs, mapped back with unpack_outputs, gives every source row the logits that
    predicting it unpacked (padded, batch of 4) gives; 1e-5 absolute as above."""
    causal = make is llama
    src = source(30, high=20, seed=2, labels=not causal)
    packed = hf.pack_dataset(src, 40, causal=causal, cache_dir=tmp_path, verbose=False)
    model = make().eval()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "p"), per_device_eval_batch_size=3,
                                          report_to=[], remove_unused_columns=False, use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, data_collator=hf.PackedDataCollator(model))
    rows = hf.unpack_outputs(packed, trainer.predict(packed).predictions)
    plain = transformers.Trainer(model=model, args=args, data_collator=pad_collator(causal)).predict(src).predictions
    assert len(rows) == len(src)
    for r, logits in enumerate(rows):
        n = len(src[r]["input_ids"])
        assert logits.shape == (n, 64)
        np.testing.assert_allclose(logits, plain[r][:n], rtol=0, atol=1e-5)



DDP_SCRIPT = """
import json, sys, torch, datasets, transformers
sys.path.insert(0, {tests!r})
import test_hf
from bert_ipu import hf
packed = datasets.load_from_disk({packs!r})
model = test_hf.llama()
args = transformers.TrainingArguments(
    output_dir={out!r}, per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=2, optim="sgd",
    learning_rate=0.5, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, logging_steps=1,
    report_to=[], save_strategy="no", remove_unused_columns=False, train_sampling_strategy="sequential",
    use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False, seed=0, disable_tqdm=True)
trainer = transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=hf.PackedDataCollator(model))
trainer.train()
if trainer.args.process_index == 0:
    assert trainer.args.world_size == 2
    torch.save({{"loss": [log["loss"] for log in trainer.state.log_history if "loss" in log],
                "weights": model.state_dict()}}, {out!r} + "/result.pt")
torch.distributed.barrier()
# gloo's threads can abort in their destructors at interpreter exit ("terminate called without an active
# exception"): the work is written and every rank is past the barrier, so leave without teardown, as
# bert_ipu.engine.runtime does
sys.stdout.flush(); sys.stderr.flush()
import os; os._exit(0)
"""


def test_two_ddp_processes_equal_one_process(tmp_path):
    """2 DDP processes (torchrun, gloo, CPU), 1 pack a micro-batch each, gradient accumulation 2: each update is
    the same 4 packs as one process with 2 packs a micro-batch, and Trainer's average_tokens_across_devices
    normalises by the tokens of all ranks, so the loss and every weight after 2 SGD updates equal the one-process
    packed run's (which test_packed_trainer_run_equals_the_unpacked_run ties to the unpacked run); tolerances as
    there."""
    import socket

    src = source(80, high=24, seed=1)
    packed = hf.pack_dataset(src, 48, causal=True, cache_dir=tmp_path / "packs", verbose=False)
    packed.save_to_disk(str(tmp_path / "saved"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests"), packs=str(tmp_path / "saved"),
                                        out=str(tmp_path / "ddp")))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(port), str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp" / "result.pt")
    model = llama()
    one_loss, one_weights = train(model, packed, hf.PackedDataCollator(model), tmp_path / "one")
    assert len(ddp["loss"]) == len(one_loss) == 2
    np.testing.assert_allclose(ddp["loss"], one_loss, rtol=1e-5)
    for name, weight in one_weights.items():
        torch.testing.assert_close(ddp["weights"][name], weight, rtol=1e-5, atol=2e-6, msg=name)


@pytest.mark.parametrize("make", [llama, bert], ids=["llama", "bert"])
def test_packed_evaluate_token_metrics_equal_unpacked(tmp_path, make):
    """Trainer.evaluate with token_metrics: eval_token_loss and eval_token_accuracy over the packs equal those of
    the same rows unpacked (padded, batches of 4) and the token mean computed one row at a time without padding
    (1e-5 relative: float32 losses summed in float64)."""
    causal = make is llama
    src = source(30, high=20, seed=5, labels=not causal)
    packed = hf.pack_dataset(src, 40, causal=causal, cache_dir=tmp_path, verbose=False)
    model = make().eval()
    preprocess, compute = hf.token_metrics(causal)

    def evaluate(dataset, collator, batch):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "e"), per_device_eval_batch_size=batch,
                                              report_to=[], remove_unused_columns=False, use_cpu=True,
                                              disable_tqdm=True)
        return transformers.Trainer(model=model, args=args, data_collator=collator, compute_metrics=compute,
                                    preprocess_logits_for_metrics=preprocess).evaluate(dataset)

    ours = evaluate(packed, hf.PackedDataCollator(model), 3)
    plain = evaluate(src, pad_collator(causal), 4)
    total = hits = count = 0.0
    with torch.no_grad():
        for row in src:
            ids = torch.tensor([row["input_ids"]])
            labels = (ids if causal else torch.tensor([row["labels"]]))[0]
            logits = model(input_ids=ids).logits[0]
            if causal:
                logits, labels = logits[:-1], labels[1:]
            keep = labels != IGNORE_INDEX
            total += torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum").double().item()
            hits += int((logits[keep].argmax(-1) == labels[keep]).sum())
            count += int(keep.sum())
    for result in (ours, plain):
        np.testing.assert_allclose(result["eval_token_loss"], total / count, rtol=1e-5)
        np.testing.assert_allclose(result["eval_token_accuracy"], hits / count, rtol=1e-6)


def test_a_stream_is_packed_buffer_by_buffer(tmp_path):
    """pack_iterable on an IterableDataset: every source row is in exactly one pack, with its own tokens, labels
    and restarting positions, and a pack only holds rows of one buffer of buffer_size consecutive rows; a
    datasets.Dataset or a bad buffer_size is a ValueError."""
    src = source(230, seed=6)
    stream = hf.pack_iterable(src.to_iterable_dataset(), 48, buffer_size=100, columns=("input_ids", "token_type_ids"))
    seen = []
    collate = hf.PackedDataCollator(attn_implementation="sdpa", causal=True)
    for row in stream:
        batch = collate([row])
        ids, pos, lab = (documents(row, x) for x in (row["input_ids"], batch["position_ids"][0], batch["labels"][0]))
        assert len({r // 100 for r in row["source_rows"]}) == 1          # one buffer a pack
        for j, r in enumerate(row["source_rows"]):
            np.testing.assert_array_equal(ids[j], src[r]["input_ids"])
            np.testing.assert_array_equal(pos[j], np.arange(len(ids[j])))
            np.testing.assert_array_equal(lab[j], [IGNORE_INDEX] + src[r]["input_ids"][1:])
            seen.append(r)
    assert sorted(seen) == list(range(len(src)))
    with pytest.raises(ValueError, match="pack a datasets.Dataset with pack_dataset"):
        hf.pack_iterable(src, 48)
    with pytest.raises(ValueError, match="buffer_size must be a whole number >= 1"):
        hf.pack_iterable(src.to_iterable_dataset(), 48, buffer_size=0)


def test_a_list_of_rows_streams_whole():
    """pack_iterable on a plain list of rows ("any iterable of dicts"): datasets split a list in its generator's
    arguments into one shard per element, so every row was packed alone as source row 0 (60 packs for 60 rows
    of up to 7 tokens in packs of 16); now the list streams whole, buffer by buffer."""
    rows = [{"input_ids": list(range(1, 2 + i % 7))} for i in range(60)]
    packs = list(hf.pack_iterable(rows, 16, buffer_size=30))
    assert sorted(r for p in packs for r in p["source_rows"]) == list(range(60))
    assert len(packs) < 40 and all(len({r // 30 for r in p["source_rows"]}) == 1 for p in packs)
    for p in packs:
        ends = np.cumsum(p["sequence_lengths"])
        for r, end, n in zip(p["source_rows"], ends, p["sequence_lengths"]):
            np.testing.assert_array_equal(p["input_ids"][end - n:end], rows[r]["input_ids"])


def test_the_cache_key_holds_what_the_labels_pack_as(tmp_path, monkeypatch):
    """Packs written when a label column packed one way (a bool label packed as float32 before it was a class
    index) are not reused once it packs another way: the cache key holds the label width."""
    src = labelled_source(20)
    first = hf.pack_dataset(src, 48, sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    monkeypatch.setattr(hf, "_sequence_label_width", lambda *args: 0)   # (the same data, labels as floats)
    again = hf.pack_dataset(src, 48, sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    assert first.features["sequence_labels"].feature.dtype == "int64"
    assert again.features["sequence_labels"].feature.dtype == "float32"


def test_two_processes_packing_into_one_cache_write_it_once_and_read_the_same_packs(tmp_path, monkeypatch):
    """Two processes (torchrun's ranks, each calling pack_dataset before training) pack the same data into the same
    cache at once: the second waits for the first's packs and reads them. Both wrote the same .tmp shards before,
    and one crashed on the other's rename (5 of 5 runs of 60,000 rows). Here the first is held inside its write
    until the second has had 3 s on its own: without the lock, the second wrote the packs too in that time."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    writes, writing, go = context.Value("i", 0), context.Event(), context.Event()
    held, write = [False], hf._write_shard

    def counted(plan, job):
        with writes.get_lock():
            writes.value += 1
        writing.set()
        if held[0]:
            go.wait(30)
        write(plan, job)
    monkeypatch.setattr(hf, "_write_shard", counted)
    src = source(300)

    def run(hold, out):
        held[0] = hold
        packed = hf.pack_dataset(src, 64, cache_dir=tmp_path / "cache", verbose=False)
        np.save(out, np.asarray(packed.with_format("numpy")["input_ids"]))
        os._exit(0)
    first = context.Process(target=run, args=(True, tmp_path / "first.npy"))
    first.start()
    assert writing.wait(30)
    second = context.Process(target=run, args=(False, tmp_path / "second.npy"))
    second.start()
    second.join(3)
    go.set()
    first.join(30)
    second.join(30)
    assert first.exitcode == 0 and second.exitcode == 0
    assert writes.value == len(hf._shards(int(np.load(tmp_path / "first.npy").shape[0]), 64))
    np.testing.assert_array_equal(np.load(tmp_path / "first.npy"), np.load(tmp_path / "second.npy"))


def test_columns_that_would_pack_wrong_are_refused_with_the_row():
    """Per-token columns are stored as int32: a float column (loss weights 0.5 packed as 0), an id past 2**31
    (wrapped negative) or a None inside a row's list (stored as -2**31) packed silently before; a string column,
    a column named twice or the label column among `columns` gave pyarrow tracebacks. Each is a one-line
    ValueError now, a stream's naming the row counted from the start of the stream (its buffer's row before)."""
    def refused(data, match, **kwargs):
        with pytest.raises(ValueError, match=match):
            hf.pack_dataset(datasets.Dataset.from_dict(data), 8, verbose=False, **kwargs)

    refused({"input_ids": [[1, 2], [3]], "w": [[0.5, 1.0], [2.0]]}, "lists of double", columns=("input_ids", "w"))
    refused({"input_ids": [[5, 2**31 + 5], [8]]}, "row 0 .* outside int32")
    refused({"input_ids": [[5, 6], [8, None, 9]]}, "row 1 .* missing value")
    refused({"input_ids": [[5, 6], [8]], "labels": [[5, None], [8]]}, "row 0 of column 'labels'")
    refused({"input_ids": ["a b", "c"]}, "holds string, not lists")
    refused({"input_ids": [[5]], "labels": [[5]]}, "leave it out of columns", columns=("input_ids", "labels"))
    refused({"input_ids": [[5]]}, "twice", columns=("input_ids", "input_ids"))
    rows = [{"input_ids": [1, 2]}] * 5 + [{"input_ids": [1] * 20}] + [{"input_ids": [1]}]
    with pytest.raises(ValueError, match="row 5 has 20 tokens"):
        list(hf.pack_iterable(rows, 8, buffer_size=3))
    with pytest.raises(ValueError, match="the stream is empty"):
        list(hf.pack_iterable([], 8))
    with pytest.raises(ValueError, match="no input_ids"):
        hf.PackedDataCollator(attn_implementation="sdpa", causal=True)([{"sequence_lengths": [2]}])


def test_what_the_checks_above_must_still_take(tmp_path, monkeypatch):
    """A review of the fixes above: a config with no pad_token_id (CodeGen's) made the collator raise an
    AttributeError; a "labels" column among `columns` with sequence_label_column set (label_column unused) was
    refused; a uint64 id past 2**63 got pyarrow's error, not the one line; a finished cache on a read-only file
    system could not be read (the lock file was opened first)."""
    import filelock
    import pyarrow as pa

    model = transformers.CodeGenForCausalLM(transformers.CodeGenConfig(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, rotary_dim=4, n_positions=64))
    assert not hasattr(model.config, "pad_token_id")
    batch = hf.PackedDataCollator(model)([{"input_ids": [5, 6, 7, 8, 9, 0], "sequence_lengths": [2, 3]}])
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, IGNORE_INDEX, 8, 9, IGNORE_INDEX]]
    src = labelled_source(12).add_column("labels", [[1] * len(r) for r in labelled_source(12)["input_ids"]])
    packed = hf.pack_dataset(src, 48, columns=("input_ids", "labels"), sequence_label_column="label",
                             cache_dir=tmp_path / "a", verbose=False)
    assert {"labels", "sequence_labels"} <= set(packed.column_names)
    ids = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), pa.array([5, 2**63 + 5, 7], pa.uint64()))
    with pytest.raises(ValueError, match="row 0 of column 'input_ids' .* outside int32"):
        hf.pack_dataset(datasets.Dataset(pa.table({"input_ids": ids})), 8, cache_dir=tmp_path / "b", verbose=False)
    first = hf.pack_dataset(src, 48, cache_dir=tmp_path / "c", verbose=False)

    def read_only(path, *args, **kwargs):   # (what opening a lock file on a read-only file system does)
        raise OSError(30, "Read-only file system", path)
    monkeypatch.setattr(filelock, "FileLock", read_only)
    assert hf.pack_dataset(src, 48, cache_dir=tmp_path / "c", verbose=False)["input_ids"] == first["input_ids"]


def test_a_stream_is_read_whole_by_loader_workers_and_its_edges_pack_or_are_refused():
    """pack_iterable: a sharded IterableDataset read through a DataLoader with 2 workers gives every row once
    (worker 0 read only its share of the 4 shards: half the rows, with wrong source_rows); a buffer whose rows are
    all too long is dropped, not the end of the stream (too_long="drop"); whole numbers in a buffer of a float
    label stream are floats; a generator (read once) is refused, and so is a row without the label."""
    src = labelled_source(40, problem="regression")
    sharded = src.to_iterable_dataset(num_shards=4)
    stream = hf.pack_iterable(sharded, 48, buffer_size=100, causal=False, sequence_label_column="label")
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    assert sorted(r for row in loader for r in row["source_rows"]) == list(range(40))
    rows = [{"input_ids": [1] * (5 + i % 4), "label": float(i % 3) + 0.5} for i in range(30)]
    rows[20:] = [{"input_ids": [1] * 30, "label": 1} for _ in range(10)]     # buffer 3: too long, whole numbers
    rows[10:20] = [{"input_ids": [1] * 6, "label": i % 2} for i in range(10)]  # buffer 2: whole numbers
    packs = list(hf.pack_iterable(rows, 24, buffer_size=10, causal=False, sequence_label_column="label",
                                  too_long="drop"))
    assert sorted(r for p in packs for r in p["source_rows"]) == list(range(20))
    assert all(np.asarray(p["sequence_labels"]).dtype.kind == "f" for p in packs)
    with pytest.raises(ValueError, match="can be read once"):
        hf.pack_iterable((row for row in rows), 24)
    for bad in ({"input_ids": [[1, 2]]}, "text", 7):
        with pytest.raises(ValueError, match="streams rows"):
            hf.pack_iterable(bad, 24)
    with pytest.raises(ValueError, match="missing labels"):
        list(hf.pack_iterable(rows[:5] + [{"input_ids": [1, 2]}], 24, sequence_label_column="label"))
    for bad, match in [(dict(pack_length=0), "pack_length"), (dict(pack_length=24, algorithm="nope"), "algorithm"),
                       (dict(pack_length=24, too_long="cut"), "too_long")]:
        with pytest.raises(ValueError, match=match):   # (at once, not an empty stream)
            hf.pack_iterable(rows, **bad)
    with pytest.raises(ValueError, match="nothing to pack"):   # (every row dropped)
        list(hf.pack_iterable(rows, 4, buffer_size=10, too_long="drop"))
    floats = [{"input_ids": [1] * 5, "label": 0.5}] * 10
    scores = list(hf.pack_iterable(floats + [{"input_ids": [1] * 5, "label": -1}] * 10, 24, buffer_size=10,
                                   causal=False, sequence_label_column="label"))
    assert sorted(set(v for p in scores for v in p["sequence_labels"])) == [IGNORE_INDEX, -1.0, 0.5]
    with pytest.raises(ValueError, match="-100"):   # (a whole -100 in a float stream is the float -100.0)
        list(hf.pack_iterable(floats + [{"input_ids": [1] * 5, "label": IGNORE_INDEX}] * 10, 24, buffer_size=10,
                              causal=False, sequence_label_column="label"))


def test_a_stream_of_labelled_rows_packs_their_labels_and_a_batch_pads_its_slots(tmp_path):
    """pack_iterable with sequence_label_column (regression labels here): each pack's `sequence_labels` are its
    documents' labels in order; buffers' packs differ in slots, and the collator pads a batch's to the widest
    (IGNORE_INDEX in empty slots), so packed_sequence_classifier's loss on a batch of packs of two buffers is the
    sum of the model's own losses on each document alone over their count (float64, 1e-10). A stream whose
    labels change kind between buffers is a ValueError."""
    src = labelled_source(60, problem="regression")
    stream = list(hf.pack_iterable(src.to_iterable_dataset(), 48, buffer_size=25, causal=False,
                                   sequence_label_column="label", columns=("input_ids", "token_type_ids")))
    slots = {len(row["sequence_labels"]) for row in stream}
    assert sorted(r for row in stream for r in row["source_rows"]) == list(range(len(src)))
    for row in stream:
        assert "labels" not in row
        labels = np.asarray(row["sequence_labels"])
        n = len(row["source_rows"])
        np.testing.assert_allclose(labels[:n], [src[r]["label"] for r in row["source_rows"]], rtol=1e-6)
        assert (labels[n:] == IGNORE_INDEX).all()
    first, last = stream[0], stream[-1]   # (the first and the last buffer: 4 and 3 slots, so one is padded)
    assert len(first["sequence_labels"]) != len(last["sequence_labels"]) and len(slots) > 1
    model = classifier("bert", 1).double().eval()
    batch = hf.PackedDataCollator(model)([first, last])
    assert batch["labels"].shape == (2, max(len(first["sequence_labels"]), len(last["sequence_labels"])))
    with torch.no_grad():
        loss = hf.packed_sequence_classifier(model)(**batch)["loss"]
        model.config.problem_type = None
        rows = list(first["source_rows"]) + list(last["source_rows"])
        alone = [float(model(input_ids=torch.tensor([src[r]["input_ids"]]),
                             token_type_ids=torch.tensor([src[r]["token_type_ids"]]),
                             labels=torch.tensor([src[r]["label"]], dtype=torch.float32).double()).loss)
                 for r in rows]
    torch.testing.assert_close(float(loss), sum(alone) / len(rows), rtol=1e-10, atol=0)
    changing = [{"input_ids": src[i]["input_ids"], "label": 1 if i < 30 else 0.5} for i in range(60)]
    with pytest.raises(ValueError, match="another kind"):
        list(hf.pack_iterable(changing, 48, buffer_size=30, sequence_label_column="label"))


def test_our_packed_llama_takes_the_collators_sequence_ids_form(tmp_path):
    """attn_implementation="bert_ipu": our PackedLlamaForCausalLM, given HF's weights, computes from input_ids,
    position_ids and sequence_ids the logits HF's Llama computes on the same packs through the sdpa mask (equal
    at every real token: the same float32 operations, 1e-6), and the labels are ours: the next token of the same
    document, IGNORE_INDEX at a document's last token and on padding."""
    from bert_ipu.models.llama import PackedLlamaForCausalLM

    reference = llama().eval()
    ours = PackedLlamaForCausalLM(reference.config).eval()
    ours.load_state_dict(reference.state_dict())
    src = source(12, high=20, seed=3)
    packed = hf.pack_dataset(src, 40, cache_dir=tmp_path, verbose=False)
    rows = [packed[i] for i in range(len(packed))]
    own = hf.PackedDataCollator(attn_implementation="bert_ipu", causal=True)(rows)
    assert set(own) == {"input_ids", "position_ids", "sequence_ids", "labels"}
    masked = hf.PackedDataCollator(reference)(rows)
    with torch.no_grad():
        got = ours(own["input_ids"], own["position_ids"], own["sequence_ids"])
        want = reference(**{k: v for k, v in masked.items() if k != "labels"}).logits
    real = own["sequence_ids"] > 0
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-6)
    for p, row in enumerate(rows):
        for j, r in enumerate(row["source_rows"], start=1):
            doc = own["sequence_ids"][p] == j
            assert own["labels"][p][doc].tolist() == src[r]["input_ids"][1:] + [IGNORE_INDEX]
    assert (own["labels"][~real] == IGNORE_INDEX).all()


# ---------------------------------------------------------------------------------------------- classification

def classifier(kind, num_labels=3):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_labels=num_labels, attn_implementation="sdpa")
    if kind == "bert":
        config = transformers.BertConfig(**common, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        return transformers.BertForSequenceClassification(config)
    config = transformers.LlamaConfig(**common, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return transformers.LlamaForSequenceClassification(config)


def token_classifier(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=3,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, classifier_dropout=0.0,
                                         attn_implementation="sdpa")
        return transformers.GPT2ForTokenClassification(config)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      num_labels=3, attn_implementation="sdpa")
    return transformers.LlamaForTokenClassification(config)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_decoders_token_classifier_sees_each_document_alone_with_its_labels_as_they_are(tmp_path, kind):
    """A token classifier on a decoder-only architecture (LlamaForTokenClassification; GPT-2's, whose head is
    `classifier`, not `score`) attends causally, so the collator gives it a causal block mask: every document's
    logits equal the model's on that document alone (1e-5, as above). Its labels are per position, not shifted:
    they reach the model as the source gave them, the first token of every document included, IGNORE_INDEX on
    padding only."""
    src = source(12, high=20, seed=3)
    rng = np.random.default_rng(3)
    src = src.add_column("labels", [rng.integers(0, 3, size=len(x)).tolist() for x in src["input_ids"]])
    packed = hf.pack_dataset(src, 40, causal=False, columns=("input_ids",), label_column="labels",
                             cache_dir=tmp_path, verbose=False)
    model = token_classifier(kind).eval()
    collator = hf.PackedDataCollator(model)
    batch = collator([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for p, row in enumerate(packed):
        labels = documents(row, batch["labels"][p])
        for r, doc, doc_labels in zip(row["source_rows"], documents(row, logits[p]), labels):
            with torch.no_grad():
                alone = model(input_ids=torch.tensor([src[r]["input_ids"]])).logits[0]
            torch.testing.assert_close(torch.from_numpy(doc), alone, rtol=0, atol=1e-5)
            assert doc_labels.tolist() == src[r]["labels"]
        assert (labels[-1] == IGNORE_INDEX).all()
    assert collator.causal and not collator.shift_labels


def test_a_causal_lm_is_known_by_its_base_class_and_a_decoders_classifier_by_its_score():
    """A subclass of a causal LM (a user's, or TRL's wrappers) gets a causal mask and labels (its tokens,
    IGNORE_INDEX at each document's first token and on padding), as does this project's PackedGPT2LMHeadModel
    given causal=True; Mistral 4's sequence classifier, whose causal LM `transformers` lists only as
    image-text-to-text, is known as causal by its `score` head and classifies each document by its last token,
    as alone (1e-5)."""
    from bert_ipu.models.gpt2 import PackedGPT2LMHeadModel

    class MyLM(transformers.LlamaForCausalLM):
        pass

    rows = [{"input_ids": [5, 6, 7, 8, 9, 0], "sequence_lengths": [2, 3]}]
    expected = [[IGNORE_INDEX, 6, IGNORE_INDEX, 8, 9, IGNORE_INDEX]]
    torch.manual_seed(0)
    mine = MyLM(transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, max_position_embeddings=64))
    assert hf.PackedDataCollator(mine)(rows)["labels"].tolist() == expected
    ours = PackedGPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64,
                                                         n_positions=64))
    own = hf.PackedDataCollator(ours, attn_implementation="bert_ipu", causal=True, dtype=torch.float32)(rows)
    assert own["labels"].tolist() == [[6, IGNORE_INDEX, 8, 9, IGNORE_INDEX, IGNORE_INDEX]]  # next tokens
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=64, moe_intermediate_size=32, vocab_size=64, max_position_embeddings=64,
                 n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                 qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, first_k_dense_replace=1, num_labels=2,
                 pad_token_id=0)
    defaults = transformers.Mistral4Config()
    config = transformers.Mistral4Config(**{k: v for k, v in small.items() if hasattr(defaults, k)},
                                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Mistral4ForSequenceClassification(config).eval()
    packed, alone = _two_documents_classified(model)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)


def _packed_and_alone(model, collator, documents=([5, 6, 7, 8], [9, 10, 11]), inputs=None):
    """The outputs (logits, else last hidden states) of `documents` packed in one row by `collator` (then a
    padding token), and of each one alone; `inputs`: the batch's keys the model takes (default all but labels)."""
    batch = collator([{"input_ids": documents[0] + documents[1] + [0],
                       "sequence_lengths": [len(documents[0]), len(documents[1])]}])
    batch = {k: v for k, v in batch.items() if k != "labels" and (inputs is None or k in inputs)}

    def out(o):
        return (o.logits if getattr(o, "logits", None) is not None else o.last_hidden_state)[0]

    with torch.no_grad():
        packed = out(model(**batch))
        alone = [out(model(input_ids=torch.tensor([d]))) for d in documents]
    cut = len(documents[0])
    return (packed[:cut], packed[cut:cut + len(documents[1])]), alone


def _two_documents_classified(model, collator=None):
    """packed_sequence_classifier's logits for documents [5, 6, 7, 8] and [9, 10, 11] packed in one row of 8, and
    the model's logits for each alone: ((2, labels), (2, labels))."""
    docs = [[5, 6, 7, 8], [9, 10, 11]]
    batch = (collator or hf.PackedDataCollator(model))([{"input_ids": docs[0] + docs[1] + [0],
                                                         "sequence_lengths": [4, 3], "sequence_labels": [1, 0]}])
    with torch.no_grad():
        packed = hf.packed_sequence_classifier(model)(**batch)["logits"][0]
        alone = torch.stack([model(input_ids=torch.tensor([d])).logits[0] for d in docs])
    return packed, alone


# problem -> the model's num_labels (its problem_type is left for the model to infer from them and the labels)
PROBLEMS = {"single_label_classification": 3, "regression": 1, "multi_label_classification": 3}


def labelled_source(n=60, seed=2, problem="single_label_classification"):
    """Rows with a `label`: a class index of 3, a float (regression) or a multi-hot vector of 3 (multi-label)."""
    src = source(n, high=20, seed=seed)
    rng = np.random.default_rng(seed)
    if problem == "regression":
        return src.add_column("label", rng.normal(size=n).tolist())
    if problem == "multi_label_classification":
        return src.add_column("label", rng.integers(0, 2, size=(n, 3)).astype(float).tolist())
    return src.add_column("label", rng.integers(0, 3, size=n).tolist())


def document_loss(problem="single_label_classification"):
    """A compute_loss_func: the loss of the micro-batch's documents (and labels), summed, over the update's count
    of labels: the mean Hugging Face's own loss for `problem` takes, over the update."""
    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"].float()
        if problem == "regression":
            total = torch.nn.functional.mse_loss(logits.reshape(labels.shape), labels.float(), reduction="sum")
        elif problem == "multi_label_classification":
            total = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float(), reduction="sum")
        else:
            total = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        return total / (num_items_in_batch if num_items_in_batch is not None else labels.numel())
    return loss


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_each_document_of_a_pack_is_classified_as_alone(tmp_path, kind):
    """packed_sequence_classifier: every document of every pack gets the logits the Hugging Face model gives it
    alone (1e-5: float32 attention over 48 keys instead of the document's own); BERT pools the first token,
    Llama the last; empty slots are ignored by the loss."""
    src = labelled_source()
    packed = hf.pack_dataset(src, 48, causal=kind == "llama", sequence_label_column="label",
                             columns=("input_ids", "token_type_ids") if kind == "bert" else ("input_ids",),
                             cache_dir=tmp_path, verbose=False)
    assert "labels" not in packed.column_names and len(packed[0]["sequence_labels"]) == max(
        len(r) for r in packed["source_rows"])
    model = classifier(kind).eval()
    wrapped = hf.packed_sequence_classifier(model)
    collator = hf.PackedDataCollator(model)
    assert collator.causal == (kind == "llama")
    batch = collator([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        out = wrapped(**batch)
        for p, rows in enumerate(packed["source_rows"]):
            for k, r in enumerate(rows):
                ids = torch.tensor([src[r]["input_ids"]])
                extra = {"token_type_ids": torch.tensor([src[r]["token_type_ids"]])} if kind == "bert" else {}
                alone = model(input_ids=ids, **extra).logits[0]
                torch.testing.assert_close(out["logits"][p, k], alone, rtol=1e-5, atol=1e-5)
                assert int(batch["labels"][p, k]) == src[r]["label"]
    assert int(batch["labels"].ne(IGNORE_INDEX).sum()) == len(src)
    with pytest.raises(ValueError, match="num_labels"):
        hf.packed_sequence_classifier(transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_labels=1, problem_type="single_label_classification")))


def test_a_decoders_classifier_pools_each_documents_last_token_that_is_not_the_pad_token(tmp_path):
    """Llama and GPT-2 have no pad token, so pad_token_id is their end-of-text token, which ends every document:
    their classifier's own forward pools a row's rightmost token that is not pad_token_id (a row of pad tokens
    only: its first). Packed, each document is pooled the same way (it pooled the end-of-text token before: logits
    0.09-0.23 off); 1e-5 as above. Without the pad token (pad_token_id None) the last token is pooled."""
    eos = 0   # (the classifier's pad_token_id)
    src = labelled_source(n=24)
    ids = [row + [eos] * (i % 3) for i, row in enumerate(src["input_ids"])]   # 0, 1 or 2 end-of-text tokens
    ids[5] = [eos, eos]                                                      # a document of pad tokens only
    src = src.remove_columns("input_ids").add_column("input_ids", ids)
    packed = hf.pack_dataset(src, 48, causal=True, sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    model = classifier("llama").eval()
    wrapped = hf.packed_sequence_classifier(model)
    batch = hf.PackedDataCollator(model)([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        rows = hf.unpack_outputs(packed, wrapped(**batch)["logits"].numpy())
        for r in range(len(src)):
            alone = model(input_ids=torch.tensor([ids[r]])).logits[0]
            torch.testing.assert_close(torch.as_tensor(rows[r]), alone, rtol=1e-5, atol=1e-5)
    last = hf.PackedDataCollator(attn_implementation="sdpa", causal=True)([packed[0]])["pooled_positions"][0]
    ends = np.cumsum(packed[0]["sequence_lengths"]) - 1
    assert last[:len(ends)].tolist() == ends.tolist()


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_packed_classifier_predictions_map_back_to_source_rows_equal_to_each_alone(tmp_path, kind):
    """Trainer.predict with packed_sequence_classifier gives logits per document slot (packs, slots, labels);
    unpack_outputs maps them back to one (num_labels,) array per source row, in source order, equal to the
    model's logits on that row alone (1e-5, as above)."""
    src = labelled_source()
    packed = hf.pack_dataset(src, 48, causal=kind == "llama", sequence_label_column="label",
                             columns=("input_ids", "token_type_ids") if kind == "bert" else ("input_ids",),
                             cache_dir=tmp_path, verbose=False)
    model = classifier(kind).eval()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "p"), per_device_eval_batch_size=3,
                                          report_to=[], remove_unused_columns=False, use_cpu=True, disable_tqdm=True)
    predictions = transformers.Trainer(model=hf.packed_sequence_classifier(model), args=args,
                                       data_collator=hf.PackedDataCollator(model)).predict(packed).predictions
    rows = hf.unpack_outputs(packed, predictions)
    assert len(rows) == len(src)
    with torch.no_grad():
        for r, logits in enumerate(rows):
            extra = {"token_type_ids": torch.tensor([src[r]["token_type_ids"]])} if kind == "bert" else {}
            alone = model(input_ids=torch.tensor([src[r]["input_ids"]]), **extra).logits[0].numpy()
            np.testing.assert_allclose(logits, alone, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="slots"):
        hf.unpack_outputs(packed, predictions[:, :1])


@pytest.mark.parametrize("kind, problem", [("bert", "single_label_classification"),
                                           ("llama", "single_label_classification"), ("bert", "regression"),
                                           ("bert", "multi_label_classification")])
def test_packed_classification_trainer_run_equals_the_unpacked_run(tmp_path, kind, problem):
    """Trainer, gradient accumulation 2, 2 SGD updates: packed_sequence_classifier on packs (2 a micro-batch) ends
    with the weights and losses of the Hugging Face model trained on the same documents one micro-batch of 2 and
    one of the rest (padded: right for BERT, left for Llama, which pools the last token), the loss a mean over
    the update's documents (and labels) in both (num_items_in_batch): 1e-5 relative / 2e-6 absolute, as the
    token tests. Class indices, regression (a float label, num_labels 1) and multi-label (a multi-hot label)."""
    src = labelled_source(problem=problem)
    packed = hf.pack_dataset(src, 48, causal=kind == "llama", sequence_label_column="label",
                             cache_dir=tmp_path / "packs", verbose=False)
    model = classifier(kind, PROBLEMS[problem])
    wrapped = hf.packed_sequence_classifier(model)
    packed_loss, _ = train(wrapped, packed, hf.PackedDataCollator(model), tmp_path / "a")

    def pad(features):
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            where = slice(longest - n, longest) if kind == "llama" else slice(0, n)
            ids[i, where], mask[i, where] = torch.tensor(f["input_ids"]), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["label"] for f in features],
                                                                                 dtype=labels_dtype)}

    labels_dtype = torch.long if problem == "single_label_classification" else torch.float32
    updates = [[r for p in range(4 * u, 4 * u + 4) for r in packed[p]["source_rows"]] for u in range(2)]
    batches = [b for rows in updates for b in (rows[:2], rows[2:])]
    reference = classifier(kind, PROBLEMS[problem])
    if kind == "llama":
        reference.config.pad_token_id = 63  # never an input id here: HF finds the last token by the pad id
    plain_loss, plain_weights = train(reference, src.remove_columns("token_type_ids"), pad, tmp_path / "b",
                                      loss=document_loss(problem), batches=batches)
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    start = classifier(kind, PROBLEMS[problem]).state_dict()
    weights = model.state_dict()
    assert sum(not torch.equal(w, start[name]) for name, w in weights.items()) > 10
    for name, weight in weights.items():
        torch.testing.assert_close(weight, plain_weights[name], rtol=1e-5, atol=2e-6, msg=name)


@pytest.mark.parametrize("problem", ["regression", "multi_label_classification"])
def test_float_and_list_labels_pack_one_per_document_and_take_the_models_own_loss(tmp_path, problem):
    """A float label (regression, num_labels 1) and a multi-hot list label (multi-label, num_labels 3) pack as
    float32 `sequence_labels`, one per document slot (IGNORE_INDEX in empty ones); packed_sequence_classifier's
    loss times the batch's count of labels is the sum over documents of the loss the Hugging Face model's own
    forward gives each alone (its mean times its labels), in float64: 1e-10 relative. A list label of varying
    length, a string label and a regression head under a bad problem_type are refused in one line."""
    src = labelled_source(problem=problem)
    packed = hf.pack_dataset(src, 48, causal=False, sequence_label_column="label", cache_dir=tmp_path,
                             columns=("input_ids", "token_type_ids"), verbose=False)
    width = PROBLEMS[problem]
    model = classifier("bert", width).double().eval()
    batch = hf.PackedDataCollator(model)([packed[i] for i in range(len(packed))])
    assert batch["labels"].dtype == torch.float32 and batch["labels"].shape[:2] == batch["pooled_positions"].shape
    assert model.config.problem_type is None
    with torch.no_grad():
        loss = hf.packed_sequence_classifier(model)(**batch)["loss"]
        assert model.config.problem_type == problem   # inferred and kept, as the model's own forward does
        model.config.problem_type = None
        expected = 0.0
        for p, rows in enumerate(packed["source_rows"]):
            for k, r in enumerate(rows):
                label = torch.tensor([src[r]["label"]], dtype=torch.float32).double()   # (as packed: float32)
                assert batch["labels"][p, k].tolist() == pytest.approx(src[r]["label"], rel=1e-6)
                out = model(input_ids=torch.tensor([src[r]["input_ids"]]),
                            token_type_ids=torch.tensor([src[r]["token_type_ids"]]), labels=label)
                expected += float(out.loss) * (1 if problem == "regression" else width)
            assert (batch["labels"][p, len(rows):] == IGNORE_INDEX).all()
    count = len(src) * (1 if problem == "regression" else width)
    assert int(batch["labels"].ne(IGNORE_INDEX).sum()) == count
    torch.testing.assert_close(float(loss) * count, expected, rtol=1e-10, atol=0)
    ragged = src.remove_columns("label").add_column("label", [[1.0] * (1 + i % 2) for i in range(len(src))])
    with pytest.raises(ValueError, match="as many numbers in every row"):
        hf.pack_dataset(ragged, 48, sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    words = src.remove_columns("label").add_column("label", ["a"] * len(src))
    with pytest.raises(ValueError, match="one label per row"):
        hf.pack_dataset(words, 48, sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    other = classifier("bert", 2).double()
    with pytest.raises(ValueError, match="num_labels"):   # labels of `width` numbers for a head of 2
        hf.packed_sequence_classifier(other)(**batch)
    model.config.problem_type = "regression_of_sorts"
    with pytest.raises(ValueError, match="problem_type"):
        hf.packed_sequence_classifier(model)


def test_sequence_labels_that_cannot_pack_right_are_refused_and_bool_labels_are_classes(tmp_path):
    """Refused in one line, nothing written: a missing label (an int None packed as -2**63, a float None as NaN),
    a float label of -100.0 (IGNORE_INDEX marks empty slots: the loss's count would leave that document out),
    float labels under problem_type single_label_classification (a torch traceback before). A bool label is a
    class index, as Hugging Face's collators take it; one logit under multi_label_classification is accepted."""
    src = labelled_source(20)

    def labelled(values, feature=None):
        out = src.remove_columns("label").add_column("label", values)
        return out.cast_column("label", feature) if feature is not None else out

    names = datasets.ClassLabel(names=["no", "yes"])
    for bad, match in [(labelled([None] + [1] * 19), "missing labels"), (labelled([None] + [0.5] * 19), "missing"),
                       (labelled([[1.0, None]] + [[1.0, 0.0]] * 19), "missing"), (labelled([None] * 20), "missing"),
                       (labelled([-100.0] + [0.5] * 19), "-100"), (labelled([[0.0, -100.0]] * 20), "-100"),
                       (labelled([-100.000001] + [0.5] * 19), "-100"),        # (-100.0 once stored as float32)
                       (labelled([-1] + [1] * 19, names), "class index -1"),  # (ClassLabel's "no label")
                       (labelled([float("nan")] + [0.5] * 19), "NaN"), (labelled([1e39] + [0.5] * 19), "infinite"),
                       (labelled([[0], [1]] * 10, datasets.List(names)), "multi-hot")]:   # (class ids, not multi-hot)
        with pytest.raises(ValueError, match=match):
            hf.pack_dataset(bad, 48, sequence_label_column="label", cache_dir=tmp_path / "bad", verbose=False)
    assert not (tmp_path / "bad").exists()
    flags = hf.pack_dataset(labelled([i % 3 == 0 for i in range(20)]), 48, causal=False,
                            sequence_label_column="label", cache_dir=tmp_path, verbose=False)
    model = classifier("bert", 2).eval()
    batch = hf.PackedDataCollator(model)([flags[i] for i in range(len(flags))])
    assert batch["labels"].dtype == torch.long and set(batch["labels"].unique().tolist()) == {IGNORE_INDEX, 0, 1}
    wrapped = hf.packed_sequence_classifier(model)
    assert torch.isfinite(wrapped(**batch)["loss"]) and model.config.problem_type == "single_label_classification"
    batch["labels"] = batch["labels"].float()
    with pytest.raises(ValueError, match="class indices"):
        wrapped(**batch)
    one = classifier("bert", 1)
    one.config.problem_type = "multi_label_classification"
    hf.packed_sequence_classifier(one)
    scores = hf.pack_dataset(labelled([-2, -1, 0, 1, 2] * 4), 48, sequence_label_column="label",   # (targets)
                             cache_dir=tmp_path / "scores", verbose=False)
    assert sorted(v for p in scores["sequence_labels"] for v in p if v != IGNORE_INDEX) == sorted([-2, -1, 0, 1, 2] * 4)
    # integer labels under regression (num_labels 1): IGNORE_INDEX is left out of the sum as out of the count
    ints = hf.pack_dataset(labelled([IGNORE_INDEX] + [i % 3 for i in range(19)]), 48, causal=False,
                           sequence_label_column="label", cache_dir=tmp_path / "ints", verbose=False)
    one = classifier("bert", 1).double().eval()
    batch = hf.PackedDataCollator(one)([ints[i] for i in range(len(ints))])
    labels = [i % 3 for i in range(19)]   # (rows 1-19)
    with torch.no_grad():
        loss = float(hf.packed_sequence_classifier(one)(**batch)["loss"])
        alone = [float(one(input_ids=torch.tensor([src[r]["input_ids"]]),
                           labels=torch.tensor([float(labels[r - 1])], dtype=torch.float64)).loss)
                 for r in range(1, 20)]
    torch.testing.assert_close(loss, sum(alone) / 19, rtol=1e-10, atol=0)


def test_the_packing_benchmark_removes_what_it_writes(tmp_path):
    """benchmarks/hf_packing.py writes gigabytes of Arrow files at its default size (a killed run left 2.6 GB in
    the temp dir): after a run, and after a SIGTERM in the middle of one, its --work-dir holds nothing."""
    import signal
    import time

    script = [sys.executable, str(ROOT / "benchmarks" / "hf_packing.py"), "--skip-training", "--work-dir",
              str(tmp_path)]
    done = subprocess.run([*script, "--sequences", "5000"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
    proc = subprocess.Popen([*script, "--sequences", "1000000"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("*/packing_*")) and time.monotonic() < deadline:  # writing its source
            time.sleep(0.1)
        assert list(tmp_path.glob("*/packing_*")), "the benchmark wrote nothing within 120 s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_an_encoder_of_an_encoder_decoder_family_packs_as_its_documents_alone(impl):
    """T5EncoderModel is not an encoder-decoder (its config says so), so the collator takes it: with T5's
    relative position bias and the block mask, each document of a pack gets the hidden states it gets alone
    (float64; what is left is rounding, ~1e-15)."""
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    config._attn_implementation = impl
    model = transformers.T5EncoderModel(config).eval().double()
    packed, alone = _packed_and_alone(model, hf.PackedDataCollator(model), ([5, 6, 7, 2], [8, 9, 2]),
                                      inputs=("input_ids", "attention_mask"))
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-12)


def test_an_encoder_only_classifier_with_a_score_head_attends_both_ways_and_pools_its_last_token():
    """T5GemmaForSequenceClassification(is_encoder_decoder=False): a bidirectional encoder with a `score` head
    that pools each row's last token. The collator took it as causal (its `score`), so its documents' logits
    were 0.03 off the documents alone; now it attends both ways and pools each document's last token, as the
    model alone does (float64, 2 layers: with one, the last token sees its whole document either way)."""
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8)
    config = transformers.T5GemmaConfig(encoder=layers, decoder=layers, num_labels=3, pad_token_id=0)
    model = transformers.T5GemmaForSequenceClassification(config, is_encoder_decoder=False)
    model.config._attn_implementation = "eager"
    model = model.eval().double()
    collator = hf.PackedDataCollator(model)
    assert not collator.causal and collator.pool_last
    packed, alone = _two_documents_classified(model, collator)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)


def _tiny_classifier(kind):
    small = dict(vocab_size=64, num_labels=3)
    layers = dict(intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    T = transformers
    return {
        "albert": lambda: T.AlbertForSequenceClassification(T.AlbertConfig(embedding_size=16, hidden_size=32,
                                                                           **layers, **small)),
        "mpnet": lambda: T.MPNetForSequenceClassification(T.MPNetConfig(hidden_size=32, **layers, **small)),
        "electra": lambda: T.ElectraForSequenceClassification(T.ElectraConfig(embedding_size=16, hidden_size=32,
                                                                              **layers, **small)),
        "ctrl": lambda: T.CTRLForSequenceClassification(T.CTRLConfig(n_embd=32, dff=64, n_layer=2, n_head=4, **small)),
        "bigbird": lambda: T.BigBirdForSequenceClassification(T.BigBirdConfig(
            hidden_size=32, attention_type="original_full", **layers, **small)),
        "distilbert": lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(dim=32, hidden_dim=64,
                                                                                       n_layers=2, n_heads=4, **small)),
        "modernbert": lambda: T.ModernBertForSequenceClassification(T.ModernBertConfig(hidden_size=32, **layers,
                                                                                       pad_token_id=0, **small)),
    }[kind]()


@pytest.mark.parametrize("kind", ["albert", "mpnet", "electra", "ctrl", "bigbird"])
def test_packed_sequence_classifier_gives_each_document_its_logits_alone_under_other_heads(kind):
    """Heads beside BERT's and Llama's: ALBERT (its pooler a Linear, its tanh apart: was 9e-5 off with small
    weights), MPNet (positions from padding_idx + 1, as RoBERTa's: was 2.8 off), ELECTRA (a classification head
    on the first token), CTRL (causal, a `classifier` on the last token: was 0.23 off after fa93d68) and BigBird
    (a base with a pooler its classification head does not use: was an AttributeError); float64, eager, two
    documents in one pack, against each alone (what is left is rounding)."""
    torch.manual_seed(0)
    model = _tiny_classifier(kind)
    model.config._attn_implementation = "eager"
    model = model.eval().double()
    packed, alone = _two_documents_classified(model)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["distilbert", "modernbert"])
def test_a_head_packed_sequence_classifier_does_not_know_is_refused(kind):
    """DistilBERT applies pre_classifier before its classifier, ModernBERT a head of its own: the wrapper, which
    applied the classifier alone, gave their documents logits 0.18 and 2.8 off; now such heads are a ValueError
    naming them."""
    model = _tiny_classifier(kind)
    with pytest.raises(ValueError, match=r"'s head \(classifier, (pre_classifier|head)\) is not one that "
                                         "packed_sequence_classifier"):
        hf.packed_sequence_classifier(model)


def test_an_encoder_alone_whose_config_says_encoder_decoder_is_taken():
    """UMT5's token classifier keeps config.is_encoder_decoder, but its base is an encoder (no decoder): the
    collator takes it, and each document of a pack gets the logits it gets alone (float64). A Qwen3-ASR token
    classifier (a decoder, listed among sequence-to-sequence types) stays causal."""
    torch.manual_seed(0)
    config = transformers.UMT5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                     num_labels=3)
    config._attn_implementation = "eager"
    model = transformers.UMT5ForTokenClassification(config).eval().double()
    assert model.config.is_encoder_decoder
    packed, alone = _packed_and_alone(model, hf.PackedDataCollator(model), ([5, 6, 7, 2], [8, 9, 2]),
                                      inputs=("input_ids", "attention_mask"))
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-12)
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, pad_token_id=0)
    audio = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, output_dim=32)
    asr = transformers.Qwen3ASRForTokenClassification(transformers.Qwen3ASRConfig(text_config=text,
                                                                                  audio_config=audio, num_labels=3))
    assert hf.PackedDataCollator(asr).causal


@pytest.mark.parametrize("kind", ["fnet", "convbert", "mobilebert", "qwen3_next"])
def test_a_model_that_mixes_tokens_outside_attention_is_refused(kind):
    """Rows mixed where no mask reaches let the documents of a pack read each other (each measured against the
    documents alone, float64: FNet's Fourier mixing 3.5e-3 in logits, ConvBERT's convolution 1e-2 in hidden
    states, MobileBERT's embeddings reading neighbouring tokens 8.9e-5, Qwen3-Next's linear attention carrying a
    state into the next document 7.8e-4): the collator and packed_sequence_classifier refuse them in one line."""
    small = dict(vocab_size=64, num_labels=3)
    layers = dict(intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    T = transformers
    model = {
        "fnet": lambda: T.FNetForSequenceClassification(T.FNetConfig(hidden_size=32, intermediate_size=64,
                                                                     num_hidden_layers=2, **small)),
        "convbert": lambda: T.ConvBertForSequenceClassification(T.ConvBertConfig(embedding_size=32, hidden_size=32,
                                                                                 **layers, **small)),
        "mobilebert": lambda: T.MobileBertForSequenceClassification(T.MobileBertConfig(
            hidden_size=32, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, **layers, **small)),
        "qwen3_next": lambda: T.Qwen3NextForSequenceClassification(T.Qwen3NextConfig(
            hidden_size=32, num_key_value_heads=2, head_dim=8, **layers, **small)),
    }[kind]()
    for make in (hf.PackedDataCollator, hf.packed_sequence_classifier):
        with pytest.raises(ValueError, match=rf"cannot keep packed documents apart in \w+ \(model type {kind}\).*"
                                             "train it unpacked"):
            make(model)


@pytest.mark.parametrize("kind", ["bloom", "openai-gpt", "xlnet", "longformer", "cpmant", "trocr", "bart"])
def test_a_model_that_takes_no_4d_mask_or_no_positions_is_refused(kind):
    """BLOOM (ALiBi made from a 2D mask), OpenAI GPT, XLNet and Longformer failed with a traceback deep in
    transformers on the collator's 4D mask; CPM-Ant ignored it (it makes its own mask from the input ids: logits
    25 off the documents alone, float64) and TrOCR and the BART family's causal LMs the position_ids (they count
    from the row's start: 0.27, 0.34 off).
    The collator now refuses them in one line naming why."""
    T = transformers
    torch.manual_seed(0)
    model = {
        "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)),
        "openai-gpt": lambda: T.OpenAIGPTLMHeadModel(T.OpenAIGPTConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4)),
        "xlnet": lambda: T.XLNetLMHeadModel(T.XLNetConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, d_inner=64)),
        "longformer": lambda: T.LongformerForMaskedLM(T.LongformerConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            attention_window=4, pad_token_id=1)),
        "cpmant": lambda: T.CpmAntForCausalLM(T.CpmAntConfig(vocab_size=64, hidden_size=32, dim_ff=64,
                                                             num_hidden_layers=2, num_attention_heads=4, dim_head=8,
                                                             prompt_length=4)),
        "trocr": lambda: T.TrOCRForCausalLM(T.TrOCRConfig(vocab_size=64, d_model=32, decoder_layers=2,
                                                          decoder_attention_heads=4, decoder_ffn_dim=64)),
        "bart": lambda: T.BartForCausalLM(T.BartConfig(vocab_size=64, d_model=32, decoder_layers=2, encoder_layers=2,
                                                       decoder_attention_heads=4, encoder_attention_heads=4,
                                                       decoder_ffn_dim=64, encoder_ffn_dim=64)),
    }[kind]()
    model.config._attn_implementation = "eager"
    model = model.eval().double()
    with pytest.raises(ValueError, match=rf"cannot keep packed documents apart in \w+ \(model type {kind}\): "
                                         r"(its attention takes a 2D padding mask only|it makes its own attention "
                                         r"mask|.*ignores position_ids)"
                                         ".*train it unpacked"):
        hf.PackedDataCollator(model)
    # what the refusal saves from: a collator told only "eager", "causal" hands the model a 4D mask
    unchecked = hf.PackedDataCollator(attn_implementation="eager", causal=kind != "longformer", dtype=torch.float64)
    try:
        packed, alone = _packed_and_alone(model, unchecked)
    except Exception:  # noqa: BLE001 - a traceback from inside transformers is the failure refused here
        return
    assert max((p - a).abs().max().item() for p, a in zip(packed, alone)) > 1e-3


def test_an_encoder_familys_causal_lm_without_is_decoder_is_refused():
    """BertLMHeadModel (RobertaForCausalLM, BertGenerationDecoder) attends causally only under config.is_decoder;
    without it transformers runs it bidirectionally, so the collator's causal mask gave logits 3e-3 off the
    documents alone (float64). Refused, naming the fix; with is_decoder=True it is taken and packs exactly."""
    T = transformers
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    torch.manual_seed(0)
    model = T.BertLMHeadModel(T.BertConfig(**layers)).eval().double()
    with pytest.raises(ValueError, match=r"BertLMHeadModel is a causal LM of an encoder family whose config has "
                                         r"is_decoder=False.*load it with is_decoder=True"):
        hf.PackedDataCollator(model)
    unchecked = hf.PackedDataCollator(attn_implementation="eager", causal=True, dtype=torch.float64)
    packed, alone = _packed_and_alone(model, unchecked)
    assert max((p - a).abs().max().item() for p, a in zip(packed, alone)) > 1e-3
    generation = T.BertGenerationDecoder(T.BertGenerationConfig(**layers))
    with pytest.raises(ValueError, match="BertGenerationDecoder is a causal LM of an encoder family"):
        hf.PackedDataCollator(generation)
    torch.manual_seed(0)
    decoder = T.BertLMHeadModel(T.BertConfig(is_decoder=True, **layers)).eval().double()
    decoder.config._attn_implementation = "eager"
    packed, alone = _packed_and_alone(decoder, hf.PackedDataCollator(decoder))
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["esmc", "openai_privacy_filter"])
def test_a_score_head_on_a_bidirectional_model_gets_a_bidirectional_mask(kind):
    """ESM C's and OpenAI's privacy filter's token classifiers have a `score` head (decoders' name for it) on
    attention that is not causal (every attention module's is_causal is False): the collator gave them a causal
    mask, logits 0.03-0.08 off each document alone (float64). Now bidirectional and exact (the privacy filter's
    softmax, experts and norms run in float32 whatever the model's dtype: 1.3e-8, hence the tolerance)."""
    T = transformers
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_labels=3)
    torch.manual_seed(0)
    model = {
        "esmc": lambda: T.EsmcForTokenClassification(T.EsmcConfig(**layers)),
        "openai_privacy_filter": lambda: T.OpenAIPrivacyFilterForTokenClassification(T.OpenAIPrivacyFilterConfig(
            vocab_size=64, pad_token_id=0, num_key_value_heads=2, head_dim=8, num_local_experts=4,
            num_experts_per_tok=2, **layers)),
    }[kind]()
    model.config._attn_implementation = "eager"
    model = model.eval().double()
    collator = hf.PackedDataCollator(model)
    assert not collator.causal
    packed, alone = _packed_and_alone(model, collator)
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-7)
    causal, _ = _packed_and_alone(model, hf.PackedDataCollator(attn_implementation="eager", causal=True,
                                                                dtype=torch.float64))
    assert max((p - a).abs().max().item() for p, a in zip(causal, alone)) > 1e-3


def _windowed(kind):
    """A small model whose layers see less than a whole document: window 3 (2 both ways for the encoder), chunk 3."""
    T = transformers
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8)
    mixed = dict(sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    return {
        "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(**mixed, **layers)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(sliding_window=3, use_sliding_window=True,
                                                          max_window_layers=1, **layers)),
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=3, **layers)),
        "llama4": lambda: T.Llama4ForCausalLM(T.Llama4TextConfig(attention_chunk_size=3, intermediate_size_mlp=64,
                                                                 num_local_experts=2, **layers)),
        "privacy_filter": lambda: T.OpenAIPrivacyFilterForTokenClassification(T.OpenAIPrivacyFilterConfig(
            pad_token_id=0, sliding_window=2, num_local_experts=4, num_experts_per_tok=2, **layers)),
    }[kind]()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["gemma3", "qwen2", "mistral", "llama4", "privacy_filter"])
def test_documents_longer_than_a_window_or_a_chunk_pack_exactly_under_a_mask(kind, implementation):
    """transformers passes a 4D mask through as given, so a window or a chunk is not applied unless the mask says
    it: documents of 8 and 6 tokens under a window of 3 got logits 0.11-0.27 off the documents alone (Gemma 3's
    sliding layers, Qwen2's, Mistral's every layer, Llama 4's chunks of 3, OpenAI's privacy filter's window both
    ways), and the collator refused them. Now its mask applies transformers' own overlay to positions inside each
    document: one mask per layer type where the model takes a dict (Gemma 3, Qwen2, Llama 4), else one mask for
    every layer (Mistral, the privacy filter). Float32 (MoE experts and eager softmax run in float32 whatever the
    dtype), so 1e-6."""
    model = _windowed(kind)
    model.config._attn_implementation = implementation
    model = model.eval()
    collator = hf.PackedDataCollator(model)
    documents = (list(range(5, 13)), list(range(13, 19)))
    packed, alone = _packed_and_alone(model, collator, documents)
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-6)
    assert isinstance(collator([{"input_ids": [5, 6, 7], "sequence_lengths": [3]}])["attention_mask"], dict) \
        == (kind in ("gemma3", "qwen2", "llama4"))
    # the mask without the window, as the collator made it before
    collator.limits, collator.layer_types = {}, None
    plain, _ = _packed_and_alone(model, collator, documents)
    assert max((p - a).abs().max().item() for p, a in zip(plain, alone)) > 1e-2


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_gemma_3_with_bidirectional_attention_packs_exactly_and_a_gemma_1_is_refused(implementation):
    """use_bidirectional_attention (EmbeddingGemma's Gemma 3) makes a decoder-only architecture attend both ways:
    the collator gave it a causal mask (2.8 off in hidden states). Now bidirectional, with Gemma 3's own window
    both ways (|q - k| < window, where transformers' generic overlay has <=): documents of 8 and 6 tokens under a
    window of 3 pack exactly (float64; eager's softmax runs in float32). Gemma 1 applies the setting under sdpa
    only, so it has no one mask to pack with: refused."""
    T = transformers
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, use_bidirectional_attention=True)
    torch.manual_seed(0)
    model = T.Gemma3ForCausalLM(T.Gemma3TextConfig(sliding_window=3, layer_types=["sliding_attention",
                                                                                 "full_attention"], **layers))
    model.config._attn_implementation = implementation
    model = model.eval().double()
    collator = hf.PackedDataCollator(model)
    assert not collator.causal
    documents = (list(range(5, 13)), list(range(13, 19)))
    packed, alone = _packed_and_alone(model, collator, documents)
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-6)
    # transformers' generic bidirectional window (<=) is one token wider than Gemma 3's
    from transformers import masking_utils
    collator.limits["sliding_attention"] = (3, masking_utils.sliding_window_bidirectional_overlay(3))
    wider, _ = _packed_and_alone(model, collator, documents)
    assert max((p - a).abs().max().item() for p, a in zip(wider, alone)) > 1e-3
    gemma = T.GemmaForTokenClassification(T.GemmaConfig(num_labels=3, **layers))
    with pytest.raises(ValueError, match="sets use_bidirectional_attention, which transformers applies to Gemma 1-2.* "
                                         "under sdpa but not eager"):
        hf.PackedDataCollator(gemma)


def test_what_the_model_says_decides_the_mask():
    """From a review of every model type with a window or a chunk (float64, documents of 8 and 6 tokens):
    - Moshi's config has a window its mask never uses: the collator applied it (0.11 off); now a window only
      where the model's own masks apply one;
    - a base text model of a multimodal stack (Qwen3-VL's) is causal, which only its attention modules say
      (is_causal True): it got a both-ways mask (2.4 off for Qwen3-VL-MoE's); now causal;
    - Gemma 4's use_bidirectional_attention="vision" (Gemma 4 Unified's default) keeps text causal: it got a
      both-ways mask (0.42 off); "all" is both ways;
    - NeoMME sets windows per layer (its config's sliding_window raises) and takes masks by layer index: a
      traceback, now refused in one line; Gemma 3's multimodal wrapper with use_bidirectional_attention builds
      masks that ignore it (eager and sdpa 0.125 apart unpacked): refused."""
    T = transformers
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8)
    documents = (list(range(5, 13)), list(range(13, 19)))

    def exact(model):
        model.config._attn_implementation = "sdpa"
        model = model.eval().double()
        collator = hf.PackedDataCollator(model)
        packed, alone = _packed_and_alone(model, collator, documents)
        for p, a in zip(packed, alone):
            torch.testing.assert_close(p, a, rtol=0, atol=1e-12)
        return collator

    torch.manual_seed(0)
    assert exact(T.MoshiForCausalLM(T.MoshiConfig(sliding_window=3, **layers))).limits == {}
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    text = T.Qwen3VLTextModel(T.Qwen3VLTextConfig(rope_parameters=rope, **layers))
    text.config._attn_implementation = "sdpa"
    collator = hf.PackedDataCollator(text)
    assert collator.causal
    batch = collator([{"input_ids": documents[0] + documents[1] + [0, 0], "sequence_lengths": [8, 6]}])
    assert not batch["attention_mask"][0, 0, 0, 1]   # the first token does not see the second
    for setting, causal in (("vision", True), ("all", False)):
        torch.manual_seed(0)
        gemma4 = T.Gemma4UnifiedForCausalLM(T.Gemma4UnifiedTextConfig(
            sliding_window=3, layer_types=["sliding_attention", "full_attention"], global_head_dim=8,
            use_bidirectional_attention=setting, **layers))
        assert exact(gemma4).causal == causal
    neomme = T.NeoMMEForMaskedLM(T.NeoMMEConfig(**dict(layers, hidden_size=64, head_dim=16), sliding_window=3,
                                                layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(ValueError, match=r"\(model type neomme\): its windows are set per layer"):
        hf.PackedDataCollator(neomme)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=28,
                  patch_size=14)
    wrapper = T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        text_config=dict(layers, vocab_size=300, use_bidirectional_attention=True), vision_config=vision,
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298))
    with pytest.raises(ValueError, match="Gemma3ForConditionalGeneration sets use_bidirectional_attention"):
        hf.PackedDataCollator(wrapper)


def test_a_mixture_of_experts_asked_for_its_router_logits_is_refused_under_a_mask():
    """output_router_logits=True adds the load-balancing loss, which reads attention_mask as a 2D padding mask:
    on the collator's 4D mask Mixtral failed with a traceback (a helper's review; GPT-OSS too, on LayerMasks).
    Refused in one line under eager and sdpa, naming the setting; without it the model is taken."""
    T = transformers
    layers = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = T.MixtralForCausalLM(T.MixtralConfig(output_router_logits=True, **layers))
    unchecked = hf.PackedDataCollator(attn_implementation="sdpa", causal=True)
    with pytest.raises(RuntimeError):
        model(**unchecked([{"input_ids": list(range(5, 19)) + [0, 0], "sequence_lengths": [8, 6]}]))
    with pytest.raises(ValueError, match="has output_router_logits=True, whose load-balancing loss reads "
                                         "attention_mask as a 2D padding mask.*output_router_logits=False"):
        hf.PackedDataCollator(model)
    model.config.output_router_logits = False
    assert hf.PackedDataCollator(model).causal


def test_layer_masks_answer_sum_as_the_full_layers_mask():
    """LayerMasks.sum() (what TRL logs as a token count) is the full layers' mask's, whatever the order of the
    layer types (it was the first's: 261 or 663 for one batch by that order alone)."""
    for kinds in (["sliding_attention", "full_attention"], ["full_attention", "sliding_attention"]):
        model = _windowed("gemma3")
        model.config.layer_types = kinds
        batch = hf.PackedDataCollator(model)([{"input_ids": list(range(5, 19)) + [0, 0], "sequence_lengths": [8, 6]}])
        masks = batch["attention_mask"]
        assert isinstance(masks, dict) and list(masks) == kinds
        assert masks.sum() == masks["full_attention"].sum() == 8 * 9 // 2 + 6 * 7 // 2 + 2


def test_a_document_longer_than_a_window_is_refused_where_the_model_takes_one_mask_for_all_layer_types():
    """A model with sliding and full layers whose forward takes no mask per layer type cannot be given both: a
    batch with a document longer than the window is a ValueError naming it (as every such batch was before); a
    flash kernel applies the window itself."""
    model = _windowed("gemma3")
    model.config._attn_implementation = "eager"
    collator = hf.PackedDataCollator(model)
    assert collator.masks_by_type
    collator.masks_by_type = False   # as for a forward that takes one mask
    with pytest.raises(ValueError, match=r"a document of 8 tokens is longer than the model's sliding window or "
                                         r"chunk \(3\)"):
        collator([{"input_ids": list(range(5, 19)) + [0, 0], "sequence_lengths": [8, 6]}])
    assert collator([{"input_ids": [5, 6, 7, 8, 9, 0], "sequence_lengths": [3, 2]}])["attention_mask"].ndim == 4
    flash = hf.PackedDataCollator(model, attn_implementation="flash_attention_2")
    assert flash([{"input_ids": list(range(5, 19)) + [0, 0], "sequence_lengths": [8, 6]}])["input_ids"].shape == (1, 14)


def test_the_collator_reads_through_peft_compile_and_packed_sequence_classifier():
    """A Trainer's model may be wrapped: PEFT's LoRA (PeftModel), torch.compile (OptimizedModule), or
    packed_sequence_classifier. The collator reads the model inside: a PEFT RoBERTa keeps its position offset
    (padding_idx + 1; it became 0, and the logits 0.19 off), a compiled decoder token classifier keeps its labels
    as they are (its document starts became IGNORE_INDEX), a PEFT encoder-decoder is still refused. Float64, each
    document against itself alone (1e-12: the same sums in another order)."""
    import peft

    torch.manual_seed(0)
    model = transformers.RobertaForTokenClassification(transformers.RobertaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=64, pad_token_id=1, num_labels=3, attn_implementation="sdpa")).double().eval()
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type="TOKEN_CLS", target_modules=["query", "value"], r=2,
                                                      init_lora_weights=False))
    collator = hf.PackedDataCollator(lora)
    assert collator.position_offset == 2 and not collator.causal
    packed, alone = _packed_and_alone(lora, collator)
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-12)

    tagger = token_classifier("llama")
    pack = {"input_ids": [5, 6, 7, 8, 9, 0], "labels": [1, 2, 0, 1, 2, IGNORE_INDEX], "sequence_lengths": [3, 2]}
    for wrapped in (tagger, torch.compile(tagger)):
        assert hf.PackedDataCollator(wrapped)([pack])["labels"].tolist() == [pack["labels"]]

    classifier_model = classifier("llama")
    plain, wrapped = hf.PackedDataCollator(classifier_model), \
        hf.PackedDataCollator(hf.packed_sequence_classifier(classifier_model))
    assert (wrapped.causal, wrapped.pool_last, wrapped.pad_token_id) == (plain.causal, plain.pool_last, 0)

    t5 = transformers.T5ForSequenceClassification(transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    t5_lora = peft.get_peft_model(t5, peft.LoraConfig(task_type="SEQ_CLS", target_modules=["q", "v"], r=2))
    with pytest.raises(ValueError, match=r"T5ForSequenceClassification is an encoder-decoder"):
        hf.PackedDataCollator(t5_lora)


def test_falcon_with_alibi_is_refused_and_without_it_packs():
    """Falcon's ALiBi (config.alibi: the falcon-rw checkpoints) takes a 2D padding mask only: packed, it failed
    with a traceback inside transformers; now a ValueError naming the setting. Falcon without it packs each
    document as alone (float64, 1e-12)."""
    torch.manual_seed(0)
    common = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  attn_implementation="sdpa")
    alibi = transformers.FalconForCausalLM(transformers.FalconConfig(**common, alibi=True, parallel_attn=False,
                                                                     bias=True))
    with pytest.raises(ValueError, match=r"FalconForCausalLM \(model type falcon, config.alibi=True\): its "
                                         "attention takes a 2D padding mask only.*train it unpacked"):
        hf.PackedDataCollator(alibi)
    rotary = transformers.FalconForCausalLM(transformers.FalconConfig(**common)).double().eval()
    packed, alone = _packed_and_alone(rotary, hf.PackedDataCollator(rotary))
    for p, a in zip(packed, alone):
        torch.testing.assert_close(p, a, rtol=0, atol=1e-12)


def test_a_sliding_window_collator_pickles_for_spawned_loader_workers():
    """A DataLoader's workers started by spawn or forkserver take the collator pickled; a sliding window's
    overlay was a closure of transformers' and did not pickle. The collator pickled makes the same masks, and a
    spawned worker collates with it."""
    import pickle

    torch.manual_seed(0)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, sliding_window=4, attn_implementation="sdpa"))
    collator = hf.PackedDataCollator(mistral)
    rows = [{"input_ids": list(range(5, 15)) + [0, 0], "sequence_lengths": [6, 4]}]
    mask = collator(rows)["attention_mask"]
    assert not mask[0, 0, 5, 0] and mask[0, 0, 5, 2]   # (a window of 4 inside the first document)
    assert torch.equal(pickle.loads(pickle.dumps(collator))(rows)["attention_mask"], mask)
    loader = torch.utils.data.DataLoader(rows, batch_size=1, collate_fn=collator, num_workers=1,
                                         multiprocessing_context="spawn")
    assert torch.equal(next(iter(loader))["attention_mask"], mask)


def test_token_loss_and_metrics_keep_float64():
    """A float64 run's loss stays float64 (it was cast to float32: 3e-7 off Hugging Face's float64 loss); half
    precision goes up to float32, as transformers' own loss does."""
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 8, 50, dtype=torch.float64), torch.randint(0, 50, (2, 8))
    exact = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), reduction="sum") / 16
    loss = hf.token_loss(False)({"logits": logits}, labels)
    assert loss.dtype == torch.float64 and torch.equal(loss, exact)
    assert hf.token_loss(False)({"logits": logits.bfloat16()}, labels).dtype == torch.float32
    preprocess, _ = hf.token_metrics(False)
    assert preprocess(logits, labels).dtype == torch.float64


def test_packed_sequence_classifier_trains_a_lora_model_and_refuses_what_it_cannot_pack():
    """packed_sequence_classifier on a PEFT LoRA model runs its base model, where LoRA's layers are: each
    document's logits equal the PEFT model's on it alone (float64, 1e-12), the loss's gradients reach every LoRA
    matrix, and `.model` is the PeftModel given (its save_pretrained saves the adapter). Prompt and prefix tuning
    (virtual tokens added to every row, not to each document) and a compiled model (compile the classifier
    instead) are refused in one line, in the collator too."""
    import peft

    lora = peft.get_peft_model(classifier("bert").double().eval(), peft.LoraConfig(
        task_type="SEQ_CLS", target_modules=["query", "value"], r=2, init_lora_weights=False))
    packed, alone = _two_documents_classified(lora)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    wrapped = hf.packed_sequence_classifier(lora)
    assert wrapped.model is lora
    batch = hf.PackedDataCollator(wrapped)([{"input_ids": [5, 6, 7, 8, 9, 10, 11, 0], "sequence_lengths": [4, 3],
                                             "sequence_labels": [1, 0]}])
    wrapped(**batch)["loss"].backward()
    trained = {n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in lora.named_parameters()
               if p.requires_grad and "lora_" in n}
    assert trained and all(trained.values()), trained
    prompt = peft.get_peft_model(classifier("bert"), peft.PromptTuningConfig(task_type="SEQ_CLS",
                                                                             num_virtual_tokens=4))
    for make in (hf.packed_sequence_classifier, hf.PackedDataCollator):
        with pytest.raises(ValueError, match="uses prompt or prefix tuning, whose virtual tokens .* use LoRA"):
            make(prompt)
    with pytest.raises(ValueError, match=r"takes the model uncompiled.*torch.compile\(packed_sequence_classifier"):
        hf.packed_sequence_classifier(torch.compile(classifier("bert")))
