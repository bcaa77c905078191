"""posbias/generation/benchmark.py: Liu et al.'s multi-document QA, depth x length haystacks, their prompt
and metric, and LangChain's reordering with BM25 relevance."""
import random

import pytest

from posbias.errors import ConfigError
from posbias.generation.benchmark import (
    DEPTHS,
    QA_QUERY_AWARE_PROMPT,
    Document,
    best_subspan_em,
    bm25_relevance,
    haystacks,
    long_context_reorder,
    multi_document_qa,
    prompt,
)
from posbias.qa.examples import Answer, QAExample
from posbias.qa.metrics import normalize_answer
from posbias.qa.readers import read_dataset


def words(text: str) -> int:
    return len(text.split())


def doc_tokens(doc) -> int:
    """A document's tokens as the module counts them: its prompt line less the "Document [i]" label."""
    return words(f"(Title: {doc.title}) {doc.text}")


def holds_an_answer(doc, answers) -> bool:
    norm = normalize_answer(f"{doc.title} {doc.text}")
    return any(normalize_answer(a) and normalize_answer(a) in norm for a in answers)


def qa(qid: str, title: str, context: str, answer: str | None, question: str = "What?") -> QAExample:
    if answer is None:
        return QAExample(id=qid, question=question, context=context, is_impossible=True, title=title)
    return QAExample(id=qid, question=question, context=context, answers=[Answer(answer, context.index(answer))],
                     title=title)


A0 = "Ada Lovelace wrote the first program for the engine."  # 11 tokens with "(Title: Art)"
A1 = " ".join(["word"] * 60) + " Zebra."  # 63
A2 = "The cat sat."  # 5
B0 = "ADA LOVELACE, the countess, was admired in London."  # 10, and it holds A0's answer
B1 = "Babbage designed the engine in London."  # 8
B2 = "Relays " + " ".join(["filled"] * 19)  # 22
C0 = "Punched cards fed the machines."  # 7


def small_file() -> list[QAExample]:
    """Three articles and one question for each reason to leave a question out (k=3, budget 30)."""
    return [
        qa("ada", "Art", A0, "Ada Lovelace", "Who wrote the first program?"),  # kept: {B1, C0} are all that fit
        qa("zebra", "Art", A1, "Zebra"),  # gold_over_budget: 63 > 30
        qa("article", "Art", A2, "The"),  # empty_answer: "The" normalises to ""
        qa("impossible", "Art", A0, None),  # unanswerable
        qa("nameless", "", "Nameless text here.", "Nameless"),  # no_title
        qa("babbage", "Box", B1, "Babbage", "Who designed the engine?"),  # kept
        qa("relays", "Box", B2, "Relays"),  # too_little_room: 22 + the two shortest (5 + 7) > 30
        qa("cards", "Cog", C0, "Punched cards"),  # kept
        qa("letter", "Cog", C0, "e"),  # too_few_distractors: only A2 ("art cat sat") lacks an "e"
    ]


@pytest.fixture(scope="module")
def demo():
    return read_dataset("demo:dev").examples


@pytest.fixture(scope="module")
def demo_set(demo):
    return multi_document_qa(demo, words, k=5, max_doc_tokens=600, seed=7)


def test_every_question_is_at_every_position_once_with_only_the_gold_moving(demo_set):
    qs = demo_set.questions
    assert len(qs) > 300 and len({q.id for q in qs}) == len(qs)
    for q in qs:
        assert q.k == 5 and len(set(q.distractors)) == 4 and q.gold not in q.distractors
        for pos in range(1, q.k + 1):
            docs = q.documents(pos)
            assert [i for i, d in enumerate(docs) if d == q.gold] == [pos - 1]
            assert docs[:pos - 1] + docs[pos:] == list(q.distractors)  # the distractors keep their order
            assert f"Document [{pos}](Title: {q.gold.title}) {q.gold.text}\n" in prompt(q.question, docs) + "\n"


