"""Packed against unpacked pretraining on the same data: learning curves and throughput (CPU, small BERT).

    .venv/bin/python benchmarks/packed_vs_unpacked.py [--seq-len 512] [--steps 240] [--out runs/packed_vs_unpacked]

1. Data: the built-in corpus at --seq-len, packed with CGHP (depth 3) and unpacked (NONE), from the same
   instances (so the validation splits hold the same masked tokens).
2. Throughput: one model, fwd+bwd+step on packed and unpacked micro-batches of the same shape, interleaved
   in one run: real sequences/s and tokens/s, medians over rounds.
3. Learning curves: the unpacked run takes `--steps` updates of 32 rows; the packed run takes 32 packs per
   update (about 32 p sequences) with the betas corrected to beta ** p, for steps / p updates: both see the
   same number of sequences. Validation MLM accuracy against sequences seen, plotted to OUT/curves_S.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bert_ipu.arguments import Parser, at_least
from bert_ipu.tasks import load_config
from bert_ipu.data.loader import PackedLoader
from bert_ipu.data.instances import InstanceConfig
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
from bert_ipu.data.shards import PackedDataset
from bert_ipu.files import save_png, write_json
from bert_ipu.tasks import run as train


def throughput(packed: PackedDataset, unpacked: PackedDataset, rounds: int = 8, micro: int = 8) -> dict:
    from transformers import BertConfig

    from bert_ipu.models.bert import PackedBertForPreTraining

    config = BertConfig(vocab_size=packed.manifest["vocab"]["size"], hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=512, max_position_embeddings=packed.layout.pack_len)
    models = {"packed": PackedBertForPreTraining(config, packed.layout.max_sequences_per_pack),
              "unpacked": PackedBertForPreTraining(config, 1)}
    models["unpacked"].load_state_dict(models["packed"].state_dict())
    loaders = {name: iter(PackedLoader(data, "train", micro)) for name, data in
               (("packed", packed), ("unpacked", unpacked))}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times = {k: [] for k in models}
    seqs = {k: [] for k in models}
    toks = {k: [] for k in models}
    for r in range(rounds + 1):
        for name in models:
            batch = next(loaders[name])
            start = time.perf_counter()
            out = models[name](**batch)
            out.loss.backward()
            opts[name].step()
            opts[name].zero_grad()
            if r:  # round 0 is warm-up
                times[name].append(time.perf_counter() - start)
                seqs[name].append(batch["next_sentence_weights"].sum().item())
                toks[name].append((batch["sequence_ids"] > 0).sum().item())
    return {k: {"sequences_per_second": sum(seqs[k]) / sum(times[k]), "tokens_per_second": sum(toks[k]) / sum(times[k]),
                "median_step_seconds": statistics.median(times[k])} for k in models}


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=at_least(1), default=512)
    parser.add_argument("--steps", type=at_least(1), default=240, help="updates of the unpacked run")
    parser.add_argument("--out", default="runs/packed_vs_unpacked")
    args = parser.parse_args()
    out = Path(args.out)
    S = args.seq_len
    inst = out / f"instances_{S}"
    # every folder by its length, each kept only if made from the same input and settings (--if-changed): the
    # packed and unpacked data of an earlier --seq-len were reused and reported as this length's
    create_pretraining_data(["builtin"], inst, InstanceConfig(max_seq_length=S), validation_fraction=0.1,
                            if_changed=True)
    data = {name: out / f"{name}_{S}" for name in ("packed", "unpacked")}
    for name, algorithm, depth in (("packed", "cghp", 3), ("unpacked", "none", 1)):
        pack_pretraining_data(inst, data[name], algorithm, depth, if_changed=True)
    packed, unpacked = PackedDataset(data["packed"]), PackedDataset(data["unpacked"])
    p = packed.manifest["packing"]["train"]["packing_factor"]
    print(f"data at {S}: packing factor {p:.3f}, efficiency packed "
          f"{packed.manifest['packing']['train']['efficiency']:.2%} vs unpacked "
          f"{unpacked.manifest['packing']['train']['efficiency']:.2%}")

    tp = throughput(packed, unpacked)
    ratio = tp["packed"]["sequences_per_second"] / tp["unpacked"]["sequences_per_second"]
    for k, v in tp.items():
        print(f"  {k:>8}: {v['sequences_per_second']:7.1f} sequences/s, {v['tokens_per_second']:9.0f} tokens/s, "
              f"median step {v['median_step_seconds'] * 1e3:.0f} ms")
    print(f"  realized speed-up packed/unpacked (sequences/s, same micro-batch shape): {ratio:.3f}x "
          f"(padding bound {p:.3f}x)")

    curves = {}
    packed_steps = max(1, round(args.steps / p))
    for name, steps, algorithm, depth in (("unpacked", args.steps, "none", 1), ("packed", packed_steps, "cghp", 3)):
        every = max(1, steps // 8)
        cfg = load_config("pretrain_tiny_128_packed", [
            f"data.dataset={data[name]}", "data.prepare_input=null", f"output_dir={out / f'run_{name}_{S}'}",
            f"data.max_seq_length={S}", f"data.algorithm={algorithm}", f"data.max_sequences_per_pack={depth}",
            f"model.max_position_embeddings={S}", f"train.max_steps={steps}", f"train.validate_every={every}",
            f"train.warmup_steps={max(1, steps // 10)}", "train.log_every=10", f"train.checkpoint_every={steps}",
            "train.validation_batches=1000", "train.micro_batch_size=8", "train.global_batch_size=32"])
        start = time.perf_counter()
        result = train(cfg, overwrite=True, progress=False)
        rows = [json.loads(x) for x in (out / f"run_{name}_{S}" / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["sequences_seen"], r["val_mlm_accuracy"]) for r in rows if "val_mlm_accuracy" in r]
        print(f"  {name:>8}: {steps} updates, {time.perf_counter() - start:.0f} s, final validation MLM accuracy "
              f"{result['metrics']['val_mlm_accuracy']:.4f}, sequences seen {curves[name][-1][0]:.0f}")
    write_json(out / f"curves_{S}.json", curves)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in curves.items():
        ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=name)
    ax.set(xlabel="sequences seen", ylabel="validation MLM accuracy", title=f"packed (p={p:.2f}) vs unpacked, S={S}")
    ax.legend()
    fig.tight_layout()
    save_png(fig, out / f"curves_{S}.png")
    print(f"wrote {out / f'curves_{S}.png'}")


if __name__ == "__main__":
    main()
