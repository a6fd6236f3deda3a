"""SQuAD v1.1 fine-tuning and evaluation, packed or unpacked.

    features.py     SQuAD JSON / `datasets` -> examples -> windowed features (the reference's algorithm) -> packs
    postprocess.py  per-feature start/end logits -> n-best spans -> one answer per question
    metrics.py      the official v1.1 answer normalisation, exact match and F1
    finetuning.py   main(cfg): fine-tune, evaluate, write predictions.json (run_squad.py calls it)
"""
