"""Packed causal language models (bert_ipu/models/gpt2.py, llama.py, bert_ipu/tasks/causal_lm/) against
`transformers` on the same sequences unpacked.

Tolerances: float64 1e-10 (absolute, logits and gradients of order 1: only summation order differs, and RoPE's
cos/sin, which Hugging Face computes in float32 in both models alike). float32: logits and loss 1e-5, gradients
1e-4 relative to each tensor's largest entry (Hugging Face's own float32 gradients differ from its float64
ones by about 1e-5; ours and its differ in summation order over a longer masked row).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from bert_ipu.models.gpt2 import PackedGPT2LMHeadModel
from bert_ipu.models.llama import PackedLlamaForCausalLM
from bert_ipu.models.losses import causal_lm_loss, causal_lm_loss_sums, sequence_label_weights
from bert_ipu.tasks import load_config
from bert_ipu.tasks.causal_lm.data import (CHAT_TEMPLATE, CausalReport, chat_tokens, load_tokenizer, next_token_labels, sft_sequences,
                                          train_tokenizer, turn_end_token)
from bert_ipu.data.contiguous import pack_sequences
from bert_ipu.data.text import DataInputError
from bert_ipu.data.layout import IGNORE_INDEX
from training_helpers import Killed, ROOT, entry, final_weights, run_cli

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
V = 61


def families():
    gpt2 = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=V, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    # head dimension 8: flash attention's smallest (varlen's strict stand-in refuses 4 as the CUDA kernel would)
    llama = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=24, vocab_size=V, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
                        tie_word_embeddings=False)
    return {"gpt2": (gpt2, GPT2LMHeadModel, PackedGPT2LMHeadModel), "llama": (llama, LlamaForCausalLM, PackedLlamaForCausalLM)}


def sequences(seed=0, lengths=(5, 9, 3, 7, 2)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in lengths]


def pack(seqs, rows, S=16, learn=None):
    """Sequences -> packed (B, S) inputs, `rows` = the sequence indices of each pack; labels: next token of the
    same sequence (where `learn` says, default everywhere)."""
    B = len(rows)
    out = {k: torch.zeros(B, S, dtype=torch.long) for k in ("input_ids", "position_ids", "sequence_ids")}
    out["labels"] = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
    where = {}
    for b, members in enumerate(rows):
        at = 0
        for slot, i in enumerate(members):
            s = seqs[i]
            n = len(s)
            out["input_ids"][b, at:at + n] = s
            out["position_ids"][b, at:at + n] = torch.arange(n)
            out["sequence_ids"][b, at:at + n] = slot + 1
            mask = [True] * n if learn is None else learn[i]
            out["labels"][b, at:at + n] = torch.tensor(next_token_labels(s.tolist(), mask))
            where[i] = (b, at)
            at += n
    return out, where


def ce_sum(logits, s):
    """Cross-entropy of next-token prediction summed over one sequence, in the logits' dtype (Hugging Face's
    own loss upcasts to float32 even for a float64 model, so it is computed here from its logits)."""
    return torch.nn.functional.cross_entropy(logits[:-1], s[1:], reduction="sum")


def hf_and_packed(family, dtype, backend="mask"):
    config, hf_cls, packed_cls = families()[family]
    torch.manual_seed(0)
    hf = hf_cls(config).to(dtype).eval()
    ours = packed_cls(config, backend, max_sequences_per_pack=3).to(dtype).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


BACKENDS = ["mask", "reference", "flex", pytest.param("varlen", marks=CUDA)]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("backend", ["mask", "reference"])
def test_equal_to_transformers_unpacked(family, dtype, tol, backend):
    """Logits at every real token, the loss (mean over all label tokens) and every gradient equal Hugging Face's
    model run on each sequence alone."""
    hf, ours = hf_and_packed(family, dtype, backend)
    seqs = sequences()
    rows = [[0, 1], [2, 3, 4]]
    batch, where = pack(seqs, rows)
    logits = ours(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
    weights = sequence_label_weights(batch["labels"], batch["sequence_ids"], 3)
    sums = causal_lm_loss_sums(logits, batch["labels"], weights)
    loss = causal_lm_loss(sums, "token")
    loss.backward()

    ref_sum, count = 0.0, 0
    for i, s in enumerate(seqs):
        out = hf(s[None])
        b, at = where[i]
        torch.testing.assert_close(logits[b, at:at + len(s)], out.logits[0], rtol=0, atol=tol)
        ref_sum = ref_sum + ce_sum(out.logits[0], s)
        count += len(s) - 1
    ref = ref_sum / count
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=0, atol=tol)
    assert sums.label_tokens.item() == count
    grads = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g, r = p.grad, grads[name].grad
        scale = r.abs().max().clamp_min(1e-3)
        assert ((g - r).abs().max() / scale).item() < (tol if dtype == torch.float64 else 1e-4), name


@pytest.fixture
def flash_stand_in(monkeypatch):
    """varlen on the CPU: flash attention replaced by its strict stand-in (refuses what the CUDA kernel refuses,
    records what it is handed); on CUDA the real kernel."""
    from bert_ipu.models import attention

    kernel = attention.FlashStandIn()
    monkeypatch.setattr(attention, "VARLEN_KERNEL", kernel)
    return kernel


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", ["flex", "varlen", pytest.param("varlen-cuda", marks=CUDA)])
def test_other_backends_give_the_same_logits(family, backend, request):
    """FlexAttention's document-causal block mask (forward only on the CPU: it has no backward there) and
    variable-length flash attention (bf16 autocast, on CUDA or through the strict stand-in on the CPU) give the
    mask backend's logits. Under autocast Llama's RoPE hands float32 q and k to the kernel, which flash attention
    refuses: the backend casts them to the autocast dtype (the stand-in checks it got bfloat16)."""
    device = "cuda" if backend == "varlen-cuda" else "cpu"
    varlen = backend.startswith("varlen")
    kernel = request.getfixturevalue("flash_stand_in") if backend == "varlen" else None
    dtype = torch.bfloat16 if varlen else torch.float64
    _, ours = hf_and_packed(family, torch.float32)
    ours = ours.to(device)
    batch, _ = pack(sequences(), [[0, 1], [2, 3, 4]])
    batch = {k: v.to(device) for k, v in batch.items()}
    args = (batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=varlen):
        ours.to(torch.float32 if varlen else dtype)
        expected = ours(*args).float()
        ours.attention_backend = "varlen" if varlen else backend
        got = ours(*args).float()
    real = batch["sequence_ids"] > 0
    tol = 2e-2 if varlen else 1e-10  # bf16: flash and SDPA round differently
    torch.testing.assert_close(got[real], expected[real], rtol=tol, atol=tol)
    if kernel is not None:
        assert len(kernel.calls) == 2 and all(c["dtype"] == torch.bfloat16 for c in kernel.calls)


def test_varlen_refuses_what_flash_attention_refuses(flash_stand_in):
    """No half precision: the backend's one line (flash attention has no float32 kernel), before the kernel; the
    stand-in itself refuses float32 with the kernel's words, and a max_len shorter than a segment."""
    from bert_ipu.models import attention

    _, ours = hf_and_packed("llama", torch.float32, "varlen")
    batch, _ = pack(sequences(), [[0, 1], [2, 3, 4]])
    with pytest.raises(ValueError, match="computes in float16 or bfloat16, and this forward runs in torch.float32"):
        ours(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
    q = torch.randn(16, 2, 8)
    cu = torch.tensor([0, 10, 16], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="only support fp16 and bf16"):
        flash_stand_in(q, q, q, cu, 16)
    with pytest.raises(RuntimeError, match="longer than max_seqlen_q"):
        flash_stand_in(*(q.bfloat16(),) * 3, cu, 8)
    with pytest.raises(ValueError, match="head dimensions that are multiples of 8 up to 256, and this model's is 4"):
        attention.check_head_dim("varlen", 4, "cuda")


def test_varlen_gets_one_segment_a_document_not_one_a_position(flash_stand_in):
    """The kernel's work grows with the segments it is handed (each launched over max_len): a row gets K + 1 of
    them, K the most sequences a pack holds, not S + 1 (8,193 a row at 8K made varlen 13x slower than flex on an
    H200). Without K the backend refuses rather than launch S + 1."""
    _, ours = hf_and_packed("llama", torch.float32, "varlen")
    rows = [[0, 1], [2, 3, 4]]
    batch, _ = pack(sequences(), rows, S=64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
    documents = sum(len(r) for r in rows)
    for call in flash_stand_in.calls:
        assert call["segments"] == len(rows) * (3 + 1) <= 2 * (documents + len(rows))
        assert call["nonempty"] == documents + len(rows)  # every row has padding here
        assert call["kv_heads"] == 2 and call["heads"] == 4 or call["kv_heads"] == 4  # GQA where the kernel takes it
    ours.max_sequences_per_pack = None
    with pytest.raises(ValueError, match="sizes its segments by the most sequences a pack holds"):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ours(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])


def test_a_varlen_run_sizes_the_segments_by_the_data_and_refuses_float32(flash_stand_in, tmp_path):
    """The causal LM application with varlen, unlimited depth (data.max_sequences_per_pack=max) and bf16, on the
    strict stand-in: every call gets micro-batch x (K + 1) segments, K the deepest pack of the data (not the
    256-token pack length), in bfloat16. train.precision=fp32 is refused in one line before anything is written."""
    out = tmp_path / "varlen"
    common = ["--config", "causal_tiny_llama_packed", *TINY, "model.attention_backend=varlen", "train.max_steps=2",
              "data.max_sequences_per_pack=max", "train.validate_every=null", "train.checkpoint_every=null"]
    assert entry("causal_lm", [*common, "train.precision=fp32", f"output_dir={out}"]) == 2
    assert not out.exists()
    assert entry("causal_lm", [*common, "train.precision=bf16", f"output_dir={out}"]) == 0
    K = json.loads((out / "results.json").read_text())["max_sequences_per_pack"]
    assert 1 < K < 256 // 8
    train_calls = [c for c in flash_stand_in.calls if c["tokens"] == 4 * 256]
    assert train_calls and all(c["segments"] == 4 * (K + 1) and c["dtype"] == torch.bfloat16 for c in train_calls)
    # the export's tokenizer puts BOS first, as every text sequence was trained (it added none: a pipeline's
    # prompts were unlike anything the model learnt from); without special tokens, the text alone
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "hf")
    ids, plain = tok("The cat")["input_ids"], tok("The cat", add_special_tokens=False)["input_ids"]
    assert ids == [tok.bos_token_id, *plain] and tok.bos_token_id not in plain


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_changing_one_sequence_changes_no_other(family):
    """Replacing the second sequence of a pack leaves the logits of every other token of the pack bitwise equal."""
    _, ours = hf_and_packed(family, torch.float32)
    seqs = sequences()
    a, _ = pack(seqs, [[0, 2, 4]])
    changed = list(seqs)
    changed[2] = torch.randint(1, V, (len(seqs[2]),), generator=torch.Generator().manual_seed(9))
    b, _ = pack(changed, [[0, 2, 4]])
    with torch.no_grad():
        la = ours(a["input_ids"], a["position_ids"], a["sequence_ids"])
        lb = ours(b["input_ids"], b["position_ids"], b["sequence_ids"])
    other = a["sequence_ids"][0] != 2
    assert torch.equal(la[0, other], lb[0, other])
    assert not torch.equal(la[0, ~other], lb[0, ~other])