def test_distractors_are_other_articles_paragraphs_without_any_gold_answer(demo, demo_set):
    by_id = {e.id: e for e in demo}
    paragraphs = {(e.title.replace("_", " "), e.context) for e in demo}
    for q in demo_set.questions:
        e = by_id[q.id]
        assert q.gold == Document(e.title.replace("_", " "), e.context)
        assert set(q.answers) == set(e.gold_texts())
        for d in q.distractors:
            assert tuple(d) in paragraphs and d.title != q.gold.title
            assert not holds_an_answer(d, e.gold_texts())  # brute force over every gold answer


def test_a_paragraph_holding_the_answer_in_another_form_is_never_drawn():
    s = multi_document_qa(small_file(), words, k=4, max_doc_tokens=100, seed=0, question_ids={"ada"})
    (q,) = s.questions
    # B0 has "ADA LOVELACE," (the answer once normalised), so the other-article paragraphs left are 3.
    assert set(q.distractors) == {Document("Box", B1), Document("Box", B2), Document("Cog", C0)}


def test_the_budget_holds_and_left_out_questions_add_up(demo, demo_set):
    ex = small_file()
    s = multi_document_qa(ex, words, k=3, max_doc_tokens=30, seed=0)
    assert [q.id for q in s.questions] == ["ada", "babbage", "cards"]
    assert s.stats["left_out"] == {"unanswerable": 1, "no_title": 1, "empty_answer": 1, "gold_over_budget": 1,
                                   "too_few_distractors": 1, "too_little_room": 1}
    assert set(s.questions[0].distractors) == {Document("Box", B1), Document("Cog", C0)}  # B2 would overflow
    for built, n in ((s, len(ex)), (demo_set, len(demo))):
        assert built.stats["questions"] + sum(built.stats["left_out"].values()) == n
        for q in built.questions:
            assert q.tokens == sum(map(doc_tokens, q.documents(1))) <= built.stats["max_doc_tokens"]
        assert built.stats["tokens_max"] == max(q.tokens for q in built.questions)


def test_a_tight_budget_still_fills_every_slot(demo):
    s = multi_document_qa(demo, words, k=8, max_doc_tokens=700, seed=1)
    assert s.stats["questions"] > 0 and s.stats["left_out"]["too_little_room"] > 0
    for q in s.questions:
        assert q.k == 8 and q.tokens == sum(map(doc_tokens, q.documents(8))) <= 700


def test_the_draw_is_seeded_and_independent_of_question_order(demo, demo_set):
    shuffled = list(demo)
    random.Random(3).shuffle(shuffled)
    again = multi_document_qa(shuffled, words, k=5, max_doc_tokens=600, seed=7)
    assert {q.id: q for q in again.questions} == {q.id: q for q in demo_set.questions}
    one = multi_document_qa(demo, words, k=5, max_doc_tokens=600, seed=7, question_ids=[demo_set.questions[9].id])
    assert one.questions == [demo_set.questions[9]]  # building a subset draws from the same paragraphs
    other = multi_document_qa(demo, words, k=5, max_doc_tokens=600, seed=8)
    assert [q.distractors for q in other.questions] != [q.distractors for q in demo_set.questions]


def test_k_1_is_the_gold_paragraph_alone(demo):
    s = multi_document_qa(demo, words, k=1, max_doc_tokens=10_000)
    assert s.stats["questions"] == len(demo)
    assert all(q.distractors == () and q.documents(1) == [q.gold] for q in s.questions)


def test_bad_options_are_refused_in_one_line(demo_set):
    with pytest.raises(ConfigError, match="k must be"):
        multi_document_qa([], words, k=0, max_doc_tokens=10)
    with pytest.raises(ConfigError, match=r"position must be in 1\.\.5"):
        demo_set.questions[0].documents(6)
    with pytest.raises(ConfigError, match="depths"):
        haystacks([], words, lengths=[100], depths=[0.5, 1.5])
    with pytest.raises(ConfigError, match="template"):
        prompt("Q?", [Document("T", "x")], template="{documents} {question}")


