"""Tagging metrics: hand-computed cases, parity with seqeval's strict mode and with its default (lenient)
mode, POS accuracy, file scoring."""
import warnings

import numpy as np
import pytest
from seqeval.metrics import classification_report
from seqeval.scheme import IOB2, IOBES

from posbias.errors import DataError
from posbias.tagging.metrics import (entities, lenient_chunks, lenient_scores, score, score_files, sentence_ratios,
                                     seqeval_subtoken_f1, tag_scores)

GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "O", "B-PER"]]
PRED = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "I-ORG", "I-ORG", "O", "B-PER"]]


def test_hand_computed_ner_case():
    """Gold: PER, LOC / ORG, PER (4). Predicted: PER, ORG / (I-ORG I-ORG: no entity in strict IOB2), PER (3).
    Right: the two PER. P = 2/3, R = 2/4."""
    res = score(GOLD, PRED, "iob2")
    assert res["predicted_entities"] == 3 and res["entities"] == 4
    assert res["precision"] == pytest.approx(200 / 3) and res["recall"] == pytest.approx(50.0)
    assert res["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5) * 100)
    assert res["per_class"]["PER"]["f1"] == pytest.approx(100.0) and res["per_class"]["ORG"]["f1"] == 0.0
    assert res["per_class"]["LOC"]["support"] == 1


def test_strict_mode_is_not_conlleval():
    """The lenient (conlleval / seqeval default) reading turns I-ORG I-ORG after O into an entity;
    strict IOB2 does not."""
    from seqeval.metrics import f1_score

    assert entities([PRED[1]], "iob2") == [[("PER", 4, 5)]]
    assert f1_score(GOLD, PRED) > score(GOLD, PRED, "iob2")["f1"] / 100


def random_valid(rng, n, scheme, types=("PER", "LOC", "ORG")):
    """A well-formed tag sequence of length n in `scheme`."""
    out, i = [], 0
    while i < n:
        if rng.random() < 0.5:
            out.append("O")
            i += 1
            continue
        t, k = str(rng.choice(types)), int(min(rng.integers(1, 4), n - i))
        if scheme == "iob2":
            out += [f"B-{t}"] + [f"I-{t}"] * (k - 1)
        else:
            out += [f"S-{t}"] if k == 1 else [f"B-{t}"] + [f"I-{t}"] * (k - 2) + [f"E-{t}"]
        i += k
    return out


@pytest.mark.parametrize("scheme, cls", [("iob2", IOB2), ("bioes", IOBES)])
def test_equals_seqeval_strict_on_random_sequences(scheme, cls):
    rng = np.random.default_rng(0)
    tags = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC", "ORG") for p in ("BI" if scheme == "iob2" else "BIES")]
    gold = [random_valid(rng, int(rng.integers(1, 15)), scheme) for _ in range(300)]
    # Predictions: mostly right, some random tags (so some predicted sequences are ill formed).
    pred = [[g if rng.random() < 0.7 else str(rng.choice(tags)) for g in s] for s in gold]
    ours = score(gold, pred, scheme)
    ref = classification_report(gold, pred, mode="strict", scheme=cls, output_dict=True, zero_division=0)
    assert 0 < ours["f1"] < 100
    assert ours["f1"] == pytest.approx(100 * ref["micro avg"]["f1-score"])
    assert ours["precision"] == pytest.approx(100 * ref["micro avg"]["precision"])
    assert ours["recall"] == pytest.approx(100 * ref["micro avg"]["recall"])
    for t, row in ours["per_class"].items():
        if t in ref:
            assert row["f1"] == pytest.approx(100 * ref[t]["f1-score"]) and row["support"] == ref[t]["support"]


def _seqeval_lenient(gold, pred) -> dict:
    """seqeval's own default mode (mode=None, scheme=None), micro avg, in points."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "X seems not to be NE tag" for the odd labels below
        r = classification_report(gold, pred, mode=None, scheme=None, output_dict=True, zero_division=0)["micro avg"]
    return {"precision": 100 * r["precision"], "recall": 100 * r["recall"], "f1": 100 * r["f1-score"]}


def test_lenient_mode_by_hand():
    """conlleval's repairs, as seqeval's default mode reads them: `S-X S-X` two chunks, `I-X` after `O`
    starts one, `B-X B-X` two, a lone `E-X` one, `B-X I-Y` two (the type changes)."""
    gold = [["S-PER", "S-PER", "O", "I-LOC", "I-LOC"], ["B-ORG", "B-ORG", "O", "E-PER"], ["B-X", "I-Y"]]
    assert lenient_chunks(gold).as_set() == {("PER", 0, 0), ("PER", 1, 1), ("LOC", 3, 4), ("ORG", 6, 6),
                                             ("ORG", 7, 7), ("PER", 9, 9), ("X", 11, 11), ("Y", 12, 12)}
    # The model predicts one chunk over the two-piece word (B-PER E-PER) and the rest right: 7 of 8.
    pred = [["B-PER", "E-PER", "O", "I-LOC", "I-LOC"], ["B-ORG", "B-ORG", "O", "E-PER"], ["B-X", "I-Y"]]
    res = lenient_scores(gold, pred)
    assert (res["entities"], res["predicted_entities"]) == (8, 7)
    assert res["f1"] == pytest.approx(100 * 2 * 6 / 15) == pytest.approx(_seqeval_lenient(gold, pred)["f1"])
    assert seqeval_subtoken_f1(gold, pred, "bioes") == res["f1"]
    # Strict IOB2 reads none of the I- runs after O: lenient is not strict.
    assert score([["O", "I-LOC", "I-LOC"]], [["O", "I-LOC", "I-LOC"]], "iob2")["entities"] == 0
    assert lenient_scores([["O", "I-LOC", "I-LOC"]], [["O", "I-LOC", "I-LOC"]])["f1"] == 100.0


LENIENT_LABELS = ["O", "O", "O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-MISC",
                  "I-MISC", "B", "I", "S", "E", ".-PER", "X-PER", "B-A-B"]


@pytest.mark.parametrize("seed", range(4))
def test_lenient_scores_equal_seqeval_default_mode_on_random_sequences(seed):
    """Random, mostly ill-formed label sequences (S-X S-X, I-X after O, B-X B-X, E-X alone, types
    changing inside a chunk, bare prefixes, labels seqeval warns about), empty sentences included:
    chunks equal seqeval's `get_entities`, P/R/F1 its classification_report(mode=None) micro avg."""
    from seqeval.metrics.sequence_labeling import get_entities

    rng = np.random.default_rng(seed)
    for _ in range(150):
        gold = [[LENIENT_LABELS[i] for i in rng.integers(0, len(LENIENT_LABELS), n)]
                for n in rng.integers(0, 9, rng.integers(1, 7))]
        # predictions: the gold with some labels replaced, so that chunks match as well as miss
        pred = [[LENIENT_LABELS[rng.integers(len(LENIENT_LABELS))] if rng.random() < 0.3 else t for t in s]
                for s in gold]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert lenient_chunks(gold).as_set() == set(get_entities(gold))
        ours, theirs = lenient_scores(gold, pred), _seqeval_lenient(gold, pred)
        for key in ("precision", "recall", "f1"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-12, abs=1e-9)
    with pytest.raises(ValueError, match="differ"):
        lenient_scores([["O", "S-X"]], [["O"]])


def test_pos_accuracy_and_per_tag_scores():
    gold = [["DET", "NOUN", "VERB"], ["PRON", "VERB"]]
    pred = [["DET", "NOUN", "NOUN"], ["PRON", "VERB"]]
    res = tag_scores(gold, pred)
    assert res["accuracy"] == pytest.approx(80.0) and res["words"] == 5
    assert res["per_class"]["VERB"]["recall"] == pytest.approx(50.0)
    assert res["per_class"]["NOUN"]["precision"] == pytest.approx(50.0)
    assert res["macro_f1"] == pytest.approx(np.mean([100, 2 * 0.5 / 1.5 * 100, 100, 2 * 0.5 / 1.5 * 100]))


@pytest.mark.parametrize("scheme, gold, pred", [("iob2", GOLD, PRED),
                                                ("none", [["A", "B"], ["C"]], [["A", "C"], ["C"]])])
def test_sentence_ratios_sum_to_the_corpus_metric(scheme, gold, pred):
    ratios = np.array(sentence_ratios(gold, pred, scheme), dtype=float)
    main = score(gold, pred, scheme)["f1" if scheme != "none" else "accuracy"]
    assert 100 * ratios[:, 0].sum() / ratios[:, 1].sum() == pytest.approx(main)


def write(path, sents):
    path.write_text("\n\n".join("\n".join(" ".join(cols) for cols in s) for s in sents) + "\n", encoding="utf-8")
    return path


def test_score_files(tmp_path):
    words = [["John", "lives", "in", "Paris"], ["Hi"]]
    gold = write(tmp_path / "gold.conll", [[(w, t) for w, t in zip(ws, ts)]
                                           for ws, ts in zip(words, [["B-PER", "O", "O", "B-LOC"], ["O"]])])
    pred = write(tmp_path / "pred.conll", [[(w, "x", t) for w, t in zip(ws, ts)]
                                           for ws, ts in zip(words, [["B-PER", "O", "O", "O"], ["O"]])])
    res = score_files(gold, pred)
    assert res["f1"] == pytest.approx(2 * 1 * 0.5 / 1.5 * 100) and res["scheme"] == "iob2"
    bad = write(tmp_path / "bad.conll", [[("John", "B-PER"), ("lives", "O"), ("at", "O"), ("Paris", "O")], [("Hi", "O")]])
    with pytest.raises(DataError, match=r"bad\.conll.*line 3.*'at'.*'in'"):
        score_files(gold, bad)
    short = write(tmp_path / "short.conll", [[("John", "B-PER")]])
    with pytest.raises(DataError, match="1 sentences"):
        score_files(gold, short)
    junk = write(tmp_path / "junk.conll", [[("John", "Q-PER"), ("lives", "O"), ("in", "O"), ("Paris", "O")], [("Hi", "O")]])
    with pytest.raises(DataError, match=r"junk\.conll.*line 1.*Q-PER"):
        score_files(gold, junk)