def test_loss_modes_change_the_gradient_as_defined():
    """token: sum of CE / label tokens; sequence: mean over sequences of each one's mean CE; sum: sum of CE;
    each gradient equals the gradient of that definition written out from Hugging Face's per-sequence losses.
    Split into two micro-batches with the global count as normalizer, the gradients add up to the one batch's."""
    seqs = sequences(lengths=(5, 9, 3, 7, 2))
    for mode in ("token", "sequence", "sum"):
        hf, ours = hf_and_packed("llama", torch.float64)
        batch, _ = pack(seqs, [[0, 1], [2, 3, 4]])
        sums = causal_lm_loss_sums(ours(batch["input_ids"], batch["position_ids"], batch["sequence_ids"]),
                                   batch["labels"], sequence_label_weights(batch["labels"], batch["sequence_ids"], 3))
        causal_lm_loss(sums, mode).backward()
        per_seq = [ce_sum(hf(s[None]).logits[0], s) / (len(s) - 1) for s in seqs]  # mean CE of each sequence
        n = [len(s) - 1 for s in seqs]
        ref = {"token": sum(m * k for m, k in zip(per_seq, n)) / sum(n), "sequence": sum(per_seq) / len(seqs),
               "sum": sum(m * k for m, k in zip(per_seq, n))}[mode]
        ref.backward()
        grads = dict(hf.named_parameters())
        for name, p in ours.named_parameters():
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=1e-10, msg=f"{mode} {name}")
        # two micro-batches, normalised by the update's counts: the same gradient
        whole = {name: p.grad.clone() for name, p in ours.named_parameters()}
        ours.zero_grad()
        norm = {"label_tokens": sums.label_tokens, "labelled_sequences": sums.labelled_sequences}
        for rows in ([[0, 1]], [[2, 3, 4]]):
            part, _ = pack(seqs, rows)
            s = causal_lm_loss_sums(ours(part["input_ids"], part["position_ids"], part["sequence_ids"]),
                                    part["labels"], sequence_label_weights(part["labels"], part["sequence_ids"], 3))
            causal_lm_loss(s, mode, norm).backward()
        for name, p in ours.named_parameters():
            torch.testing.assert_close(p.grad, whole[name], rtol=0, atol=1e-12, msg=f"{mode} split {name}")