def test_the_prompt_is_liu_et_al_s_template():
    docs = [Document("Ada", "Ada wrote it."), ("Bob", "Bob read it.")]
    assert prompt("Who wrote it?", docs) == (
        "Write a high-quality answer for the given question using only the provided search results "
        "(some of which might be irrelevant).\n\n"
        "Document [1](Title: Ada) Ada wrote it.\n"
        "Document [2](Title: Bob) Bob read it.\n\n"
        "Question: Who wrote it?\n"
        "Answer:")
    assert prompt("Q {x}?", docs[:1], template=QA_QUERY_AWARE_PROMPT) == (
        "Write a high-quality answer for the given question using only the provided search results "
        "(some of which might be irrelevant).\n\n"
        "Question: Q {x}?\n\n"
        "Document [1](Title: Ada) Ada wrote it.\n\n"
        "Question: Q {x}?\n"
        "Answer:")


def test_best_subspan_em_hand_cases():
    assert best_subspan_em("It was Paris, in France.", ["paris"]) == 1.0
    assert best_subspan_em("Lyon", ["Paris"]) == 0.0
    assert best_subspan_em("The U.S. Army did.", ["US Army"]) == 1.0  # punctuation and articles dropped
    assert best_subspan_em("Parisian", ["Paris"]) == 1.0  # a substring of characters, not of words
    assert best_subspan_em("Lyon or Nice", ["Paris", "Nice"]) == 1.0  # any gold answer
    assert best_subspan_em("Anything", []) == 0.0
    assert best_subspan_em("Anything", ["The"]) == 1.0  # theirs: "" is in every prediction
    with pytest.raises(ConfigError, match="one string"):
        best_subspan_em("Paris", "Paris")


@pytest.fixture(scope="module")
def demo_haystacks(demo):
    return haystacks(demo, words, lengths=[300, 1500], seed=2)


def test_a_haystack_puts_the_gold_at_the_nearest_boundary_within_its_length(demo, demo_haystacks):
    hs = demo_haystacks.haystacks
    assert len(hs) > 600 and {h.length for h in hs} == {300, 1500}
    by_id = {e.id: e for e in demo}
    for h in hs:
        sizes = [doc_tokens(d) for d in h.filler]
        fill = sum(sizes)
        assert 0.9 * h.length <= h.tokens == fill + doc_tokens(h.gold) <= h.length
        assert all(d.title != h.gold.title and not holds_an_answer(d, by_id[h.id].gold_texts()) for d in h.filler)
        cum = [sum(sizes[:j]) for j in range(len(sizes) + 1)]
        for d, j, actual in zip(h.depths, h.boundaries, h.actual_depths, strict=True):
            assert actual == cum[j] / fill
            assert abs(cum[j] - d * fill) == min(abs(c - d * fill) for c in cum)  # the nearest boundary
            assert abs(actual - d) * fill <= max(sizes) / 2  # so within half a paragraph
        assert h.actual_depths[0] == 0.0 and h.actual_depths[-1] == 1.0


def test_only_the_depth_moves_in_a_haystack(demo, demo_haystacks):
    for h in demo_haystacks.haystacks:
        assert h.depths == DEPTHS
        for i, j in enumerate(h.boundaries):
            docs = h.documents(i)
            assert docs[j] == h.gold and docs[:j] + docs[j + 1:] == list(h.filler)
    shuffled = list(demo)
    random.Random(5).shuffle(shuffled)
    again = haystacks(shuffled, words, lengths=[300, 1500], seed=2)
    assert {(h.id, h.length): h for h in again.haystacks} == {(h.id, h.length): h for h in demo_haystacks.haystacks}


def test_haystacks_left_out_are_counted():
    ex = small_file()
    s = haystacks(ex, words, lengths=[10, 40], depths=[0.0, 0.5, 1.0], min_fill=0.9)
    assert s.stats["left_out_questions"] == {"unanswerable": 1, "no_title": 1, "empty_answer": 1}
    asked = 6 * 2  # the six usable questions at two lengths
    assert s.stats["haystacks"] + sum(s.stats["left_out_haystacks"].values()) == asked
    # Over half the length: every usable gold paragraph (7 tokens or more) at 10; A1 (63) and B2 (22) at 40.
    assert s.stats["left_out_haystacks"]["gold_over_half"] == 6 + 2
    # "letter" has one paragraph without an "e" to fill with: 7 + 5 tokens < 0.9 x 40.
    assert s.stats["left_out_haystacks"]["short_haystack"] >= 1 and "letter" not in {h.id for h in s.haystacks}
    assert all(h.tokens <= h.length for h in s.haystacks)


