"""Packed BERT: sequence packing without cross-contamination, for BERT and causal language models.

Data flows one way, and so do the imports: packing -> data -> models -> engine -> tasks -> cli.

    packing/  histogram packing algorithms and the assignment of sequences to packs (numpy/scipy)
    data/     text -> instances -> packed, memory-mapped shards; the loaders
    models/   packed BERT, GPT-2 and Llama with Hugging Face names; attention backends; losses; plans
    engine/   the one training loop, checkpoints, data/pipeline/tensor parallelism
    tasks/    a folder a task (pretraining, squad, glue, causal_lm, profile), found by its config kind
    cli.py    the one command line (`python -m bert_ipu --config NAME ...`)
"""