def test_round_trip_with_transformers(tmp_path):
    """save_pretrained loads in transformers (strict) and from_pretrained loads a transformers folder."""
    for family, (config, hf_cls, packed_cls) in families().items():
        torch.manual_seed(1)
        ours = packed_cls(config)
        ours.save_pretrained(tmp_path / family)
        hf = hf_cls.from_pretrained(tmp_path / family)
        for k, v in ours.state_dict().items():
            assert torch.equal(v, hf.state_dict()[k]), k
        back = packed_cls.from_pretrained(tmp_path / family)
        for k, v in hf.state_dict().items():
            assert torch.equal(v, back.state_dict()[k]), k


# --- data ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    texts = [json.loads(line)["prompt"] for line in (ROOT / "tests/fixtures/sft/pairs.jsonl").read_text().splitlines()]
    return train_tokenizer(iter(texts), 600)


def test_packed_labels_never_cross_a_sequence(tokenizer, tmp_path):
    """In packed rows, every label is the next token of the same sequence, and the last token of every
    sequence (and every padding token) has none."""
    report = CausalReport()
    seqs = sft_sequences(ROOT / "tests/fixtures/sft/chat.jsonl", tokenizer, 256, "drop", report)
    packed = pack_sequences(seqs.lengths, {"input_ids": seqs.input_ids, "labels": seqs.labels}, 256, "cghp", 6,
                            fill={"labels": IGNORE_INDEX})
    assert packed.packing_factor > 1.5  # several sequences per row
    ids, labels, sid = (packed.rows[k] for k in ("input_ids", "labels", "sequence_ids"))
    has = labels != IGNORE_INDEX
    nxt_same = np.zeros_like(has)
    nxt_same[:, :-1] = (sid[:, 1:] == sid[:, :-1]) & (sid[:, :-1] > 0)
    assert not (has & ~nxt_same).any()                                   # no label at a sequence's last token
    assert (labels[:, :-1][has[:, :-1]] == ids[:, 1:][has[:, :-1]]).all()  # the label is the next token
    assert has.sum() == report.label_tokens == seqs.labels[seqs.labels != IGNORE_INDEX].size


