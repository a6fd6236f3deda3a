import json
from pathlib import Path

import numpy as np
import pytest

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
