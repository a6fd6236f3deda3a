"""SQuAD v1.1 fine-tuning and evaluation, packed or unpacked.

    features.py     SQuAD JSON / `datasets` -> examples -> windowed features (the reference's algorithm) -> packs
    postprocess.py  per-feature start/end logits -> n-best spans -> one answer per question
    metrics.py      the official v1.1 answer normalisation, exact match and F1
    (fine-tuning itself is the squad task of the engine: bert_ipu/tasks/squad.py)
"""
