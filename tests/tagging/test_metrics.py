"""Tagging metrics: hand-computed cases, parity with seqeval's strict mode, POS accuracy, file scoring."""
import numpy as np
import pytest
from seqeval.metrics import classification_report
from seqeval.scheme import IOB2, IOBES

from posbias.errors import DataError
from posbias.tagging.metrics import entities, score, score_files, sentence_ratios, tag_scores

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
