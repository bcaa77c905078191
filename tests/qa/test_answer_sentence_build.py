"""`posbias data build --answer-sentence K`: Ko et al.'s SQuAD-train^(k) sets, their stats and random control."""
import json

import pytest

from posbias.cli import main
from posbias.errors import ConfigError
from posbias.qa.examples import Answer, QAExample
from posbias.qa.readers import read_qa
from posbias.qa.sentences import answer_sentence
from posbias.qa.truncate import build_dataset, count_words, parse_answer_sentence

# Sentences (sentencex): abbreviations, decimals and initials inside them end none.
P1 = ('Dr. Smith moved to the U.S. in Jan. 1990 and paid $3.50 for a 2.5 kg bag. '  # 1
      'He left at 5 p.m. on Friday. '                                                 # 2
      'J. R. R. Tolkien later wrote about it. '                                       # 3
      '"Was it worth it?" she asked. '                                                # 4
      'It was.')                                                                      # 5
P2 = 'The price rose to $3.50. Prof. Jones disagreed. The U.S. Navy sailed at 9 a.m. sharp.'
P3 = "St. Mary's Church was built c. 1200 by Mr. Brown. Its spire, 40.5 m tall, fell in 1703! Why? Nobody knows."

# question id -> (context, answer texts in gold order, the first answer's sentence)
QUESTIONS = {
    "s1": (P1, ["Smith"], 1),
    "s1_decimal": (P1, ["2.5 kg"], 1),
    "s2": (P1, ["Friday"], 2),
    "s3": (P1, ["Tolkien"], 3),
    "s5": (P1, ["It was"], 5),
    "first_answer": (P1, ["Friday", "Smith"], 2),  # the first gold answer decides, not the earliest
    "p2_s2": (P2, ["Jones"], 2),
    "p2_s3": (P2, ["Navy"], 3),
    "p3_s1": (P3, ["Mr. Brown"], 1),  # a split on ". " would say sentence 3 (after "St." and "c.")
    "p3_s4": (P3, ["Nobody"], 4),
}
AMBIGUOUS = "ambiguous_s1"  # in sentence 1 but flagged answer_start_ambiguous: excluded by the filter


