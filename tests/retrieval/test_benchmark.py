"""posbias/retrieval/benchmark.py: SQuAD-PosQ from QA examples, and the paired variant where only
the position of the answer's paragraph moves."""
import numpy as np
import pytest

from posbias.qa.examples import Answer, QAExample
from posbias.retrieval.benchmark import (
    CHAR_EDGES,
    bucket_label,
    from_examples,
    positioned_sets,
)


def words(text: str) -> int:
    return len(text.split())


def article(title: str, paragraphs: list[str], questions: dict[int, list[tuple[str, str]]]) -> list[QAExample]:
    out = []
    for i, p in enumerate(paragraphs):
        for j, (q, answer) in enumerate(questions.get(i, [])):
            out.append(QAExample(id=f"{title}-{i}-{j}", question=q, context=p,
                                 answers=[Answer(answer, p.index(answer))], title=title))
    return out


SHORT = "Ada wrote the first program. It ran on paper."
FILLER = ["The engine was never built. Babbage designed it in London. Its parts were cut by hand.",
          "Later machines used relays. They filled whole rooms. Punched cards fed them."]


def test_squad_posq_keeps_answerable_questions_over_distinct_passages():
    ex = article("A", [SHORT, FILLER[0]], {0: [("Who wrote it?", "Ada"), ("Where did it run?", "paper")],
                                           1: [("Where was it designed?", "London")]})
    ex.append(QAExample(id="none", question="Unanswerable?", context=SHORT, is_impossible=True))
    s = from_examples(ex)
    assert s.passages == [SHORT, FILLER[0]] and s.query_ids == ["A-0-0", "A-0-1", "A-1-0"]
    assert s.gold.tolist() == [0, 0, 1]
    assert s.answer_char.tolist() == [0, SHORT.index("paper"), FILLER[0].index("London")]
    assert s.stats["left_out_unanswerable"] == 1
    assert [bucket_label(c, CHAR_EDGES) for c in (0, 99, 100, 499, 500, 3000)] == \
        ["[0,100)", "[0,100)", "[100,200)", "[400,500)", "500+", "500+"]


def test_the_paired_variant_moves_only_the_answers_paragraph():
    ex = article("A", [SHORT] + FILLER, {0: [("Who wrote it?", "Ada"), ("Where did it run?", "paper")],
                                         1: [("Where?", "London")], 2: [("What fed them?", "Punched cards")]})
    ex += article("B", ["Solo paragraph here."], {0: [("Solo?", "Solo")]})
    sets = positioned_sets(ex, words, max_tokens=40, seed=3)
    assert list(sets) == ["start", "middle", "end"]
    s, m, e = sets["start"], sets["middle"], sets["end"]
    assert s.query_ids == m.query_ids == e.query_ids  # the same questions at every position
    assert "A-0-0" in s.query_ids and "B-0-0" not in s.query_ids  # B has no other paragraph for filler
    assert s.stats["left_out_passages"]["one_paragraph_article"] == 1
    for rset in sets.values():
        for q, g, c, qid in zip(rset.queries, rset.gold, rset.answer_char, rset.query_ids):
            doc = rset.passages[g]
            answer = next(x for x in ex if x.id == qid).answers[0].text
            assert doc[c:c + len(answer)] == answer  # the offset follows the paragraph
            assert words(doc) <= 40
    k = s.query_ids.index("A-0-0")
    doc = {name: rset.passages[rset.gold[k]] for name, rset in sets.items()}
    assert doc["start"].startswith(SHORT) and doc["end"].endswith(SHORT)
    assert not doc["middle"].startswith(SHORT) and not doc["middle"].endswith(SHORT) and SHORT in doc["middle"]
    assert sorted(doc["start"].split()) == sorted(doc["middle"].split()) == sorted(doc["end"].split())
    filler = words(doc["start"]) - words(SHORT)
    assert filler >= words(SHORT)  # the end position starts at least half way in
    before = words(doc["middle"][:doc["middle"].index(SHORT)])
    assert abs(before - filler / 2) <= max(words(x) for x in FILLER[0].split(". "))  # split at half the filler
    np.testing.assert_array_equal(sets["start"].gold, np.arange(len(s.passages))[s.gold])
    with pytest.raises(ValueError, match="positions"):
        positioned_sets(ex, words, 40, positions=("front",))


def test_a_passage_longer_than_half_the_window_is_left_out():
    ex = article("A", [SHORT] + FILLER, {0: [("Who wrote it?", "Ada")], 1: [("Where?", "London")]})
    sets = positioned_sets(ex, words, max_tokens=2 * words(SHORT) - 1)
    assert sets["start"].queries == [] and sets["start"].stats["left_out_passages"]["passage_over_half"] == 2
