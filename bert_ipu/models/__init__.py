"""Packed models with Hugging Face names, equal to `transformers` on the same sequences unpacked: one file a
model, attention backends in a registry, losses as named sums and counts, plans of where a model splits.

    attention.py  the attention backends by name (mask, reference, flex, varlen) and the one device check
    bert.py       packed BERT: pretraining (MLM + NSP), question answering, sequence classification
    causal_lm.py  what the packed causal LMs share; gpt2.py and llama.py are the families
    losses.py     every loss as sums and counts (named records)
    hf_io.py      loading from and saving to `transformers` folders, exports with tokenizer and model card
    plans.py      tensor-parallel and pipeline plans by module path

`causal_lm_classes()` finds every causal LM family of this folder by its Hugging Face `model_type`: a new family
is a new file with a `PackedCausalLM` subclass.
"""

from __future__ import annotations


def causal_lm_classes() -> dict:
    """{model_type: class} of every `PackedCausalLM` subclass in the modules of this package."""
    import importlib
    import pkgutil

    from .causal_lm import PackedCausalLM

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found, stack = {}, list(PackedCausalLM.__subclasses__())
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if getattr(cls, "model_type", None):
            found[cls.model_type] = cls
    return dict(sorted(found.items()))


def causal_lm_class(config):
    """The packed class of a `transformers` config (by its model_type); a ValueError naming the choices."""
    classes = causal_lm_classes()
    if config.model_type not in classes:
        raise ValueError(f"model type {config.model_type!r} has no packed causal LM here; choose one of "
                         f"{', '.join(classes)}")
    return classes[config.model_type]
