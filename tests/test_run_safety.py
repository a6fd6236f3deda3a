"""A run never destroys what it did not write and never continues on other data (issue 30)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from training_helpers import entry, final_weights

COMMON = ["--config", "test_tiny", "model.max_position_embeddings=64", "data.max_seq_length=64",
          "train.max_steps=4", "train.checkpoint_every=2", "train.validate_every=2"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_folder_this_project_did_not_write(dataset, tiny_run, tmp_path):
    """--overwrite once deleted a user's config.yaml, results.json and hf/ because their names matched a run's.
    Now a folder without the run marker (or a checkpoint of ours) is refused with nothing touched, and a folder
    holding our run is still replaced."""
    user = tmp_path / "mine"
    (user / "hf").mkdir(parents=True)
    (user / "config.yaml").write_text("my: settings\n")
    (user / "results.json").write_text('{"my": "results"}')
    (user / "hf" / "model.safetensors").write_bytes(b"my weights")
    before = snapshot(user)
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={user}", "--overwrite"]) == 2
    assert snapshot(user) == before

    run = tmp_path / "ours"
    shutil.copytree(tiny_run, run)
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={run}", "train.max_steps=2",
                                 "--overwrite"]) == 0
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000002"]


def test_resume_refuses_other_data_and_accepts_the_same_data_moved(dataset, tiny_run, tmp_path):
    """--resume with data.dataset pointing at a dataset of the same layout but other content (here: its vocab.txt
    shuffled after creation, the ids now meaning other words) trained on silently before. The run records a
    fingerprint of its training rows (and vocabulary) and refuses other data in one line, the run unchanged; the
    same dataset copied elsewhere (same content, other path) resumes and ends as the uninterrupted run."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    (run / "results.json").unlink()
    shuffled = tmp_path / "shuffled"
    shutil.copytree(dataset, shuffled)
    words = (shuffled / "vocab.txt").read_text().splitlines()
    order = np.random.default_rng(0).permutation(len(words))
    (shuffled / "vocab.txt").write_text("\n".join(words[i] for i in order) + "\n")
    before = snapshot(run)
    assert entry("pretraining", [*COMMON, f"data.dataset={shuffled}", f"output_dir={run}", "--resume"]) == 2
    assert snapshot(run) == before

    moved = tmp_path / "moved"
    shutil.copytree(dataset, moved)
    assert entry("pretraining", [*COMMON, f"data.dataset={moved}", f"output_dir={run}", "--resume"]) == 0
    a, b = final_weights(run), final_weights(tiny_run)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
