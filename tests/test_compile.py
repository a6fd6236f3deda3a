"""train.compile (the engine's, for every task): the compiled step trains as the eager step does; what cannot run
is refused in one line before anything is written; the step keeps its sums on the device."""

import json
import math

import pytest
import torch

from bert_ipu.engine.runtime import RunError
from bert_ipu.tasks import run as main

from training_helpers import tiny


def losses(out):
    return [row["loss"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


@pytest.mark.parametrize("mode", ["compile", "layers"])
def test_the_compiled_step_trains_as_the_eager_step(dataset, tmp_path, mode):
    """Forward, loss and backward under torch.compile (static shapes; the whole step, or each layer alone): the
    same losses, update by update, as the eager step, within float32 rounding (fused kernels sum in another order:
    1e-4 relative over 4 LAMB updates of a model whose loss is about 10), the same validation accuracy."""
    common = ["train.max_steps=4", "train.validate_every=4", "train.checkpoint_every=4", "train.optimizer=lamb"]
    eager = main(tiny(dataset, tmp_path / "eager", *common), progress=False)
    compiled = main(tiny(dataset, tmp_path / "compiled", *common, f"train.compile={mode}"), progress=False)
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert len(a) == len(b) == 4
    # a mean per masked token plus one per sequence: about ln(vocab) + ln(2) at the start, not a sum (the rows once
    # lost the counts the sums divide by)
    assert 5 < a[0] < 2 * math.log(30522), a
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x), (a, b)
    assert compiled["metrics"]["val_mlm_accuracy"] == pytest.approx(eager["metrics"]["val_mlm_accuracy"], abs=0.02)
    assert (tmp_path / "compiled" / "hf" / "model.safetensors").is_file()


def test_cudagraphs_off_cuda_and_compile_with_model_parallelism_are_refused(dataset, tmp_path):
    out = tmp_path / "refused"
    with pytest.raises(RunError, match=r"train.compile=cudagraphs replays CUDA graphs and this run is on cpu; use "
                                       r"train.compile=compile"):
        main(tiny(dataset, out, "train.compile=cudagraphs", "train.device=cpu"), progress=False)
    assert not out.exists()  # refused before the run folder was made


def _engine(dataset, tmp_path, compile_mode="none"):
    """(the engine's LocalParallel for the tiny pretraining run, its model, a micro-batch of 4 packs)."""
    from bert_ipu.data.loader import ShardSource
    from bert_ipu.engine.parallel import LocalParallel
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    task = PretrainingTask(tiny(dataset, tmp_path / "x"))
    rt = Runtime.start("cpu")
    task.prepare(rt)
    model = task.build_model()
    engine = LocalParallel(model, task, rt, compile_mode=compile_mode)
    rows = ShardSource(task.data, "train").gather(list(range(4)))
    return engine, model, {k: torch.from_numpy(v) for k, v in rows.items()}


def test_a_train_step_returns_its_sums_on_the_device_it_ran_on(dataset, tmp_path):
    """The engine's step hands back its loss sums as one vector where they were computed (the trainer copies them
    to the host once a log row): on the CPU here, on CUDA in tests/test_gpu_step.py under torch's sync check."""
    engine, _, batch = _engine(dataset, tmp_path)
    sums = engine.train_step([batch], {"mlm": 10.0, "nsp": 4.0})
    assert isinstance(sums, torch.Tensor) and sums.dtype == torch.float64 and sums.shape == (len(engine.task.stat_names),)
    assert torch.isfinite(sums).all() and sums[0] > 0
    assert isinstance(engine.clip(1.0), torch.Tensor)


def _tiny_bert(layers=4):
    from transformers import BertConfig

    from bert_ipu.models.bert import PackedBertForPreTraining

    config = BertConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = PackedBertForPreTraining(config, 2, attention_backend="reference")
    ids = torch.tensor([[1] * 20 + [2] * 10 + [0] * 2] * 2)
    inputs = dict(input_ids=torch.randint(0, 100, (2, 32)), position_ids=torch.arange(32).repeat(2, 1) % 20,
                  token_type_ids=torch.zeros(2, 32, dtype=torch.long), sequence_ids=ids,
                  masked_lm_labels=torch.randint(0, 100, (2, 8)),
                  next_sentence_labels=torch.zeros(2, 2, dtype=torch.long), next_sentence_weights=torch.ones(2, 2))
    return model, inputs


def test_compiled_layers_share_one_compilation():
    """train.compile=layers compiles every layer of the stack on its own, and dynamo compiles one graph for all of
    them (their weights are inputs, not constants): 6 layers, one forward graph; recompiling per layer would
    multiply the compile time by the depth and, past dynamo's recompile limit, silently fall back to eager. The
    outputs and gradients are eager's."""
    from torch._dynamo.utils import counters

    from bert_ipu.engine.parallel import compile_layers

    eager, inputs = _tiny_bert(6)
    compiled, _ = _tiny_bert(6)
    torch._dynamo.reset()
    counters.clear()
    compile_layers(compiled)
    for model in (eager, compiled):
        model(**inputs).loss.backward()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_checkpointed_layers_stay_compiled():
    """Activation checkpointing (train.levels' checkpointed_layers) gives a layer an instance forward that runs
    torch.utils.checkpoint, which dynamo does not trace into when called directly: as a partial of it, a layer
    compiled alone (train.compile=layers) ran eager, silently. As a plain method it is traced (the checkpoint
    inside the compiled graph); the gradients stay eager's."""
    from torch._dynamo.utils import counters

    from bert_ipu.engine.parallel import checkpoint_layers, compile_layers

    eager, inputs = _tiny_bert()
    compiled, _ = _tiny_bert()
    torch._dynamo.reset()
    counters.clear()
    checkpoint_layers(compiled, 4)
    compile_layers(compiled)
    for model in (eager, compiled):
        model(**inputs).loss.backward()
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_layers_mode_compiles_every_layer_and_evaluates_eager(dataset, tmp_path):
    """train.compile=layers through the engine: every layer of the stack is compiled, and evaluation runs eager
    (as under train.compile=compile): compiled layers would compile again for it, and again for every new
    evaluation shape, inside the timed window and under one recompile limit for all the layers."""
    from torch._dynamo.utils import counters

    from bert_ipu.engine.parallel import layer_stack

    torch._dynamo.reset()
    counters.clear()
    engine, model, batch = _engine(dataset, tmp_path, "layers")
    assert all(layer._compiled_call_impl is not None for layer in layer_stack(model).values())
    engine.train_step([batch], {"mlm": 10.0, "nsp": 4.0})
    trained = counters["stats"]["unique_graphs"]
    assert trained >= 1
    model.eval()
    engine.evaluate([batch], {"mlm": 10.0, "nsp": 4.0})
    assert counters["stats"]["unique_graphs"] == trained