def test_long_context_reorder_follows_langchain():
    names = ["r1", "r2", "r3", "r4", "r5", "r6"]  # r1 the most relevant
    scores = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert long_context_reorder(names, scores) == ["r2", "r4", "r6", "r5", "r3", "r1"]
    assert long_context_reorder(names[:5], scores[:5]) == ["r1", "r3", "r5", "r4", "r2"]
    assert long_context_reorder(names[::-1], scores[::-1]) == ["r2", "r4", "r6", "r5", "r3", "r1"]
    assert long_context_reorder(list("abcd"), [1.0] * 4) == list("bdca")  # ties: the earlier is more relevant
    assert long_context_reorder([], []) == []
    with pytest.raises(ConfigError, match="2 documents but 1 scores"):
        long_context_reorder(["a", "b"], [1.0])


def test_bm25_puts_the_paragraph_sharing_the_question_s_words_on_top():
    docs = [Document("London", "London is a large city on the Thames."),
            Document("Relays", "Relays filled whole rooms."),
            Document("Charles Babbage", "Babbage designed the analytical engine in London."),
            Document("Cards", "Punched cards fed the machines.")]
    scores = bm25_relevance("Who designed the analytical engine in London?", docs)
    assert max(range(4), key=scores.__getitem__) == 2 and scores[1] == scores[3] == 0.0 < scores[0]
    assert long_context_reorder(docs, scores)[-1] == docs[2]  # an even count: the most relevant goes last


def test_bm25_relevance_equals_the_retrieval_baseline():
    pytest.importorskip("bm25s")
    from posbias.retrieval.bm25 import bm25_scores

    docs = [Document("Steam engine", "A steam engine does work with steam, steam and more steam."),
            Document("Normans", "The Normans gave their name to Normandy, a region in France."),
            Document("Packet switching", "Packet switching groups data into packets sent over a network.")]
    question = "What does a steam engine use steam for in Normandy?"
    (_, block), = bm25_scores([f"{t} {x}" for t, x in docs], [question])
    ours = bm25_relevance(question, docs)
    top = max(ours)
    assert top > 0 and all(abs(a - float(b)) <= 1e-5 * top for a, b in zip(ours, block[0], strict=True))


def test_bm25_distractors_are_the_top_ranked_other_articles_paragraphs_most_relevant_first(demo):
    from posbias.generation.benchmark import _Pool

    mset = multi_document_qa(demo, words, k=5, max_doc_tokens=10**6, distractors="bm25",
                             question_ids=[e.id for e in demo[:30]])
    pool = _Pool(demo, words)
    assert mset.stats["distractors"] == "bm25" and len(mset.questions) > 20
    for q in mset.questions:
        relevance = bm25_relevance(q.question, pool.docs)  # the whole pool as the corpus, in plain Python
        ok = [i for i, d in enumerate(pool.docs) if d.title != q.gold.title.replace("_", " ")
              and not holds_an_answer(d, q.answers)]
        best = sorted(ok, key=lambda i: (-relevance[i], i))[:4]
        assert list(q.distractors) == [pool.docs[i] for i in best]  # no budget binds: exactly the top 4
        assert [relevance[pool.docs.index(d)] for d in q.distractors] == sorted(
            (relevance[pool.docs.index(d)] for d in q.distractors), reverse=True)
    random_set = multi_document_qa(demo, words, k=5, max_doc_tokens=10**6, question_ids=[e.id for e in demo[:30]])
    assert [q.distractors for q in random_set.questions] != [q.distractors for q in mset.questions]


def test_bm25_distractors_keep_the_budget(demo):
    mset = multi_document_qa(demo, words, k=5, max_doc_tokens=400, distractors="bm25")
    assert mset.questions and all(q.tokens <= 400 for q in mset.questions)
    assert all(doc_tokens(q.gold) + sum(map(doc_tokens, q.distractors)) == q.tokens for q in mset.questions)
    with pytest.raises(ConfigError, match="distractors must be one of random, bm25"):
        multi_document_qa(demo, words, k=5, max_doc_tokens=400, distractors="dense")