def test_prompt_mask_keeps_the_assistant_tokens_only(tokenizer):
    """The tokens learnt are exactly each assistant turn's content and its end token."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say yes."},
                {"role": "assistant", "content": "Yes, indeed."}, {"role": "user", "content": "Again?"},
                {"role": "assistant", "content": "Yes."}]
    tokens, learn = chat_tokens(tokenizer, messages, "test")
    learnt = tokenizer.decode([t for t, k in zip(tokens, learn) if k])
    assert learnt == "Yes, indeed.<|end|>Yes.<|end|>"
    assert tokenizer.decode(tokens).count("<|assistant|>") == 2
    labels = next_token_labels(tokens, learn)
    assert [t for t in labels if t != IGNORE_INDEX] == [t for t, k in zip(tokens, learn) if k]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_chat_template_that_leaves_the_sandbox_is_refused(tokenizer):
    """A tokenizer's chat template is code from its folder: transformers renders it in Jinja's immutable sandbox,
    whose SecurityError (and any template error) reached the user as a traceback. Now one DataInputError naming
    the line, and for the sandbox that the template is refused for safety."""
    import copy

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert chat_tokens(tokenizer, chat, "chat.jsonl:1")[0]  # the trained tokenizer's own template renders it
    escaping = copy.deepcopy(tokenizer)
    escaping.chat_template = "{{ messages.append({'role': 'system'}) }}{{ cycler.__init__.__globals__ }}"
    with pytest.raises(DataInputError, match=r"chat\.jsonl:1: the tokenizer's chat template tried what Jinja's "
                                             r"sandbox forbids .*refused for safety"):
        chat_tokens(escaping, chat, "chat.jsonl:1")
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ raise_exception('no system turn allowed') }}"
    with pytest.raises(DataInputError, match=r"chat\.jsonl:1: the tokenizer's chat template failed on this chat "
                                             r"\(TemplateError: no system turn allowed\)"):
        chat_tokens(broken, chat, "chat.jsonl:1")


def test_bad_sft_input_is_an_error_or_counted(tokenizer, tmp_path):
    good = {"prompt": "Say yes.", "response": "Yes."}
    long = {"prompt": "word " * 300, "response": "Yes."}
    rows = [good, {"prompt": "Say.", "response": ""}, {"messages": [{"role": "user", "content": "hi"}]}, "", long]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    report = CausalReport()
    with pytest.raises(DataInputError, match=r"a.jsonl:5: \d+ tokens, longer than the pack length 64"):
        sft_sequences(path, tokenizer, 64, "error", report)
    report = CausalReport()
    seqs = sft_sequences(path, tokenizer, 64, "drop", report)
    assert len(seqs) == 1 and (report.empty_response, report.no_assistant_turn, report.empty,
                               report.too_long_dropped) == (1, 1, 1, 1)
    with pytest.raises(DataInputError, match=r"b.jsonl:1: not valid JSON"):
        sft_sequences(write_jsonl(tmp_path / "b.jsonl", ["{oops"]), tokenizer, 64, "error", CausalReport())
    with pytest.raises(DataInputError, match=r"c.jsonl:1: expected \"messages\""):
        sft_sequences(write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}]), tokenizer, 64, "error", CausalReport())
    plain = train_tokenizer(iter(["Say yes. Yes."] * 10), 300)
    plain.chat_template = None
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    with pytest.raises(DataInputError, match=r"d.jsonl:1: a chat needs the tokenizer's chat template"):
        sft_sequences(write_jsonl(tmp_path / "d.jsonl", [chat]), plain, 64, "error", CausalReport())
    # prompt/response without a template: prompt + response + EOS, the response and EOS learnt
    seqs = sft_sequences(write_jsonl(tmp_path / "e.jsonl", [good]), plain, 64, "error", CausalReport())
    learnt = seqs.labels[seqs.labels != IGNORE_INDEX]
    assert plain.decode(learnt) == "Yes.<|endoftext|>"
    # a chat that opens with the assistant's turn (transformers cannot render the empty chat before it: a
    # traceback, exit 1)
    opens = {"messages": [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "ok"}]}
    with pytest.raises(DataInputError, match=r"f.jsonl:1: the chat starts with the assistant's turn"):
        sft_sequences(write_jsonl(tmp_path / "f.jsonl", [opens]), tokenizer, 64, "error", CausalReport())


def test_a_model_folder_without_tokenizer_files_is_no_tokenizer(tmp_path):
    """transformers makes an empty GPT-2 tokenizer of a model folder without tokenizer files: every example then
    tokenized to nothing and the run blamed the data ("no usable sequence"). Now the folder is refused as a
    tokenizer, naming data.tokenizer."""
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=16)).save_pretrained(tmp_path / "model")
    with pytest.raises(DataInputError, match=r"model: it has no vocabulary .* give the model's tokenizer folder"):
        load_tokenizer(tmp_path / "model")


def test_the_turn_end_is_the_token_that_ends_most_learnt_spans(tokenizer, tmp_path):
    """The token ending the assistant's turns: the last label of each learnt span (a chat template's end token),
    past whitespace after it (a template ending turns with `<|end|>` and a newline gave the newline, so
    generation stopped at the first line break), where one token ends at least half of them; None where no token
    does or nothing is learnt."""
    X, (newline,) = IGNORE_INDEX, tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert turn_end_token(np.array([X, 4, 9, X, X, 5, 9, X, 7, 3, X]), tokenizer) == 9   # 9, 9, 3
    assert turn_end_token(np.array([X, 4, 8, X, 5, 9, X, 7, 3, X]), tokenizer) is None   # 8, 9, 3
    assert turn_end_token(np.array([X, 4, 9, newline, X, 5, 9, newline, X]), tokenizer) == 9
    assert turn_end_token(np.array([X, X]), tokenizer) is None
    chat = {"messages": [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."},
                         {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Yes!"}]}
    path = write_jsonl(tmp_path / "chat.jsonl", [chat])
    templated = copy.deepcopy(tokenizer)
    for template_end in ("<|end|>", "<|end|>\n"):
        templated.chat_template = CHAT_TEMPLATE.replace("<|end|>", template_end)
        seqs = sft_sequences(path, templated, 64, "error", CausalReport())
        assert turn_end_token(seqs.labels, templated) == tokenizer.convert_tokens_to_ids("<|end|>"), template_end


# --- the task on the engine ---------------------------------------------------------------------------------------

TINY = ["model.hidden_size=32", "model.intermediate_size=48", "model.num_attention_heads=2",
        "model.num_key_value_heads=1", "model.max_position_embeddings=256", "data.max_seq_length=256",
        "data.vocab_size=1024", "data.too_long=drop", "train.max_steps=4", "train.num_train_epochs=null",
        "train.warmup_steps=1", "train.log_every=1", "train.validate_every=2", "train.checkpoint_every=2",
        "train.validation_batches=2", "train.global_batch_size=16", "train.micro_batch_size=4"]


def test_sft_packed_run_exports_a_text_generation_model(tmp_path):
    """A packed SFT run on the engine: loss falls, the export loads in AutoModelForCausalLM (same logits as the
    packed model on one sequence) and pipeline("text-generation") with its tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, pipeline

    from bert_ipu.tasks import run as main

    out = tmp_path / "run"
    cfg = load_config("sft_tiny_chat_packed", [*TINY, f"output_dir={out}", "train.max_steps=8"],
                      kind="causal_lm")
    result = main(cfg, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert result["packing"]["train"]["packing_factor"] > 1.5
    model = AutoModelForCausalLM.from_pretrained(out / "hf")
    tok = AutoTokenizer.from_pretrained(out / "hf")
    assert tok.chat_template is not None
    ours = PackedLlamaForCausalLM.from_pretrained(out / "hf")
    ids = torch.tensor([tok("Continue: the assert statement")["input_ids"]])
    with torch.no_grad():
        packed = ours(ids, torch.arange(ids.shape[1])[None], torch.ones_like(ids))
        torch.testing.assert_close(model(ids).logits, packed, rtol=1e-5, atol=1e-5)
    text = pipeline("text-generation", model=str(out / "hf"))("Continue:", max_new_tokens=3, do_sample=False)
    assert text[0]["generated_text"].startswith("Continue:")
    # generation stops at the end of the assistant's turn (<|end|>, which ends every learnt turn; it stopped at
    # <|endoftext|> only, which SFT never learns), and the card names the model and the whole command
    assert GenerationConfig.from_pretrained(out / "hf").eos_token_id == [tok.eos_token_id,
                                                                         tok.convert_tokens_to_ids("<|end|>")]
    card = (out / "hf" / "README.md").read_text()
    assert "# Packed Llama: supervised fine-tuning" in card
    assert f"python run_causal_lm.py --config sft_tiny_chat_packed {' '.join(TINY)} output_dir={out} " \
           "train.max_steps=8" in card


def test_data_parallel_equals_one_process(tmp_path):
    """2 DDP ranks (gloo) end with the weights of 1 process on the same updates (float32 summation order:
    1e-4 relative after AdamW, whose steps divide by the gradients' RMS)."""
    # 8 packs per update in both (with batch_unit sequences the rounding to whole micro-batches of every replica
    # could give the two runs different updates)
    common = ["--config", "sft_tiny_chat_packed", *TINY, "train.micro_batch_size=2", "train.batch_unit=packs",
              "train.global_batch_size=8"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert entry("causal_lm", [*common, f"output_dir={one}"]) == 0  # one process: the command line in this one
    proc = run_cli(*common, f"output_dir={two}", nproc=2, script="run_causal_lm.py")
    assert "2 replica(s)" in proc.stdout
    a, b = final_weights(one), final_weights(two)
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 1e-4, name


def test_cli_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    """run_causal_lm.py's command line (in this process: the DDP test runs it as a command): exit 2, one line
    naming the problem, and no output folder."""
    from training_helpers import entry

    monkeypatch.chdir(ROOT)
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    cases = [(["data.source=" + str(bad)], "bad.jsonl:1: not valid JSON"),
             (["data.source=" + str(tmp_path / "missing.jsonl")], "is not a file"),
             (["data.loss_mode=mean"], "data.loss_mode 'mean'"),
             (["model.num_key_value_heads=3"], "num_key_value_heads"),
             (["data.max_seq_length=16", "model.max_position_embeddings=16", "data.too_long=error"],
              "longer than the pack length 16")]
    for overrides, message in cases:
        out = tmp_path / "out"
        capsys.readouterr()
        code = entry("causal_lm", ["--config", "sft_tiny_chat_packed", *TINY, f"output_dir={out}", *overrides])
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert code == 2, overrides
        assert len(lines) == 1 and message in lines[0], (overrides, lines)
        assert not out.exists()


def test_text_is_cut_into_whole_sequences(tokenizer, tmp_path):
    """Text: every sequence starts with BOS and fits the pack length; a document's sequences, BOS removed,
    are its tokens in order (nothing dropped, a sentence longer than a sequence cut and counted)."""
    from bert_ipu.tasks.causal_lm.data import text_sequences

    sentences = ["Short one.", " ".join(["word"] * 40), "Another sentence here.", "End."]
    (tmp_path / "doc.txt").write_text("\n".join(sentences) + "\n")
    report = CausalReport()
    seqs = text_sequences([str(tmp_path / "doc.txt")], tokenizer, 16, report)
    starts = np.cumsum(seqs.lengths) - seqs.lengths
    assert (seqs.lengths <= 16).all() and (seqs.input_ids[starts] == tokenizer.bos_token_id).all()
    body = np.delete(seqs.input_ids, starts)
    expected = sum(tokenizer([(" " if i else "") + s for i, s in enumerate(sentences)],
                             add_special_tokens=False)["input_ids"], [])
    assert body.tolist() == expected
    assert report.sentences_cut == 1 and report.examples == 1
    labels = np.split(seqs.labels, starts[1:])
    ids = np.split(seqs.input_ids, starts[1:])
    for x, y in zip(ids, labels):
        assert y[-1] == IGNORE_INDEX and (y[:-1] == x[1:]).all()


def test_kill_and_resume_is_bitwise_identical(tmp_path, monkeypatch):
    """An SFT run stopped after its step-2 checkpoint and resumed (tokenizer retrained, data re-read and
    re-packed) ends with exactly the weights of a run never stopped; dropout on, so the RNG state counts too.
    Its metrics.jsonl is the uninterrupted run's too, throughput aside: a row every 3 updates straddles the
    checkpoint, and the resumed run's first row still averages updates 1-3 (it averaged only update 3, the
    logging window restarting at the resume)."""
    from bert_ipu.engine import checkpoint
    from bert_ipu.tasks import run as main

    def cfg(out):
        return load_config("sft_tiny_chat_packed", [*TINY, f"output_dir={out}", "model.dropout=0.1",
                                                    "train.log_every=3"], kind="causal_lm")

    def rows(out):
        timing = ("sequences_per_second", "tokens_per_second", "tflops_per_second", "mfu")
        return [{k: v for k, v in json.loads(x).items() if k not in timing}
                for x in (out / "metrics.jsonl").read_text().splitlines()]

    main(cfg(tmp_path / "straight"), progress=False)
    real = checkpoint.save

    def kill_after_first(*args, **kwargs):
        real(*args, **kwargs)
        raise Killed  # as if the process died right after the checkpoint
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(Killed):
        main(cfg(tmp_path / "stopped"), progress=False)
    monkeypatch.undo()
    assert main(cfg(tmp_path / "stopped"), resume=True, progress=False)["step"] == 4
    assert [r["step"] for r in rows(tmp_path / "straight")] == [2, 3, 4]  # validation at 2 and 4, a log row at 3
    assert rows(tmp_path / "stopped") == rows(tmp_path / "straight")
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_varlen_segments_are_the_packs_sequences():
    """The varlen backend's cumulative lengths (built on any device; flash attention itself needs CUDA): causal
    attention run segment by segment over the flattened rows equals the document-causal mask's attention, so
    the CUDA path gets the right segments (empty slots are segments of length 0)."""
    import torch.nn.functional as F

    from bert_ipu.models.attention import Varlen
    from bert_ipu.ops import reference_packed_attention_mask

    batch, _ = pack(sequences(), [[0, 1], [2, 3, 4], [4]])
    ids = batch["sequence_ids"]
    B, S = ids.shape
    K = 3
    cu = Varlen(ids, K).cu
    assert cu.dtype == torch.int32 and cu.shape == (B * (K + 1) + 1,) and cu[-1] == B * S
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, 2, S, 8, generator=g, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_packed_attention_mask(ids, torch.float64,
                                                                                                causal=True))
    flat = [x.transpose(1, 2).reshape(B * S, 2, 8) for x in (q, k, v)]
    got = torch.empty_like(flat[0])
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if hi > lo:
            seg = [x[lo:hi].transpose(0, 1) for x in flat]  # (heads, n, D)
            got[lo:hi] = F.scaled_dot_product_attention(*seg, is_causal=True).transpose(0, 1)
    torch.testing.assert_close(got.view(B, S, 2, 8).transpose(1, 2), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_the_chunked_vocabulary_loss_equals_the_plain_one(chunk):
    """model.loss_chunk_tokens: the LM head and the cross-entropy chunk by chunk, each chunk recomputed in the
    backward pass. In float64 the loss sums, the label count, the correct predictions and every gradient equal the
    plain loss over the whole logits to rounding (1e-12), for chunks that divide the tokens or not."""
    from bert_ipu.models.losses import HiddenStates, chunked_causal_lm_loss_sums

    _, ours = hf_and_packed("llama", torch.float64)
    batch, _ = pack(sequences(), [[0, 1], [2, 3, 4]])
    args = (batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
    weights = sequence_label_weights(batch["labels"], batch["sequence_ids"], 3)
    logits = ours(*args)
    plain = causal_lm_loss_sums(logits, batch["labels"], weights)
    plain_correct = ((logits.argmax(-1) == batch["labels"]) & (batch["labels"] != IGNORE_INDEX)).sum()
    (plain.token_loss_sum + plain.sequence_loss_sum).backward()
    expected = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad(set_to_none=True)
    ours.head_in_loss = True
    out = ours(*args)
    assert isinstance(out, HiddenStates)
    sums, correct = chunked_causal_lm_loss_sums(out, batch["labels"], weights, chunk)
    (sums.token_loss_sum + sums.sequence_loss_sum).backward()
    for name in ("token_loss_sum", "label_tokens", "sequence_loss_sum", "labelled_sequences"):
        torch.testing.assert_close(getattr(sums, name), getattr(plain, name), rtol=1e-12, atol=1e-12)
    assert int(correct) == int(plain_correct)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-10, atol=1e-12, msg=name)


def test_a_run_with_the_chunked_loss_trains_as_the_plain_one(tmp_path):
    """The causal LM application with model.loss_chunk_tokens=100 logs the losses of the plain run (float32, 1e-5
    relative: the same terms summed in chunks) and counts the LM head's FLOPs all the same."""
    rows = {}
    for name, extra in (("plain", []), ("chunked", ["model.loss_chunk_tokens=100"])):
        out = tmp_path / name
        assert entry("causal_lm", ["--config", "sft_tiny_chat_packed", *TINY, f"output_dir={out}",
                                   "train.max_steps=3", *extra]) == 0
        rows[name] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(rows["plain"], rows["chunked"]):
        for key in ("loss", "accuracy", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]), (key, a[key], b[key])
    per_token = {name: [r["tflops_per_second"] / r["tokens_per_second"] for r in rs if "tflops_per_second" in r]
                 for name, rs in rows.items()}
    assert per_token["plain"] and len(per_token["plain"]) == len(per_token["chunked"])
    for a, b in zip(per_token["plain"], per_token["chunked"]):  # the same updates: the head counted in both
        assert abs(a - b) <= 1e-9 * a


def test_kv_heads_that_do_not_divide_the_heads_are_refused():
    """3 key/value heads for 4 query heads: transformers takes the config and its forward fails deep in SDPA (so
    did ours); one line naming both counts now."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=3, head_dim=8)
    with pytest.raises(ValueError, match="num_attention_heads 4 is not a multiple of num_key_value_heads 3"):
        PackedLlamaForCausalLM(config)
