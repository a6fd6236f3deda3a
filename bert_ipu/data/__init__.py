"""Pretraining data: the packed layout (layout.py); instance creation and shards come with the data pipeline."""
