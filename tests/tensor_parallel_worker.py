"""A model split over the tensor-parallel ranks against the same model whole, on the same packs, in float64:
`checks()` returns the largest differences on every rank, and tests/test_tensor_parallel.py asserts on them. The
test runs it as a step of its module's one launch (tests/engine_worker.py); by hand, rank 0 writes them to the
JSON file given as argv[1]:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/tensor_parallel_worker.py OUT.json
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
from pytorch_optimizer import Lamb
from transformers import BertConfig, LlamaConfig

from bert_ipu.models.llama import PackedLlamaForCausalLM
from bert_ipu.models.losses import causal_lm_loss_sums, sequence_label_weights
from bert_ipu.engine.optim import ShardedLamb
from bert_ipu.engine.runtime import finish
from bert_ipu.engine.tensor import full, loss_context, parallelize
from bert_ipu.models.bert import PackedBertForPreTraining
from bert_ipu.models.losses import pretraining_loss_sums
from bert_ipu.models import plans

V = 99  # odd: the vocabulary splits unevenly (50 + 49 rows), nothing padded


def packs(generator: torch.Generator):
    """Two packs of 16 tokens: two sequences and padding, then two sequences; the first rank's last vocabulary
    row and the second rank's first (49, 50) and the padding id 0 among the tokens."""
    sequence_ids = torch.tensor([[1] * 6 + [2] * 7 + [0] * 3, [1] * 10 + [2] * 6])
    position_ids = torch.cat([torch.arange(6), torch.arange(7), torch.zeros(3, dtype=torch.long)]).repeat(2, 1)
    position_ids[1] = torch.cat([torch.arange(10), torch.arange(6)])
    input_ids = torch.randint(1, V, (2, 16), generator=generator)
    input_ids[0, :3] = torch.tensor([49, 50, 0])
    return input_ids, position_ids, sequence_ids


def largest(a: dict, b: dict, skip=()) -> float:
    return max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a if k not in skip)


