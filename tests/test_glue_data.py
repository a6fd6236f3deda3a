"""GLUE data and metrics: the task table, reading the official TSV fixtures and saved `datasets` (the same
examples), what is left out and counted, bad input, features (token ids, token types, longest-first
truncation) and the metrics against hand-worked cases."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from bert_ipu.data.instances import WordPiece, default_vocab
from bert_ipu.tasks.glue import metrics
from bert_ipu.tasks.glue.data import (TASKS, GlueExample, GlueInputError, InputReport, _truncated_lengths, featurize,
                                read_split)

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


@pytest.fixture(scope="module")
def wp():
    return WordPiece(default_vocab())


# --- the task table ------------------------------------------------------------------------------------------

def test_task_table_follows_hf_glue_label_order_and_glue_metrics():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert TASKS["cola"].labels == ("unacceptable", "acceptable")
    assert TASKS["sst2"].labels == ("negative", "positive")
    assert TASKS["mrpc"].labels == ("not_equivalent", "equivalent")
    assert TASKS["qqp"].labels == ("not_duplicate", "duplicate")
    assert TASKS["stsb"].labels is None
    assert TASKS["mnli"].labels == ("entailment", "neutral", "contradiction")
    assert TASKS["qnli"].labels == TASKS["rte"].labels == ("entailment", "not_entailment")
    assert TASKS["wnli"].labels == ("not_entailment", "entailment")
    assert TASKS["cola"].metrics == ("matthews_correlation",)
    assert TASKS["mrpc"].metrics == TASKS["qqp"].metrics == ("accuracy", "f1")
    assert TASKS["stsb"].metrics == ("pearson", "spearman")
    for t in ("sst2", "mnli", "qnli", "rte", "wnli"):
        assert TASKS[t].metrics == ("accuracy",)
    with pytest.raises(AttributeError):
        TASKS["sst2"].name = "x"  # frozen


# --- reading the TSV fixtures --------------------------------------------------------------------------------

def test_sst2_reads_with_counts_texts_labels_and_leaves_out_the_empty_sentence():
    examples, report = read_split("sst2", FIXTURES / "sst2", "train")
    assert (report.rows, report.examples, report.empty, report.unlabeled) == (16, 15, 1, 0)
    assert "1 with an empty sentence" in report.summary()
    assert examples[0] == GlueExample("train-0", "a gorgeous , witty and seductive movie . ", None, 1)
    assert examples[3] == GlueExample("train-3", "tedious . ", None, 0)
    # row 7 is the empty sentence: the next example keeps its own row number in its uid
    assert [e.uid for e in examples[6:8]] == ["train-6", "train-8"]
    assert examples[7].text_a.startswith("a muddled , self-important mess") and examples[7].label == 0
    assert all(e.text_a.strip() for e in examples)
    dev, report = read_split("sst2", FIXTURES / "sst2", "dev")
    assert (report.rows, report.examples, report.empty) == (8, 8, 0)
    assert [e.label for e in dev] == [1, 0, 0, 1, 1, 0, 1, 0]


def test_a_test_split_reads_without_labels():
    examples, report = read_split("sst2", FIXTURES / "sst2", "test")
    assert (report.rows, report.examples, report.unlabeled) == (6, 6, 6)
    assert [e.uid for e in examples] == ["0", "1", "2", "3", "4", "5"]  # the index column
    assert all(e.label is None for e in examples)
    assert examples[3].text_a == "a gripping , intelligent thriller . "
    mrpc, report = read_split("mrpc", FIXTURES / "mrpc", "test")
    assert report.unlabeled == 4 and mrpc[2].text_b == "Crude oil prices declined for the third day in a row ."


def test_mrpc_reads_pairs_with_the_label_first():
    examples, report = read_split("mrpc", FIXTURES / "mrpc", "train")
    assert (report.rows, report.examples) == (12, 12)
    assert examples[2] == GlueExample("train-2", "The bill passed the Senate by a vote of 61 to 38 .",
                                      "Senators approved the bill 61-38 .", 1)
    assert examples[1].label == 0 and examples[1].text_b.startswith("The retailer expects to open 40")
    assert [e.label for e in examples] == [1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1]
    dev, report = read_split("mrpc", FIXTURES / "mrpc", "dev")
    assert report.examples == 6 and [e.label for e in dev] == [1, 0, 1, 0, 1, 0]


def test_stsb_reads_float_scores():
    examples, report = read_split("stsb", FIXTURES / "stsb", "train")
    assert (report.rows, report.examples) == (12, 12)
    assert examples[0] == GlueExample("0", "A plane is taking off.", "An airplane is taking off.", 5.0)
    assert examples[1].label == pytest.approx(3.8) and isinstance(examples[1].label, float)
    assert examples[2].label == 0.0 and examples[2].text_b == "A man is riding a horse."
    dev, report = read_split("stsb", FIXTURES / "stsb", "dev")
    assert report.examples == 6 and dev[1].label == pytest.approx(4.75)


def test_cola_reads_its_headerless_files():
    examples, report = read_split("cola", FIXTURES / "cola", "train")
    assert (report.rows, report.examples) == (12, 12)  # the first row is data, not a header
    assert examples[0] == GlueExample("train-0", "Our friends won't buy this analysis, let alone the next one we "
                                      "propose.", None, 1)
    assert examples[2] == GlueExample("train-2", "They drank the pub.", None, 0)
    assert [e.label for e in examples] == [1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    dev, report = read_split("cola", FIXTURES / "cola", "dev")
    assert report.examples == 6 and dev[5].text_a == "Mary is taller than." and dev[5].label == 0


def test_mnli_train_matched_and_mismatched_read():
    train, report = read_split("mnli", FIXTURES / "mnli", "train")
    assert (report.rows, report.examples) == (9, 9)
    assert train[5] == GlueExample("5", "The museum is closed on Mondays.",
                                   "You can visit the museum any day of the week.", 2)  # contradiction
    assert [e.label for e in train] == [1, 0, 0, 0, 1, 2, 2, 2, 0]
    matched, rm = read_split("mnli", FIXTURES / "mnli", "dev_matched")
    mismatched, rmm = read_split("mnli", FIXTURES / "mnli", "dev_mismatched")
    assert rm.examples == rmm.examples == 6
    # the label is gold_label, not label1: in dev_matched row 5 label1 is contradiction, the gold neutral
    assert [e.label for e in matched] == [1, 2, 0, 2, 0, 1]
    assert [e.label for e in mismatched] == [2, 2, 0, 2, 0, 1]
    assert matched[1].text_a.startswith("This site includes a list of all award winners")
    assert mismatched[4].text_b == "The flight was not delayed at departure."
    with pytest.raises(GlueInputError, match="dev_matched"):  # plain "dev" is not an MNLI split
        read_split("mnli", FIXTURES / "mnli", "dev")


def test_glue_download_layout_and_task_spelling(tmp_path):
    """A folder holding GLUE's task folders (SST-2/, ...) and GLUE's spellings of the names are accepted."""
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "dev.tsv").write_bytes((FIXTURES / "sst2" / "dev.tsv").read_bytes())
    examples, _ = read_split("SST-2", tmp_path, "validation")
    assert examples == read_split("sst2", FIXTURES / "sst2", "dev")[0]


# --- the same examples from a saved `datasets` dataset -------------------------------------------------------

def _tsv_rows(path: Path, header: bool = True) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    return rows[1:] if header else rows


def test_a_saved_datasetdict_reads_the_same_examples_as_the_tsv(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    def sst2(split):
        rows = _tsv_rows(FIXTURES / "sst2" / f"{split}.tsv")
        if split == "test":
            return {"sentence": [r[1] for r in rows], "label": [-1] * len(rows), "idx": [int(r[0]) for r in rows]}
        return {"sentence": [r[0] for r in rows], "label": [int(r[1]) for r in rows], "idx": list(range(len(rows)))}

    DatasetDict({name: Dataset.from_dict(sst2(split)) for name, split in
                 (("train", "train"), ("validation", "dev"), ("test", "test"))}).save_to_disk(tmp_path / "sst2")
    for split in ("train", "dev", "test"):
        from_tsv, tsv_report = read_split("sst2", FIXTURES / "sst2", split)
        from_ds, ds_report = read_split("sst2", tmp_path / "sst2", split)
        assert [(e.text_a, e.text_b, e.label) for e in from_ds] == [(e.text_a, e.text_b, e.label) for e in from_tsv]
        assert (ds_report.rows, ds_report.examples, ds_report.empty, ds_report.unlabeled) == \
               (tsv_report.rows, tsv_report.examples, tsv_report.empty, tsv_report.unlabeled)
    train, report = read_split("sst2", tmp_path / "sst2", "train")
    assert report.empty == 1 and [e.uid for e in train[6:8]] == ["6", "8"]  # uids are the idx column
    assert [e.uid for e in read_split("sst2", tmp_path / "sst2", "test")[0]] == ["0", "1", "2", "3", "4", "5"]

    features = Features({"sentence1": Value("string"), "sentence2": Value("string"),
                         "label": ClassLabel(names=["not_equivalent", "equivalent"]), "idx": Value("int32")})

    def mrpc(split):
        rows = _tsv_rows(FIXTURES / "mrpc" / f"{split}.tsv")
        label = [-1] * len(rows) if split == "test" else [int(r[0]) for r in rows]
        return {"sentence1": [r[3] for r in rows], "sentence2": [r[4] for r in rows], "label": label,
                "idx": list(range(len(rows)))}

    DatasetDict({name: Dataset.from_dict(mrpc(split), features=features) for name, split in
                 (("train", "train"), ("validation", "dev"), ("test", "test"))}).save_to_disk(tmp_path / "mrpc")
    for split in ("train", "dev", "test"):
        from_tsv, _ = read_split("mrpc", FIXTURES / "mrpc", split)
        from_ds, _ = read_split("mrpc", tmp_path / "mrpc", split)
        assert [(e.text_a, e.text_b, e.label) for e in from_ds] == [(e.text_a, e.text_b, e.label) for e in from_tsv]
        assert [e.uid for e in from_ds] == [str(i) for i in range(len(from_ds))]
    assert all(e.label is None for e in read_split("mrpc", tmp_path / "mrpc", "test")[0])

    # a single Dataset folder (one split) reads too
    Dataset.from_dict(mrpc("dev"), features=features).save_to_disk(tmp_path / "mrpc_dev")
    assert read_split("mrpc", tmp_path / "mrpc_dev", "dev")[0] == read_split("mrpc", tmp_path / "mrpc", "dev")[0]


def test_datasets_errors_name_the_folder(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    DatasetDict({"train": Dataset.from_dict({"sentence": ["good"], "label": [1], "idx": [0]})}).save_to_disk(
        tmp_path / "d")
    with pytest.raises(GlueInputError, match=r"no split 'validation'.*train"):
        read_split("sst2", tmp_path / "d", "dev")
    with pytest.raises(GlueInputError, match=r"no column 'sentence1'"):
        read_split("rte", tmp_path / "d", "train")
    Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 2], "idx": [0, 1]}).save_to_disk(tmp_path / "bad")
    with pytest.raises(GlueInputError, match=r"bad row 1: the label 2 is not one of sst2's labels"):
        read_split("sst2", tmp_path / "bad", "train")
    swapped = Features({"sentence": Value("string"), "label": ClassLabel(names=["positive", "negative"])})
    Dataset.from_dict({"sentence": ["good"], "label": [0]}, features=swapped).save_to_disk(tmp_path / "swapped")
    with pytest.raises(GlueInputError, match="label names are positive, negative"):
        read_split("sst2", tmp_path / "swapped", "train")


# --- bad TSV input -------------------------------------------------------------------------------------------

def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_unknown_task_names_the_valid_ones():
    with pytest.raises(GlueInputError, match=r"unknown GLUE task 'squad'.*cola, sst2, mrpc"):
        read_split("squad", FIXTURES / "sst2", "train")


def test_missing_file_or_split_names_what_exists(tmp_path):
    with pytest.raises(GlueInputError, match=r"cola[/\\]test\.tsv does not exist \(it holds dev\.tsv, train\.tsv\)"):
        read_split("cola", FIXTURES / "cola", "test")
    with pytest.raises(GlueInputError, match=r"sst2 has no split 'valid'; its splits are train, dev, test"):
        read_split("sst2", FIXTURES / "sst2", "valid")
    with pytest.raises(GlueInputError, match="does not exist"):
        read_split("sst2", tmp_path / "nowhere", "train")


def test_missing_column_names_the_column_and_the_file(tmp_path):
    folder = _write(tmp_path / "rte", "train.tsv", "index\tsentence1\thypothesis\tlabel\n0\tA cat.\tAn animal.\t"
                    "entailment\n")
    with pytest.raises(GlueInputError, match=r"rte[/\\]train\.tsv has no column 'sentence2'"):
        read_split("rte", folder, "train")
    folder = _write(tmp_path / "sst2", "dev.tsv", "sentence\tgold\nnice .\t1\n")
    with pytest.raises(GlueInputError, match=r"dev\.tsv has no column 'label'"):
        read_split("sst2", folder, "dev")


def test_a_label_outside_the_set_names_file_row_value_and_labels(tmp_path):
    folder = _write(tmp_path / "sst2", "train.tsv", "sentence\tlabel\nfine .\t1\nawful .\t2\n")
    with pytest.raises(GlueInputError, match=r"train\.tsv line 3: the label '2' is not one of sst2's labels "
                                             r"\(0 \(negative\), 1 \(positive\)\)"):
        read_split("sst2", folder, "train")
    folder = _write(tmp_path / "rte", "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA cat sat.\tA cat.\tmaybe\n")
    with pytest.raises(GlueInputError, match=r"dev\.tsv line 2: the label 'maybe'.*entailment, not_entailment"):
        read_split("rte", folder, "dev")


def test_a_non_numeric_stsb_score_names_the_file(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    folder = _write(tmp_path / "stsb", "train.tsv", header + "0\tg\tf\t2012\t1\tnone\tnone\tA dog.\tA cat.\thigh\n")
    with pytest.raises(GlueInputError, match=r"stsb[/\\]train\.tsv line 2: the score 'high' is not a number"):
        read_split("stsb", folder, "train")


def test_a_repeated_example_id_is_refused_naming_both_rows(tmp_path):
    """test.tsv rows with a repeated index overwrote each other's predictions (predictions_test.json is keyed by
    the id): the second row is refused, naming both lines; a datasets split with a repeated idx likewise."""
    folder = _write(tmp_path / "sst2", "test.tsv", "index\tsentence\n0\tgood .\n1\tbad .\n0\tugly .\n")
    with pytest.raises(GlueInputError, match=r"test\.tsv line 4: the example id '0' repeats .*test\.tsv line 2"):
        read_split("sst2", folder, "test")
    from datasets import Dataset

    Dataset.from_dict({"sentence": ["a .", "b ."], "label": [0, 1], "idx": [7, 7]}).save_to_disk(tmp_path / "hf")
    with pytest.raises(GlueInputError, match=r"row 1: the example id '7' repeats .*row 0"):
        read_split("sst2", tmp_path / "hf", "train")


def test_white_space_only_sentences_are_left_out_and_counted(tmp_path):
    folder = _write(tmp_path / "rte", "train.tsv", "index\tsentence1\tsentence2\tlabel\n"
                    "0\tA cat sat.\t   \tentailment\n1\t \tA dog.\tnot_entailment\n2\tA cat sat.\tA cat.\tentailment\n")
    examples, report = read_split("rte", folder, "train")
    assert (report.rows, report.examples, report.empty) == (3, 1, 2)
    assert examples == [GlueExample("2", "A cat sat.", "A cat.", 0)]


def test_a_row_with_the_wrong_number_of_fields_and_a_non_utf8_file(tmp_path):
    folder = _write(tmp_path / "sst2", "train.tsv", "sentence\tlabel\ngood\tfilm .\t1\n")
    with pytest.raises(GlueInputError, match=r"train\.tsv line 2 has 3 tab-separated fields, expected 2"):
        read_split("sst2", folder, "train")
    (folder / "dev.tsv").write_bytes(b"sentence\tlabel\ncaf\xe9 .\t1\n")
    with pytest.raises(GlueInputError, match=r"dev\.tsv is not UTF-8"):
        read_split("sst2", folder, "dev")


# --- features ------------------------------------------------------------------------------------------------

def test_features_of_a_hand_checked_pair(wp):
    examples = [GlueExample("a", "The cat sat.", "A dog ran!", 1), GlueExample("b", "Hello", "world", None)]
    report = InputReport()
    f = featurize(examples, wp, 32, report)
    words = [wp.words[i] for i in f.input_ids]
    assert words == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "dog", "ran", "!", "[SEP]",
                     "[CLS]", "hello", "[SEP]", "world", "[SEP]"]
    assert f.token_type_ids.tolist() == [0] * 6 + [1] * 5 + [0] * 3 + [1] * 2
    expected = [wp.ids["[CLS]"], *wp.encode(["The cat sat."])[0], wp.ids["[SEP]"], *wp.encode(["A dog ran!"])[0],
                wp.ids["[SEP]"]]
    assert f.input_ids[:11].tolist() == expected
    assert f.lengths.tolist() == [11, 5] and f.starts.tolist() == [0, 11] and len(f) == 2
    assert f.input_ids.dtype == f.token_type_ids.dtype == f.lengths.dtype == np.int64
    assert f.labels.dtype == np.int64 and f.labels.tolist() == [1, -100]
    assert f.uids == ["a", "b"] and report.truncated == 0


def test_single_sentences_and_regression_labels(wp):
    examples, _ = read_split("sst2", FIXTURES / "sst2", "dev")
    f = featurize(examples, wp, 128)
    assert len(f) == 8 and not f.token_type_ids.any()
    for i, e in enumerate(examples):
        row = f.input_ids[f.starts[i]:f.starts[i] + f.lengths[i]].tolist()
        assert row == [wp.ids["[CLS]"], *wp.encode([e.text_a])[0], wp.ids["[SEP]"]]
    assert f.labels.tolist() == [e.label for e in examples]
    assert len(set(f.lengths.tolist())) > 3  # varied lengths: packing has something to do
    stsb, _ = read_split("stsb", FIXTURES / "stsb", "dev")
    g = featurize(stsb + [GlueExample("x", "A.", "B.", None)], wp, 128)
    assert g.labels.dtype == np.float32 and g.labels[1] == pytest.approx(4.75) and math.isnan(g.labels[-1])
    unlabeled = featurize([GlueExample("x", "A.", "B.", None)], wp, 16, regression=True)
    assert unlabeled.labels.dtype == np.float32 and math.isnan(unlabeled.labels[0])


def test_truncation_cuts_the_longer_text_first_and_is_counted(wp):
    long = "one two three four five six seven eight nine ten"      # 10 tokens
    short = "red green blue"                                        # 3 tokens
    a_ids, b_ids = wp.encode([long])[0], wp.encode([short])[0]
    assert (len(a_ids), len(b_ids)) == (10, 3)
    report = InputReport()
    f = featurize([GlueExample("0", long, short, 0), GlueExample("1", short, long, 1),
                   GlueExample("2", short, short, 0)], wp, 10, report)
    cls, sep = wp.ids["[CLS]"], wp.ids["[SEP]"]
    assert f.lengths.tolist() == [10, 10, 9] and (f.lengths <= 10).all()
    assert f.input_ids[:10].tolist() == [cls, *a_ids[:4], sep, *b_ids, sep]   # a cut 10 -> 4, b kept
    assert f.input_ids[10:20].tolist() == [cls, *b_ids, sep, *a_ids[:4], sep]  # b cut, a kept
    assert f.token_type_ids[10:20].tolist() == [0] * 5 + [1] * 5
    assert report.truncated == 2
    both = featurize([GlueExample("0", long, long, 0)], wp, 10)                # 10 + 10 -> 4 + 3 (ties: b)
    assert both.input_ids.tolist() == [cls, *a_ids[:4], sep, *a_ids[:3], sep]
    single = InputReport()
    s = featurize([GlueExample("0", long, None, 0)], wp, 6, single)
    assert s.input_ids.tolist() == [cls, *a_ids[:4], sep] and single.truncated == 1
    with pytest.raises(GlueInputError, match="max_seq_length is 4"):
        featurize([GlueExample("0", long, short, 0)], wp, 4)


def test_truncated_lengths_equal_the_one_token_at_a_time_loop():
    def loop(a, b, budget):
        while a + b > budget:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b

    la, lb = np.meshgrid(np.arange(0, 30), np.arange(0, 30))
    la, lb = la.ravel(), lb.ravel()
    for budget in (1, 2, 5, 7, 20, 61):
        a, b = _truncated_lengths(la, lb, budget)
        assert list(zip(a.tolist(), b.tolist())) == [loop(x, y, budget) for x, y in zip(la.tolist(), lb.tolist())]


# --- metrics -------------------------------------------------------------------------------------------------

def test_accuracy_and_f1_by_hand():
    assert metrics.compute("sst2", np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])) == {"accuracy": 0.75}
    # TP = 2 (rows 0, 1), FP = 1 (row 3), FN = 1 (row 2): precision = recall = 2/3, F1 = 2/3; accuracy 4/6
    out = metrics.compute("mrpc", np.array([1, 1, 0, 1, 0, 0]), np.array([1, 1, 1, 0, 0, 0]))
    assert set(out) == {"accuracy", "f1"}
    assert out["accuracy"] == pytest.approx(4 / 6) and out["f1"] == pytest.approx(2 / 3)
    # TP = 1, FP = 0, FN = 2: precision 1, recall 1/3, F1 = 2 * 1/3 / (4/3) = 1/2
    assert metrics.compute("qqp", [1, 0, 0, 0], [1, 1, 1, 0])["f1"] == pytest.approx(0.5)
    assert metrics.compute("mnli", [0, 1, 2, 2, 1], [0, 1, 2, 0, 0]) == {"accuracy": pytest.approx(0.6)}


def test_matthews_correlation_of_a_2x2_confusion_by_hand():
    # TP = 3, TN = 2, FP = 1, FN = 1: (3*2 - 1*1) / sqrt((3+1)(3+1)(2+1)(2+1)) = 5/12
    labels = np.array([1, 1, 1, 1, 0, 0, 0])
    predictions = np.array([1, 1, 1, 0, 0, 0, 1])
    out = metrics.compute("cola", predictions, labels)
    assert set(out) == {"matthews_correlation"} and out["matthews_correlation"] == pytest.approx(5 / 12)
    assert metrics.compute("cola", 1 - labels, labels)["matthews_correlation"] == pytest.approx(-1.0)


def test_pearson_and_spearman():
    x = np.array([0.0, 1.0, 2.0, 3.5, 4.0])
    linear = metrics.compute("stsb", 2 * x + 1, x)
    assert set(linear) == {"pearson", "spearman"} and linear["pearson"] == pytest.approx(1.0)
    monotonic = metrics.compute("stsb", np.exp(3 * x), x)  # monotonic, far from linear
    assert monotonic["spearman"] == pytest.approx(1.0) and monotonic["pearson"] < 0.95
    assert metrics.compute("stsb", -x, x)["spearman"] == pytest.approx(-1.0)


def test_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="3 predictions for 4 labels"):
        metrics.compute("sst2", np.array([1, 0, 1]), np.array([1, 0, 0, 1]))
    with pytest.raises(ValueError, match="no predictions"):
        metrics.compute("sst2", np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="no label"):
        metrics.compute("rte", np.array([1, 0]), np.array([1, -100]))
    with pytest.raises(ValueError, match="NaN"):
        metrics.compute("stsb", np.array([1.0, 2.0]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="no label"):  # STS-B labels featurized without regression=True
        metrics.compute("stsb", np.array([1.0, 2.0]), np.array([1, -100]))
    with pytest.raises(ValueError, match="unknown GLUE task"):
        metrics.compute("squad", np.array([1]), np.array([1]))
