"""Data: from text (or a Wikipedia dump) to BERT's pretraining instances and packed, memory-mapped shards, and the
loaders every task trains with.

    layout.py      how the sequences of a pack sit in its row (numpy only)
    text.py        reading text: files, folders, `datasets` folders, the built-in corpus; sentences
    instances.py   WordPiece, NSP pairs and MLM masking: BERT's pretraining instances
    shards.py      the shard format, its manifest (the one source of truth of the layout) and checksums
    pipeline.py    create_pretraining_data and pack_pretraining_data (data/*.py are their command lines)
    loader.py      UpdateLoader (whole updates, the same on any topology), ShardSource, ArraySource, PackedLoader
    contiguous.py  whole sequences back to back (the fine-tuning tasks' rows)
    jobs.py        engines (local pool, Dask) whose maps keep order; driver progress; library versions for manifests
    wikipedia/     a Wikipedia dump -> text, resumable
"""
