"""GLUE fine-tuning, packed or unpacked: the data and metrics layer.

    data.py     TASKS (TaskSpec per task); official GLUE TSV folders / saved `datasets` -> GlueExample
                (read_split, InputReport, GlueInputError) -> flat token features (featurize, GlueFeatures)
    metrics.py  compute(task, predictions, labels): accuracy, F1, Matthews, Pearson, Spearman as GLUE defines them
"""
