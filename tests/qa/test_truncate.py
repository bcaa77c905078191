"""Train-short / test-long data sets: truncation, answers cut off, splits, statistics, CLI."""
import json
import subprocess
import sys
from pathlib import Path

from posbias.qa.examples import Answer, QAExample
from posbias.qa.readers import read_qa
from posbias.qa.truncate import (count_words, split_halves, statistics, truncate_example, truncate_fixed,
                                   truncate_range, word_spans)

from helpers import DEMO_DEV

CTX = "Alpha beta, gamma delta. Epsilon zeta eta theta."


def ex(answers, qid="q", title="T"):
    return QAExample(qid, "Which word?", CTX, answers=answers, title=title)


def test_words_are_counted_without_downloads():
    assert count_words("Hello, world! It's 3.5 km.") == 12  # Hello , world ! It ' s 3 . 5 km .
    assert word_spans("ab  cd")[1] == (4, 6)


def test_truncation_keeps_fitting_answers_only():
    e = ex([Answer("gamma", 12), Answer("theta", 43)])
    t = truncate_example(e, 4)  # "Alpha beta , gamma"
    assert t.context == "Alpha beta, gamma" and [a.text for a in t.answers] == ["gamma"]
    assert not t.is_impossible and t.meta["original_context_words"] == 11
    gone = truncate_example(ex([Answer("theta", 43)]), 4)
    assert gone.is_impossible and gone.answers == [] and gone.gold_texts() == []
    assert truncate_example(e, 50) is e  # short enough already
    for a in t.answers:
        assert t.context[a.start:a.end] == a.text


def test_fixed_and_range_truncation_and_unanswerable_handling():
    examples = read_qa(DEMO_DEV).examples
    d50 = truncate_fixed(examples, 50, keep_unanswerable=True)
    assert len(d50) == len(examples) and all(count_words(e.context) <= 50 for e in d50)
    dropped = truncate_fixed(examples, 50, keep_unanswerable=False)
    assert len(dropped) == sum(not e.is_impossible for e in d50) < len(examples)
    r1 = truncate_range(examples, 30, 120, seed=1, keep_unanswerable=True)
    r2 = truncate_range(examples, 30, 120, seed=1, keep_unanswerable=True)
    assert [e.context for e in r1] == [e.context for e in r2]  # seeded
    lengths = [count_words(e.context) for e in r1]
    assert min(lengths) <= 40 and max(lengths) <= 120 and len(set(lengths)) > 30


def test_split_halves():
    examples = [ex([Answer("gamma", 12)], qid=f"q{i}", title=f"t{i % 5}") for i in range(101)]
    val, test = split_halves(examples, seed=3)
    assert len(val) == 50 and len(test) == 51 and not {e.id for e in val} & {e.id for e in test}
    val, test = split_halves(examples, seed=3, by_article=True)
    assert not {e.title for e in val} & {e.title for e in test} and len(val) + len(test) == 101


def test_statistics():
    none = QAExample("n", "Which word?", CTX, is_impossible=True)
    s = statistics([ex([Answer("gamma", 12)]), none])
    assert s == {"instances": 2, "answerable": 1, "avg_question_words": 3.0, "avg_context_words": 11.0}


def test_cli_build_writes_readable_squad_and_stats(tmp_path):
    out = tmp_path / "d"
    r = subprocess.run([str(Path(sys.executable).parent / "posbias"), "data", "build", "--input", DEMO_DEV,
                        "--out", str(out), "--truncate-range", "40", "150", "--split", "--seed", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "D_40~150" in r.stdout
    val, test = read_qa(out / "val.json"), read_qa(out / "test.json")  # offsets re-validated on read
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    # Equal halves before truncation; the instances it leaves unanswerable then go from each (so the
    # written halves may differ in size, as Table 9's D_800 4,924 / 4,925).
    assert abs(stats["before_filtering"]["val"] - stats["before_filtering"]["test"]) <= 1
    assert stats["before_filtering"]["val"] + stats["before_filtering"]["test"] == stats["read"]
    assert not val.has_impossible  # unanswerable instances are dropped from evaluation sets
    assert stats["splits"]["val"]["instances"] == len(val.examples) < stats["before_filtering"]["val"]


def test_sample_keeps_a_seeded_ordered_subset_per_part(tmp_path):
    from posbias.qa.truncate import build_dataset, sample_examples

    exs = [ex([Answer("beta", 6)], qid=f"q{i}") for i in range(10)]
    a, b = sample_examples(exs, 4, seed=3), sample_examples(exs, 4, seed=3)
    assert [e.id for e in a] == [e.id for e in b] and len(a) == 4
    assert [e.id for e in a] == sorted((e.id for e in a), key=lambda q: int(q[1:]))  # file order kept
    assert sample_examples(exs, 50, seed=3) == exs
    stats = build_dataset([DEMO_DEV], tmp_path / "s", split=True, seed=4, sample=30)
    val, test = read_qa(tmp_path / "s" / "val.json"), read_qa(tmp_path / "s" / "test.json")
    assert len(val.examples) == len(test.examples) == 30
    assert not {e.id for e in val.examples} & {e.id for e in test.examples}  # halves stay disjoint
    assert stats["available"]["val"] > 30 and stats["sample"] == 30


def test_split_comes_before_truncation(tmp_path):
    """§4.1 splits the dev set in halves, then truncates: D_L and D_{L1~L2} built from one file with
    one seed share their halves (before filtering), whatever the lengths."""
    from posbias.qa.truncate import build_dataset

    def halves(folder, **kw):
        stats = build_dataset([DEMO_DEV], tmp_path / folder, split=True, seed=7, **kw)
        ids = {part: [e.id for e in read_qa(tmp_path / folder / f"{part}.json").examples] for part in ("val", "test")}
        return stats, ids

    _, original = halves("original")
    for name, kw in (("d30", {"truncate": 30}), ("d120", {"truncate": 120}),
                     ("d20_80", {"truncate_range": (20, 80)})):
        stats, kept = halves(f"{name}_kept", keep_unanswerable=True, **kw)
        assert kept == original, name  # identical question-id halves before filtering, in file order
        assert stats["before_filtering"] == {"val": len(original["val"]), "test": len(original["test"])}
        stats, filtered = halves(name, **kw)
        for part in ("val", "test"):  # filtering only removes instances from each half
            assert set(filtered[part]) <= set(original[part]), (name, part)
            assert stats["available"][part] == len(filtered[part])
        assert len(filtered["val"]) + len(filtered["test"]) < len(original["val"]) + len(original["test"])
    # A D_{L1~L2} instance gets the same length with or without the split.
    build_dataset([DEMO_DEV], tmp_path / "whole", truncate_range=(20, 80), seed=7, keep_unanswerable=True)
    whole = {e.id: e.context for e in read_qa(tmp_path / "whole" / "data.json").examples}
    split = {e.id: e.context for part in ("val", "test")
             for e in read_qa(tmp_path / "d20_80_kept" / f"{part}.json").examples}
    assert split == whole