def squad_file(path, unanswerable=False):
    paragraphs = {}
    for qid, (ctx, texts, _) in QUESTIONS.items():
        qa = {"id": qid, "question": f"Question {qid}?",
              "answers": [{"text": t, "answer_start": ctx.index(t)} for t in texts]}
        paragraphs.setdefault(ctx, []).append(qa)
    paragraphs[P1].append({"id": AMBIGUOUS, "question": "Where?", "answer_start_ambiguous": True,
                           "answers": [{"text": "U.S.", "answer_start": P1.index("U.S.")}]})
    if unanswerable:
        paragraphs[P2].append({"id": "none", "question": "Why?", "answers": [], "is_impossible": True})
    data = {"version": "v2.0" if unanswerable else "1.1",
            "data": [{"title": "T", "paragraphs": [{"context": c, "qas": qs} for c, qs in paragraphs.items()]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def written(folder, name="data"):
    return [e.id for e in read_qa(folder / f"{name}.json").examples]


def expected(match):
    return sorted(q for q, (_, _, k) in QUESTIONS.items() if match(k))


@pytest.fixture
def data(tmp_path):
    return squad_file(tmp_path / "in.json")


def example(ctx, texts):
    return QAExample("q", "?", ctx, answers=[Answer(t, ctx.index(t)) for t in texts])


def test_the_fixture_sentences_are_sentencex_s():
    for qid, (ctx, texts, k) in QUESTIONS.items():
        assert answer_sentence(example(ctx, texts)) == k, qid


@pytest.mark.parametrize("spec,match", [("1", lambda k: k == 1), ("2+", lambda k: k >= 2), ("2", lambda k: k == 2),
                                        ("5", lambda k: k == 5), (3, lambda k: k == 3), ("6+", lambda k: False)])
def test_keeps_exactly_the_questions_of_sentence_k(tmp_path, data, spec, match):
    stats = build_dataset([data], tmp_path / "out", answer_sentence=spec)
    kept = written(tmp_path / "out")
    assert sorted(kept) == expected(match) and AMBIGUOUS not in kept
    assert stats["answer_sentence"] == str(spec) and stats["excluded_ambiguous"] == 1
    assert stats["exclude_ambiguous"] and stats["exclude_ambiguous_implied"]
    assert stats["answer_sentence_kept"] == {"data": {"kept": len(kept), "of": len(QUESTIONS)}}
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8"))
    assert on_disk["answer_sentence"] == str(spec) and on_disk["splits"]["data"]["instances"] == len(kept)


def test_a_naive_split_on_period_space_would_fail(tmp_path, data):
    """A rule splitting on ". " keeps a different set for K=1 and K=2+: the test above would catch it."""
    def naive(ctx, texts):
        return ctx[: ctx.index(texts[0])].count(". ") + 1

    build_dataset([data], tmp_path / "one", answer_sentence="1")
    build_dataset([data], tmp_path / "later", answer_sentence="2+")
    naive_one = sorted(q for q, (ctx, texts, _) in QUESTIONS.items() if naive(ctx, texts) == 1)
    naive_later = sorted(q for q, (ctx, texts, _) in QUESTIONS.items() if naive(ctx, texts) >= 2)
    assert "p3_s1" not in naive_one and "p3_s1" in written(tmp_path / "one")
    assert sorted(written(tmp_path / "one")) != naive_one
    assert sorted(written(tmp_path / "later")) != naive_later


def test_stats_give_the_distribution_of_every_build(tmp_path, data):
    stats = build_dataset([data], tmp_path / "all")  # no filter, no exclusion: existing behaviour
    assert AMBIGUOUS in written(tmp_path / "all") and stats["answer_sentence"] is None
    assert stats["answer_sentence_kept"] is None and not stats["exclude_ambiguous"]
    dist = stats["splits"]["data"]["answer_sentences"]
    assert list(dist) == ["1", "2", "3", "4", "5+", "no answer"]
    assert {b: d["count"] for b, d in dist.items()} == {"1": 4, "2": 3, "3": 2, "4": 1, "5+": 1, "no answer": 0}
    assert dist["1"]["share"] == pytest.approx(4 / 11) and sum(d["share"] for d in dist.values()) == pytest.approx(1)
    md = (tmp_path / "all" / "stats.md").read_text(encoding="utf-8")
    assert "| 1 | 2 | 3 | 4 | 5+ | no answer |" in md and "| original | data | 4 (36.4%) |" in md
    stats = build_dataset([data], tmp_path / "one", answer_sentence="1")
    assert {b: d["count"] for b, d in stats["splits"]["data"]["answer_sentences"].items()} == {
        "1": 3, "2": 0, "3": 0, "4": 0, "5+": 0, "no answer": 0}
    md = (tmp_path / "one" / "stats.md").read_text(encoding="utf-8")
    assert "Answer-sentence filter 1: kept 3 of 10 question(s) (data)" in md
    assert "implied by --answer-sentence" in md


def test_unanswerable_questions_are_bucketed_and_never_match(tmp_path):
    data = squad_file(tmp_path / "v2.json", unanswerable=True)
    stats = build_dataset([data], tmp_path / "all")
    assert stats["splits"]["data"]["answer_sentences"]["no answer"]["count"] == 1
    build_dataset([data], tmp_path / "later", answer_sentence="1+")
    assert "none" not in written(tmp_path / "later") and len(written(tmp_path / "later")) == len(QUESTIONS)


def test_random_control_of_the_same_size(tmp_path, data):
    # The filter leaves 7 questions for 2+; --sample 4 draws 4 of them, the control 4 of all 10.
    stats = build_dataset([data], tmp_path / "k", answer_sentence="2+", sample=4, seed=1)
    assert len(written(tmp_path / "k")) == 4 and stats["available"] == {"data": 7}
    control = build_dataset([data], tmp_path / "c", exclude_ambiguous=True, sample=4, seed=1)
    ids = written(tmp_path / "c")
    assert len(ids) == 4 and AMBIGUOUS not in ids and control["available"] == {"data": len(QUESTIONS)}
    assert ids == [q for q in QUESTIONS if q in ids]  # file order
    # Fewer left than --sample: the build writes what is left and names the control's --sample.
    stats = build_dataset([data], tmp_path / "few", answer_sentence="1", sample=5, seed=1)
    assert stats["splits"]["data"]["instances"] == 3
    md = (tmp_path / "few" / "stats.md").read_text(encoding="utf-8")
    assert "without --answer-sentence, with --exclude-ambiguous and --sample 3 " in md
    build_dataset([data], tmp_path / "few_control", exclude_ambiguous=True, sample=3, seed=1)
    assert len(written(tmp_path / "few_control")) == 3


def test_with_split_and_truncation_the_written_text_decides(tmp_path, data):
    stats = build_dataset([data], tmp_path / "t", answer_sentence="2+", truncate=25, split=True, seed=2)
    kept = written(tmp_path / "t", "val") + written(tmp_path / "t", "test")
    assert kept and set(kept) < set(expected(lambda k: k >= 2))  # answers cut off by the truncation are gone
    for part in ("val", "test"):
        for e in read_qa(tmp_path / "t" / f"{part}.json").examples:
            assert count_words(e.context) <= 25 and answer_sentence(e) >= 2
    plain = build_dataset([data], tmp_path / "p", truncate=25, split=True, seed=2, exclude_ambiguous=True)
    assert stats["before_filtering"] == plain["before_filtering"]  # same halves, drawn before the filter
    for part in ("val", "test"):
        assert stats["answer_sentence_kept"][part]["of"] == plain["splits"][part]["instances"]


@pytest.mark.parametrize("bad", ["0", "-1", "x", "2++", "", "+", "1.5", "+2", "0+", 0, True])
def test_bad_k_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--answer-sentence"):
        parse_answer_sentence(bad)


def test_cli(tmp_path, data, capsys):
    out = tmp_path / "cli"
    assert main(["data", "build", "--input", data, "--out", str(out), "--answer-sentence", "2+"]) == 0
    printed = capsys.readouterr().out
    assert "Answer-sentence filter 2+: kept 7 of 10" in printed and "wrote data.json" in printed
    assert sorted(written(out)) == expected(lambda k: k >= 2)
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["answer_sentence"] == "2+" and stats["splits"]["data"]["answer_sentences"]["5+"]["count"] == 1
    for bad in ("0", "-1", "x", "2++"):
        assert main(["data", "build", "--input", data, "--out", str(tmp_path / "bad"), "--answer-sentence", bad]) == 2
        assert "--answer-sentence" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert "--answer-sentence" in _help(capsys)


def _help(capsys):
    with pytest.raises(SystemExit):
        main(["data", "build", "--help"])
    return capsys.readouterr().out
