"""GLUE's metrics against values computed by hand, the GLUE average, and the generated ``glue_tiny``
data: read back by the GLUE reader, reproducible, labelled by its stated rules, not solvable by length."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter, defaultdict

import numpy as np
import pytest

from tasks.glue import generate
from tasks.glue.formats import SPECS, read_split
from tasks.glue.metrics import AVERAGE_TERMS, glue_average, task_metrics

# A 2x2 confusion matrix: TP 3, TN 2, FP 1, FN 2.
LABELS = np.array([1, 1, 1, 1, 1, 0, 0, 0])
PREDICTIONS = np.array([1, 1, 1, 0, 0, 0, 0, 1])


def test_matthews_accuracy_and_f1_are_the_formulas_on_a_confusion_matrix():
    tp, tn, fp, fn = 3, 2, 1, 2
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert task_metrics(SPECS["cola"], PREDICTIONS, LABELS) == {"matthews": pytest.approx(mcc)}
    found = task_metrics(SPECS["mrpc"], PREDICTIONS, LABELS)
    assert found == {"accuracy": pytest.approx(5 / 8), "f1": pytest.approx(2 * tp / (2 * tp + fp + fn))}
    assert task_metrics(SPECS["qqp"], 1 - PREDICTIONS, LABELS)["accuracy"] == pytest.approx(3 / 8)
    assert set(task_metrics(SPECS["mnli"], np.array([0, 1, 2]), np.array([0, 2, 2]))) == {"accuracy"}
    assert task_metrics(SPECS["mnli"], np.array([0, 1, 2]), np.array([0, 2, 2]))["accuracy"] == pytest.approx(
        2 / 3
    )


def test_correlations_are_pearsons_formula_and_spearmans_ranks():
    scores, gold = np.array([0.5, 1.0, 2.0, 4.0, 4.5]), np.array([0.0, 1.2, 1.4, 3.0, 5.0])
    centred_s, centred_g = scores - scores.mean(), gold - gold.mean()
    pearson = (centred_s @ centred_g) / math.sqrt((centred_s @ centred_s) * (centred_g @ centred_g))
    found = task_metrics(SPECS["stsb"], scores, gold)
    assert found == {"pearson": pytest.approx(pearson), "spearman": pytest.approx(1.0)}  # same order
    swapped = task_metrics(SPECS["stsb"], scores[[1, 0, 2, 3, 4]], gold)["spearman"]
    assert swapped == pytest.approx(1 - 6 * 2 / (5 * 24))  # 1 - 6 Σd² / (n (n² - 1)), one swap: Σd² = 2


def test_a_constant_prediction_scores_zero_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert task_metrics(SPECS["cola"], np.zeros(8, int), LABELS) == {"matthews": 0.0}
        assert task_metrics(SPECS["stsb"], np.full(5, 2.5), np.arange(5.0)) == {
            "pearson": 0.0,
            "spearman": 0.0,
        }
        assert task_metrics(SPECS["mrpc"], np.zeros(8, int), LABELS) == {"accuracy": 3 / 8, "f1": 0.0}


def test_predictions_and_labels_of_another_shape_are_refused():
    with pytest.raises(ValueError, match="equal"):
        task_metrics(SPECS["rte"], np.zeros(3), np.zeros(4))


def test_glue_average_is_the_mean_of_the_terms_present_and_lists_the_missing():
    results = {task: {metric: 0.5 + i / 100} for i, (task, metric) in enumerate(AVERAGE_TERMS)}
    results["mnli"] = {"accuracy": 0.51, "accuracy_mm": 0.52}
    average, missing = glue_average(results)
    assert average == pytest.approx(np.mean([0.5 + i / 100 for i in range(9)])) and missing == []
    with_wnli = glue_average({**results, "wnli": {"accuracy": 0.0}})
    assert with_wnli == (average, [])  # WNLI is not a term
    partial = {"cola": {"matthews": 0.2}, "rte": {"accuracy": 0.6}, "mrpc": {"accuracy": 0.9}}
    average, missing = glue_average(partial)
    assert average == pytest.approx(0.4) and "mrpc/f1" in missing and len(missing) == 7
    assert glue_average({}) == (None, [f"{t}/{m}" for t, m in AVERAGE_TERMS])


# -- glue_tiny ---------------------------------------------------------------------------------

SMALL = generate.GlueTinySpec(seed=0, corpus_docs=100, sst2_train=400, rte_train=400, dev=100, test=60)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The default task sizes (2,000 train, 400 dev) with a small corpus: baselines need the size."""
    return generate.ensure_glue_tiny(
        tmp_path_factory.mktemp("glue_tiny"), generate.GlueTinySpec(corpus_docs=200)
    )


