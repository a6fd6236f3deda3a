import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

# `make test` runs two pytest-xdist workers on this 2-core machine: torch takes one thread in each, as the processes
# the tests start do (OMP_NUM_THREADS=1). Two OpenMP threads a worker would oversubscribe the cores, and OpenMP's
# spinning threads slow down sharply when they do (a 1 s test took 16 s).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# The most the suite holds on disk at once, measured with `make test` (1.6 GB at its peak: the session's datasets
# and runs, plus the running tests' folders; pyproject.toml has pytest delete a passing test's tmp_path as it ends).
SUITE_DISK_GB = 2


def pytest_sessionstart(session):
    """Too little free disk is one line before anything runs, not dozens of 'No space left on device' errors
    after ten minutes (a CI machine once had too little). Checked once, by the process that starts the workers."""
    if hasattr(session.config, "workerinput"):
        return
    where = Path(session.config.option.basetemp or tempfile.gettempdir()).resolve()
    free = shutil.disk_usage(next(p for p in (where, *where.parents) if p.exists())).free
    if free < SUITE_DISK_GB * 2**30:
        pytest.exit(f"the tests need about {SUITE_DISK_GB} GB free on the disk of {where} and it has {free / 2**30:.1f} "
                    "GB: free some space, or point TMPDIR (or --basetemp) at a disk with more", returncode=2)


# The slowest test files first, longest first (seconds a file on the 2-core machine, `--junitxml` of the whole
# suite, 2026-11-29: 202, 158, 125, 121, 100, 83, 70, 66, 62, 60 s): `make test`'s two workers take a file at a
# time in collection order (`--dist loadfile`), and test_sequence_parallel, alphabetically late, ran last while
# the other worker idled. The rest keep their order.
SLOW_FILES = ("test_sequence_parallel.py", "test_packing_small.py", "test_engine.py", "test_distributed_data.py",
              "test_tensor_parallel.py", "test_squad.py", "test_refusals.py", "test_docs.py",
              "test_gpu_benchmarks.py", "test_profiling.py")


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))   # (stable: a file's tests keep their order)


HISTOGRAMS = Path(__file__).resolve().parent.parent / "benchmarks" / "histograms"


@pytest.fixture(scope="session")
def wikipedia_512() -> np.ndarray:
    return np.array(json.loads((HISTOGRAMS / "wikipedia_512.json").read_text()), dtype=np.int64)


@pytest.fixture(scope="session")
def squad_384() -> np.ndarray:
    return np.array(json.loads((HISTOGRAMS / "squad_1_1_384.json").read_text()), dtype=np.int64)

import sys

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "data"))  # the data/ command-line scripts
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run_pretraining.py, run_profiling.py


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """A small packed dataset of real text (pydoc topics) at 64 tokens, CGHP depth 3, with a validation split."""
    import pydoc_data.topics

    from bert_ipu.data.instances import InstanceConfig
    from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
    from bert_ipu.data.text import split_sentences

    folder = tmp_path_factory.mktemp("train_data")
    text = "\n\n".join("\n".join(split_sentences(pydoc_data.topics.topics[n]))
                       for n in sorted(pydoc_data.topics.topics)[:30])
    (folder / "corpus.txt").write_text(text)
    create_pretraining_data([str(folder / "corpus.txt")], folder / "instances", InstanceConfig(max_seq_length=64),
                            docs_per_shard=10, validation_fraction=0.25, progress=False)
    pack_pretraining_data(folder / "instances", folder / "packed", "cghp", 3, progress=False)
    return folder / "packed"


@pytest.fixture(scope="session")
def tiny_run(dataset, tmp_path_factory) -> Path:
    """test_tiny trained 4 updates on one process (checkpoints and validation at steps 2 and 4): the reference
    that test_training's pipelines and test_tensor_parallel's tensor-parallel runs are compared with. Shared by
    the session: read it, or copy it before changing anything."""
    from bert_ipu.tasks import load_config, run

    out = tmp_path_factory.mktemp("tiny_run") / "one"
    run(load_config("test_tiny", [f"data.dataset={dataset}", f"output_dir={out}", "model.max_position_embeddings=64",
                                  "data.max_seq_length=64", "train.max_steps=4", "train.checkpoint_every=2",
                                  "train.validate_every=2"]), progress=False)
    return out

