"""The engine's step on CUDA (skipped without a GPU; run by `benchmarks/gpu_measure.sh tests` and `quick`): no host
synchronisation inside an update (torch's sync debug mode turned to errors), and the compiled and CUDA-graph steps
train as the eager step does, gradient accumulation included."""

import json

import pytest
import torch

from bert_ipu.tasks import run as main

from training_helpers import tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def losses(out):
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_an_update_never_waits_for_the_device(dataset, tmp_path, optimizer):
    """Copy in, forward and backward of two micro-batches, the gradient norm, the non-finite check, the optimizer
    step (LAMB's multi-tensor path, fused AdamW) and the schedule: with torch.cuda.set_sync_debug_mode("error")
    any copy to the host or blocking call inside raises."""
    from bert_ipu.engine.optim import build_optimizer
    from bert_ipu.engine.parallel import LocalParallel, global_counts, to_device
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.engine.trainer import NonFinite
    from bert_ipu.tasks.pretraining.task import PretrainingTask
    from bert_ipu.data.loader import ShardSource

    cfg = tiny(dataset, tmp_path / "x", f"train.optimizer={optimizer}", "train.device=cuda", "train.precision=bf16")
    task = PretrainingTask(cfg)
    rt = Runtime.start("cuda")
    task.prepare(rt)
    model = task.build_model().to(rt.device).train()
    engine = LocalParallel(model, task, rt, "bf16")
    opt, sched = build_optimizer(model, cfg.train, 10, 2, (0.9, 0.999))
    source = ShardSource(task.data, "train")
    host = [{k: torch.from_numpy(v) for k, v in source.gather(list(range(i, i + 4))).items()} for i in (0, 4)]
    health = NonFinite()

    def update(step):
        counts = global_counts(task, engine, host)
        sums = engine.train_step([to_device(b, rt.device) for b in host], task.normalizers(counts))
        health.note(step, sums, engine.clip(1.0), counts)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return sums

    update(1)  # first use: allocations, kernel loading
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = update(2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sums.device.type == "cuda" and health.first() is None and torch.isfinite(sums).all()


@pytest.mark.parametrize("mode", ["compile", "cudagraphs"])
def test_compiled_and_graph_replayed_steps_train_as_eager_on_cuda(dataset, tmp_path, mode):
    """Float32 on CUDA, two micro-batches an update (gradient accumulation: a replayed graph's gradients must be
    accumulated, never overwritten by the next replay): the losses of 4 updates are eager's within 1e-4 relative
    (kernels sum in other orders; LAMB scales each update by norms)."""
    common = ["train.device=cuda", "train.max_steps=4", "train.validate_every=4", "train.checkpoint_every=4"]
    main(tiny(dataset, tmp_path / "eager", *common), progress=False)
    main(tiny(dataset, tmp_path / mode, *common, f"train.compile={mode}"), progress=False)
    a, b = losses(tmp_path / "eager"), losses(tmp_path / mode)
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x), (a, b)


def test_varlen_trains_on_cuda_as_mask_does(dataset, tmp_path):
    """BERT pretraining with flash attention (bf16): the losses of 3 updates within bf16 rounding of the mask
    backend's (2e-2 relative: the two kernels round differently)."""
    common = ["train.device=cuda", "train.precision=bf16", "train.max_steps=3", "train.validate_every=3",
              "train.checkpoint_every=3"]
    main(tiny(dataset, tmp_path / "mask", *common), progress=False)
    main(tiny(dataset, tmp_path / "varlen", *common, "model.attention_backend=varlen"), progress=False)
    for x, y in zip(losses(tmp_path / "mask"), losses(tmp_path / "varlen")):
        assert abs(x - y) <= 2e-2 * abs(x)