def test_generated_files_are_read_back_by_the_glue_reader_with_balanced_labels(tmp_path):
    root = generate.ensure_glue_tiny(tmp_path, SMALL)
    for task, train in (("sst2", SMALL.sst2_train), ("rte", SMALL.rte_train)):
        parts = {split: read_split(root, SPECS[task], split) for split in ("train", "dev", "test")}
        assert [len(p.texts) for p in parts.values()] == [train, SMALL.dev, SMALL.test]
        assert np.bincount(parts["train"].labels).tolist() == [train // 2] * 2
        assert (
            np.bincount(parts["dev"].labels).tolist() == [SMALL.dev // 2] * 2 and parts["test"].labels is None
        )
        seen = [set(p.texts) for p in parts.values()]
        assert sum(map(len, seen)) == train + SMALL.dev + SMALL.test  # no example twice, in or across splits
    import pyarrow.parquet as pq

    corpus = {
        s: pq.read_table(root / "corpus" / f"{s}-00000-of-00001.parquet") for s in ("train", "validation")
    }
    assert corpus["train"].column_names == ["text"] and corpus["train"].num_rows == 100
    assert corpus["validation"].num_rows == 10
    docs = corpus["train"].column("text").to_pylist()
    assert all(3 <= doc.count(" .") <= 7 for doc in docs)  # 3 to 6 sentences, a last one restated
    task_words = {w for t in parts["train"].texts for s in t for w in s.split()}
    assert task_words <= {w for doc in docs for w in doc.split()}  # the corpus has the tasks' words


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_ones(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        generate.write_glue_tiny(tmp_path / name, generate.GlueTinySpec(**{**vars(SMALL), "seed": seed}))
    for file in generate.FILES:
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
        same_language = file == "vocab.txt"  # the vocabulary is the language's, not the seed's
        assert ((tmp_path / "a" / file).read_bytes() == (tmp_path / "c" / file).read_bytes()) == same_language


def test_the_vocabulary_keeps_every_word_whole_and_reads_as_bert_vocab(tmp_path):
    from tasks.mlm.wordpiece import load_bert_vocab

    root = generate.ensure_glue_tiny(tmp_path / "g", SMALL)
    tok = load_bert_vocab(root)
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    import pyarrow.parquet as pq

    corpus = " ".join(
        pq.read_table(root / "corpus" / "train-00000-of-00001.parquet").column("text").to_pylist()
    )
    ids = tok.encode_batch([corpus])[0]
    assert len(ids) == len(corpus.split()) and tok.unk_id not in ids  # one token per word, none unknown
    assert tok.encode_batch(["zebra"])[0] != [tok.unk_id]  # an unknown word is spelt in letters


def test_ensure_writes_once_per_spec_and_the_command_line_writes_too(tmp_path):
    root = generate.ensure_glue_tiny(tmp_path / "g", SMALL)
    marker = json.loads((root / "generator.json").read_text())
    assert {k: marker[k] for k in vars(SMALL)} == vars(SMALL)
    before = (root / "glue_data" / "RTE" / "train.tsv").stat().st_mtime_ns
    generate.ensure_glue_tiny(root, SMALL)
    assert (root / "glue_data" / "RTE" / "train.tsv").stat().st_mtime_ns == before
    generate.main([str(tmp_path / "cli"), "--seed", "3", "--corpus-docs", "20", "--sst2-train", "40"])
    assert json.loads((tmp_path / "cli" / "generator.json").read_text())["seed"] == 3
    assert len(read_split(tmp_path / "cli", SPECS["sst2"], "train").texts) == 40


def sst2_rule(sentence: str) -> int:
    """SST-2's rule, from the words: more positive than negative adjectives, flipped by ``not``."""
    words = sentence.split()
    balance = sum(w in generate.POSITIVE for w in words) - sum(w in generate.NEGATIVE for w in words)
    return int((balance > 0) != ("not" in words))


def rte_rule(premise: str, hypothesis: str) -> str:
    """RTE's rule, from the words: the hypothesis restates the premise's clause with an adverb
    (``always`` or ``never``), and entails iff it is the premise's."""
    adverbs = [[w for w in text.split() if w in ("always", "never")] for text in (premise, hypothesis)]
    assert all(len(found) == 1 for found in adverbs), adverbs
    return "entailment" if adverbs[0] == adverbs[1] else "not_entailment"


def test_the_labels_follow_the_stated_rules(tiny):
    for split in ("train", "dev"):
        sst2, rte = (read_split(tiny, SPECS[t], split) for t in ("sst2", "rte"))
        assert [sst2_rule(s) for (s,) in sst2.texts] == sst2.labels.tolist()
        assert [rte_rule(p, h) for p, h in rte.texts] == [SPECS["rte"].labels[i] for i in rte.labels]


def fit_score(task: str, tiny, features) -> float:
    """Dev accuracy of a logistic regression on bags of ``features(texts)`` fitted on train."""
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    train, dev = (read_split(tiny, SPECS[task], s) for s in ("train", "dev"))
    vectorizer = DictVectorizer()
    x = vectorizer.fit_transform([features(t) for t in train.texts])
    model = LogisticRegression(max_iter=2000).fit(x, train.labels)
    predicted = model.predict(vectorizer.transform([features(t) for t in dev.texts]))
    return task_metrics(SPECS[task], predicted, dev.labels)["accuracy"]


def length_score(task: str, tiny) -> float:
    """Dev accuracy of the majority label of each (word count of each text) seen in train."""
    train, dev = (read_split(tiny, SPECS[task], s) for s in ("train", "dev"))
    votes: dict[tuple, Counter] = defaultdict(Counter)
    for texts, label in zip(train.texts, train.labels, strict=True):
        votes[tuple(len(t.split()) for t in texts)][label] += 1
    lengths = [tuple(len(t.split()) for t in texts) for texts in dev.texts]
    predicted = np.array([votes[k].most_common(1)[0][0] if votes[k] else 0 for k in lengths])
    return task_metrics(SPECS[task], predicted, dev.labels)["accuracy"]


def test_length_says_little_and_a_bag_of_words_falls_short_of_the_rules(tiny):
    assert length_score("sst2", tiny) <= 0.6 and length_score("rte", tiny) <= 0.6
    words = fit_score("sst2", tiny, lambda texts: Counter(texts[0].split()))
    assert 0.65 <= words <= 0.85  # the adjectives' balance (75%), not the negation's flip
    sides = fit_score("rte", tiny, lambda t: Counter(t[0].split()) + Counter("h_" + w for w in t[1].split()))
    assert 0.65 <= sides <= 0.85  # the hypothesis's adverb (75%), not its agreement with the premise's
