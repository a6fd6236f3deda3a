"""Tasks: what differs between packed trainings, one file each, on the one engine (bert_ipu/engine).

A task supplies:
    name, input_fields (the model's positional inputs), target_fields (what the loss reads)
    stat_names        the named sums its loss reports (e.g. mlm_loss_sum), besides the counts
    prepare(rt)       read or create its packed data; a config that disagrees with the data is an error
    packed, packing_factor, drop_last, train_source(), layout_record(), describe()
    build_model()     the full model (a pipeline stage is made from it by deleting modules: pipeline_plan)
    tensor_plan(model)  how tensor parallelism splits it (plans.py), or None
    counts(micro)     data-only sums of an update: what the loss divides by, "sequences", "tokens"
    normalizers(counts), loss(output, targets, normalizers) -> (loss, sums)   one loss for every engine
    summarize(sums)   means for people ("loss" at least)
    has_evaluation, evaluate(engine, rt, step), headline, progress_keys
    export(model, folder, info), result_extra()

`run(cfg)` picks the task from the config's kind.
"""

from __future__ import annotations


def task_for(cfg):
    if cfg.kind == "pretraining":
        from .pretraining import PretrainingTask

        return PretrainingTask(cfg)
    if cfg.kind == "squad":
        from .squad import SquadTask

        return SquadTask(cfg)
    if cfg.kind == "glue":
        from .glue import GlueTask

        return GlueTask(cfg)
    if cfg.kind == "causal_lm":
        from .causal_lm import CausalLMTask

        return CausalLMTask(cfg)
    raise ValueError(f"no task of kind {cfg.kind!r}")