def compare(whole: torch.nn.Module, loss_of, mesh, plan, steps: int = 2) -> dict:
    """Loss, every gradient (whole), LAMB's trust ratios and the weights after `steps` LAMB steps: split vs whole.

    Gradients, trust ratios and weights leave out the parameters whose gradient is zero up to rounding (below 1e-10 of
    the largest: BERT's attention key biases, to which softmax is invariant): LAMB divides such a gradient
    by its own RMS, so their update is rounding noise scaled to the learning rate, in any two summation
    orders, split or not. They are returned by name."""
    split = parallelize(copy.deepcopy(whole), mesh, plan, seed=0)
    optimizers = {"whole": Lamb(whole.parameters(), lr=0.01, weight_decay=0.01),
                  "split": ShardedLamb(split.parameters(), lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)}
    out = {"loss": 0.0, "gradients": 0.0, "trust_ratios": 0.0, "weights": 0.0, "clipped_norm": 0.0}
    for _ in range(steps):
        losses, grads, ratios, norms = {}, {}, {}, {}
        for name, model in (("whole", whole), ("split", split)):
            with loss_context(2 if name == "split" else 1):
                loss = loss_of(model)
                loss.backward()
            losses[name] = loss.detach()
            # clipping by the global norm: the norm of whole gradients, and every gradient scaled alike
            norms[name] = float(full(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
            grads[name] = {k: full(p.grad) for k, p in model.named_parameters()}
            optimizers[name].step()
            optimizers[name].zero_grad()
            ratios[name] = {k: torch.as_tensor(optimizers[name].state[p]["trust_ratio"], dtype=torch.float64)
                            for k, p in model.named_parameters()}
        out["loss"] = max(out["loss"], abs(losses["whole"] - losses["split"]).item() / abs(losses["whole"]).item())
        out["clipped_norm"] = max(out["clipped_norm"], abs(norms["whole"] - norms["split"]) / norms["whole"])
        out["norm"] = norms["whole"]
        if "null" not in out:
            top = max(g.norm() for g in grads["whole"].values())
            out["null"] = sorted(k for k, g in grads["whole"].items() if g.norm() < 1e-10 * top)
        out["gradients"] = max(out["gradients"], largest(grads["whole"], grads["split"], out["null"]))
        out["trust_ratios"] = max(out["trust_ratios"], largest(ratios["whole"], ratios["split"], out["null"]))
    weights = {k: full(v) for k, v in split.state_dict().items()}
    out["weights"] = largest(whole.state_dict(), weights, {k for k in weights if k in out["null"]})
    out["tied"] = bool(split.get_parameter(TIED[type(whole)][0]) is split.get_parameter(TIED[type(whole)][1]))
    return out


TIED = {PackedBertForPreTraining: ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"),
        PackedLlamaForCausalLM: ("model.embed_tokens.weight", "lm_head.weight")}


def bert(dropout: float = 0.0) -> PackedBertForPreTraining:
    config = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    return PackedBertForPreTraining(config, max_sequences_per_pack=2, attention_backend="mask").double()


def checks() -> dict:
    """Every comparison, in a process group of 2 (gloo) that is already up."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(1)
    input_ids, position_ids, sequence_ids = packs(g)
    token_type_ids = (position_ids > 3).long()
    mlm_labels = torch.randint(0, V, (2, 4), generator=g)
    mlm_labels[0, 1] = -100
    nsp_labels = torch.randint(0, 2, (2, 2), generator=g)
    nsp_weights = torch.ones(2, 2, dtype=torch.float64)

    def bert_loss(model):
        mlm, nsp = model(input_ids, position_ids, token_type_ids, sequence_ids, mlm_slots=4)
        sums = pretraining_loss_sums(mlm, nsp, mlm_labels, nsp_labels, nsp_weights)
        return sums.mlm_loss_sum / sums.mlm_count + sums.nsp_loss_sum / sums.nsp_count

    result = {"bert": compare(bert(), bert_loss, mesh, plans.BERT)}

    llama_config = LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32,
                               tie_word_embeddings=True)
    torch.manual_seed(0)
    llama = PackedLlamaForCausalLM(llama_config, attention_backend="mask").double()
    labels = torch.roll(input_ids, -1, 1).masked_fill(sequence_ids == 0, -100)

    def llama_loss(model):
        sums = causal_lm_loss_sums(model(input_ids, position_ids, sequence_ids), labels,
                                   sequence_label_weights(labels, sequence_ids, 2))
        return sums.token_loss_sum / sums.label_tokens

    result["llama"] = compare(llama, llama_loss, mesh, plans.LLAMA)

    # dropout on: the replicated activations must stay equal on every rank (same masks outside the attention
    # cores), so the loss and every replicated gradient are bitwise equal across the tensor-parallel ranks
    split = parallelize(bert(dropout=0.3).train(), mesh, plans.BERT, seed=0)
    with loss_context(2):
        loss = bert_loss(split)
        loss.backward()
    mine = torch.cat([loss.detach().reshape(1)] + [p.grad.to_local().flatten() for p in split.parameters()
                                                   if p.placements[0].is_replicate()])
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    result["dropout_replicated_equal"] = all(torch.equal(gathered[0], x) for x in gathered)
    # ... and the attention cores draw from a generator of their own per rank: the shared one moves as if the
    # attention dropout were off
    probe = parallelize(bert(dropout=0.3).train(), mesh, plans.BERT, seed=0)
    no_attention_dropout = bert(dropout=0.3).train()
    for layer in no_attention_dropout.bert.encoder.layer.values():
        layer.attention.self.dropout_p = 0.0
    no_attention_dropout = parallelize(no_attention_dropout, mesh, plans.BERT, seed=0)
    states = []
    for model in (probe, no_attention_dropout):
        torch.manual_seed(5)
        with loss_context(2):
            bert_loss(model)
        states.append(torch.get_rng_state())
    result["shared_generator_untouched"] = bool(torch.equal(states[0], states[1]))
    # one generator for the attention cores, advancing from layer to layer: each layer, and each rank, its own
    # masks (the state at entry to every attention core differs from layer to layer and from rank to rank)
    entries = []
    for layer in probe.bert.encoder.layer.values():
        layer.attention.self.register_forward_pre_hook(lambda module, args: entries.append(torch.get_rng_state()))
    with loss_context(2):
        bert_loss(probe)
    result["layers_draw_apart"] = not torch.equal(entries[0], entries[1])
    gathered = [torch.empty_like(entries[0]) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, entries[0])
    result["ranks_draw_apart"] = not torch.equal(gathered[0], gathered[1])
    return result


def main(path: str) -> None:
    dist.init_process_group("gloo")
    result = checks()
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(result, f)
    dist.barrier()
    finish(0)  # without gloo's teardown, as the entry points (engine/runtime.finish)


if __name__ == "__main__":
    main(sys.argv[1])
