"""Position-bias benchmarks for causal language models, built from SQuAD-format QA examples.

`multi_document_qa`: the multi-document QA of Liu et al. (TACL 2024, "Lost in the Middle: How Language
Models Use Long Contexts", section 2). A question's gold paragraph sits among k - 1 distractors that
keep one order while the gold moves through positions 1..k, so accuracy by position is paired (the same
documents, only the gold's place changes). Liu et al. took their distractors from a retriever's top
results (Contriever over Wikipedia), dropping any that contained an answer; here they are random
paragraphs of other articles of the same file (another title) that contain no normalised gold answer,
an easier kind of distractor than retrieved near-misses.

`haystacks`: needle in a haystack (Kamradt 2023; RULER, Hsieh et al. 2024) with a real question as the
needle: the gold paragraph inside about L tokens of other articles' paragraphs, at a grid of depths,
one filler order per question so that only the depth moves.

`prompt` and `best_subspan_em`: Liu et al.'s prompt and metric. `long_context_reorder` and
`bm25_relevance`: LangChain's `LongContextReorder` mitigation, with BM25 as the relevance it sorts by.

A document is `Document(title, text)`. Its tokens are `count_tokens` of its line in the prompt less
the "Document [i]" label, i.e. of "(Title: {title}) {text}", and a set of documents counts the sum:
budgets (`max_doc_tokens`, haystack lengths) are for the documents alone, so the caller leaves room for
the instruction, the question, the labels and the answer. Titles are shown with spaces for the
underscores of SQuAD's Wikipedia page names ("Steam_engine" -> "Steam engine"), as Liu et al.'s
documents show titles.
"""
from __future__ import annotations

import bisect
import functools
import math
import random
import string
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from ..errors import ConfigError
from ..qa.metrics import normalize_answer
from ..diagnoses import answerable, tokenize

T = TypeVar("T")

# Liu et al.'s prompts, quoted from github.com/nelson-liu/lost-in-the-middle (commit 29b8a6d),
# src/lost_in_the_middle/prompts/qa.prompt, qa_with_query_aware_contextualization.prompt and
# qa_ordered_randomly.prompt, with the trailing newline their get_qa_prompt strips on reading.
QA_PROMPT = ("Write a high-quality answer for the given question using only the provided search results "
             "(some of which might be irrelevant).\n\n{search_results}\n\nQuestion: {question}\nAnswer:")
"""Liu et al.'s multi-document QA prompt (qa.prompt)."""
QA_QUERY_AWARE_PROMPT = ("Write a high-quality answer for the given question using only the provided search "
                         "results (some of which might be irrelevant).\n\nQuestion: {question}\n\n"
                         "{search_results}\n\nQuestion: {question}\nAnswer:")
"""Their query-aware contextualization (section 4.2): the question also before the documents."""
QA_ORDERED_RANDOMLY_PROMPT = ("Write a high-quality answer for the given question using only the provided "
                              "search results (some of which might be irrelevant). The search results are "
                              "ordered randomly.\n\n{search_results}\n\nQuestion: {question}\nAnswer:")
"""Their variant telling the model the documents are in random order."""
CLOSEDBOOK_PROMPT = "Question: {question}\nAnswer:"
"""Liu et al.'s closed-book prompt (closedbook_qa.prompt, same commit): the question without documents."""
TEMPLATES = {"qa": QA_PROMPT, "qa_query_aware": QA_QUERY_AWARE_PROMPT,
             "qa_ordered_randomly": QA_ORDERED_RANDOMLY_PROMPT}
"""The prompts by name, for a config or the command line to choose from."""
DEPTHS = tuple(i / 10 for i in range(11))
"""Haystack depths 0, 0.1, ..., 1: from the start of the filler to its end."""


class Document(NamedTuple):
    """One search result as the prompt shows it."""

    title: str
    text: str


def _line(doc: Document) -> str:
    """A document's prompt line without its "Document [i]" label: what its tokens are counted on."""
    return f"(Title: {doc.title}) {doc.text}"


@dataclass(frozen=True)
class MultiDocQuestion:
    """One question of the multi-document QA set: its gold paragraph and its distractors in their order.

    Attributes:
        id, question: the question.
        answers: its gold answer texts (distinct, in file order), for `best_subspan_em`.
        gold: its own paragraph.
        distractors: the k - 1 other documents, in the order every position keeps.
        tokens: tokens of the k documents (module docstring), the same at every position.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    gold: Document
    distractors: tuple[Document, ...]
    tokens: int

    @property
    def k(self) -> int:
        """Documents in the prompt."""
        return len(self.distractors) + 1

    def documents(self, position: int) -> list[Document]:
        """The k documents with the gold one at `position` (1-based, as the prompt numbers them)."""
        if not 1 <= position <= self.k:
            raise ConfigError(f"position must be in 1..{self.k}, got {position}")
        return [*self.distractors[:position - 1], self.gold, *self.distractors[position - 1:]]


@dataclass
class MultiDocSet:
    """The questions of `multi_document_qa` and how they were chosen.

    Attributes:
        questions: one per kept question, in file order.
        stats: questions kept, left out by reason, tokens of the documents (mean, max), the options.
    """

    questions: list[MultiDocQuestion]
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Haystack:
    """One question's haystack at one length; the gold paragraph moves through the depths.

    Attributes:
        id, question, answers, gold: as in `MultiDocQuestion`.
        filler: the other articles' paragraphs, in the order every depth keeps.
        length: the tokens asked for; `tokens` (gold + filler) is at most this.
        tokens: tokens of the documents, the same at every depth.
        depths: the depths asked for, fractions of the filler's tokens before the gold paragraph.
        boundaries: for each depth, the filler paragraphs before the gold one (the nearest boundary).
        actual_depths: for each depth, the fraction of the filler's tokens before the gold one there.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    gold: Document
    filler: tuple[Document, ...]
    length: int
    tokens: int
    depths: tuple[float, ...]
    boundaries: tuple[int, ...]
    actual_depths: tuple[float, ...]

    def documents(self, i: int) -> list[Document]:
        """The documents with the gold paragraph at the `i`-th depth of `depths`."""
        j = self.boundaries[i]
        return [*self.filler[:j], self.gold, *self.filler[j:]]


@dataclass
class HaystackSet:
    """The haystacks of `haystacks`, question by question (file order), each question's lengths in the
    order asked; `stats` counts what was left out and why, and the tokens by length."""

    haystacks: list[Haystack]
    stats: dict = field(default_factory=dict)


class _Pool:
    """Every distinct paragraph with a title: the candidates for distractors and filler.

    Sorted by (title, text), so that a question's draw does not depend on the order of the examples.
    """

    def __init__(self, examples, count: Callable[[str], int]):
        paragraphs = sorted({(e.title, e.context) for e in examples if e.title and e.context.strip()})
        self.articles = [t for t, _ in paragraphs]  # raw titles: "another article" compares these
        self.docs = [Document(t.replace("_", " "), c) for t, c in paragraphs]
        self.norm = [normalize_answer(f"{d.title} {d.text}") for d in self.docs]
        self.tokens = [count(_line(d)) for d in self.docs]
        self.index = {p: i for i, p in enumerate(paragraphs)}

    def candidates(self, title: str, answers: Sequence[str]) -> list[int]:
        """Paragraphs of other articles whose normalised title and text hold none of `answers`
        (normalised, non-empty)."""
        out = [i for i, t in enumerate(self.articles) if t != title]
        for a in answers:  # one pass per answer: a C-level substring search per paragraph
            out = [i for i in out if a not in self.norm[i]]
        return out


def _questions(examples, question_ids: Collection[str] | None, left: dict) -> Iterator[tuple]:
    """(example, distinct answer texts, their normal forms) of each usable question asked for,
    counting those left out in `left`."""
    usable = {id(e) for e in answerable(examples)}
    asked = None if question_ids is None else set(question_ids)
    for e in examples:
        if asked is not None and e.id not in asked:
            continue
        if id(e) not in usable:
            left["unanswerable"] += 1
            continue
        if not e.title:  # no article: "another article" cannot be told
            left["no_title"] += 1
            continue
        texts = tuple(dict.fromkeys(e.gold_texts()))
        norms = tuple(dict.fromkeys(n for n in map(normalize_answer, texts) if n))
        if not norms:  # e.g. "the": "" is in every paragraph, and best_subspan_em scores any output 1
            left["empty_answer"] += 1
            continue
        yield e, texts, norms


def _random_order(rng: random.Random, items: Sequence[T]) -> Iterator[T]:
    """`items` in a random order, drawn lazily (Fisher-Yates from the front), so that a question that
    uses 20 of 2,000 paragraphs pays for about 20 draws."""
    order = list(items)
    for i in range(len(order)):
        j = rng.randrange(i, len(order))
        order[i], order[j] = order[j], order[i]
        yield order[i]


def _check_count(name: str, value, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


DISTRACTORS = ("random", "bm25")
"""How distractors are chosen: drawn at random from other articles, or retrieved (`bm25`): the paragraphs
of other articles that BM25 ranks highest for the question, most relevant first, as Liu et al. took the
top passages a retriever returned that hold no answer."""


class _Corpus:
    """BM25 over every paragraph of the pool (`bm25_relevance`'s formula, tokens and idf), for retrieving
    each question's most relevant distractors."""

    def __init__(self, docs: Sequence[Document], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tf: list[dict[str, int]] = []
        self.len: list[int] = []
        self.df: dict[str, int] = {}
        self.postings: dict[str, list[int]] = {}
        for i, d in enumerate(docs):
            toks = tokenize(f"{d[0]} {d[1]}")
            tf: dict[str, int] = {}
            for t in toks:
                tf[t] = tf.get(t, 0) + 1
            self.tf.append(tf)
            self.len.append(len(toks))
            for t in tf:
                self.df[t] = self.df.get(t, 0) + 1
                self.postings.setdefault(t, []).append(i)
        self.n = len(docs)
        self.avgdl = sum(self.len) / self.n if self.n else 0.0

    def scores(self, question: str) -> dict[int, float]:
        """{paragraph index: BM25 score} of the paragraphs sharing a term with the question."""
        out: dict[int, float] = {}
        for t in tokenize(question):  # a repeated term counts again, as in bm25_relevance
            if t not in self.df:
                continue
            idf = math.log(1 + (self.n - self.df[t] + 0.5) / (self.df[t] + 0.5))
            for i in self.postings[t]:
                tf = self.tf[i][t]
                norm = self.k1 * (1 - self.b + self.b * self.len[i] / self.avgdl)
                out[i] = out.get(i, 0.0) + idf * tf / (tf + norm)
        return out


def multi_document_qa(examples, count_tokens: Callable[[str], int], *, k: int = 20, max_doc_tokens: int,
                      seed: int = 0, question_ids: Collection[str] | None = None,
                      distractors: str = "random") -> MultiDocSet:
    """Liu et al.'s multi-document QA from QA examples (module docstring).

    Each question's distractors are drawn with `random.Random(f"{seed}:{id}")` from the paragraphs of
    other articles holding no gold answer, in an order independent of the examples' order. A draw is
    taken only if the k - 1 slots can still be filled within the budget: the documents so far, this one
    and the shortest of those not yet drawn for the slots left must fit `max_doc_tokens`. That always
    completes when the gold paragraph and the k - 1 shortest candidates fit (a question where they do
    not is left out as "too_little_room"); under a loose budget it is a uniform draw, under a tight one
    it favours short paragraphs.

    Args:
        examples: QA examples (`posbias.qa`); every paragraph among them is a candidate distractor.
        count_tokens: tokens of a text under the model's tokenizer, without special tokens.
        k: documents per prompt (Liu et al.: 10, 20, 30).
        max_doc_tokens: the most tokens the k documents may have together.
        seed: the distractors' draw.
        question_ids: build only these questions (None: all); the candidates still come from all examples.
        distractors: "random" (above) or "bm25": the k - 1 candidates BM25 ranks highest for the question
            that fit the budget (a higher-ranked one that does not fit is passed over), most relevant first,
            as Liu et al.'s retrieved distractors (`DISTRACTORS`).
    """
    _check_count("k", k)
    _check_count("max_doc_tokens", max_doc_tokens)
    if distractors not in DISTRACTORS:
        raise ConfigError(f"distractors must be one of {', '.join(DISTRACTORS)}, got {distractors!r}")
    pool = _Pool(examples, functools.lru_cache(maxsize=None)(count_tokens))
    corpus = _Corpus(pool.docs) if distractors == "bm25" else None
    left = dict.fromkeys(("unanswerable", "no_title", "empty_answer", "gold_over_budget", "too_few_distractors",
                          "too_little_room"), 0)
    out = []
    for e, texts, norms in _questions(examples, question_ids, left):
        g = pool.index[(e.title, e.context)]
        used = pool.tokens[g]
        if used > max_doc_tokens:
            left["gold_over_budget"] += 1
            continue
        cands = pool.candidates(e.title, norms) if k > 1 else []
        if len(cands) < k - 1:
            left["too_few_distractors"] += 1
            continue
        rest = sorted(pool.tokens[i] for i in cands)  # tokens of the candidates not drawn yet
        if used + sum(rest[:k - 1]) > max_doc_tokens:
            left["too_little_room"] += 1
            continue
        picked: list[int] = []
        if corpus is not None:  # most relevant first; ties by paragraph order (the pool is sorted)
            relevance = corpus.scores(e.question)
            ranked = sorted(cands, key=lambda i: (-relevance.get(i, 0.0), i))
            draws = iter(ranked)
        else:
            draws = _random_order(random.Random(f"{seed}:{e.id}"), cands)
        while len(picked) < k - 1:
            i = next(draws)  # never runs out: the invariant below
            t = pool.tokens[i]
            del rest[bisect.bisect_left(rest, t)]
            # Invariant: used + the shortest (k - 1 - len(picked)) of `rest` fit, so one of them is taken.
            if used + t + sum(rest[:k - 2 - len(picked)]) <= max_doc_tokens:
                picked.append(i)
                used += t
        out.append(MultiDocQuestion(id=e.id, question=e.question, answers=texts, gold=pool.docs[g],
                                    distractors=tuple(pool.docs[i] for i in picked), tokens=used))
    tokens = [q.tokens for q in out]
    return MultiDocSet(out, stats={
        "questions": len(out), "left_out": left, "paragraphs": len(pool.docs),
        "tokens_mean": sum(tokens) / len(tokens) if tokens else 0.0, "tokens_max": max(tokens, default=0),
        "k": k, "max_doc_tokens": max_doc_tokens, "seed": seed, "distractors": distractors})


def _nearest_boundary(cum: Sequence[int], target: float) -> int:
    """Index j of the cumulative token count `cum[j]` nearest `target` (the earlier one on a tie)."""
    j = bisect.bisect_left(cum, target)
    if j == len(cum) or (j > 0 and target - cum[j - 1] <= cum[j] - target):
        return j - 1
    return j


def haystacks(examples, count_tokens: Callable[[str], int], *, lengths: Sequence[int],
              depths: Sequence[float] = DEPTHS, seed: int = 0, min_fill: float = 0.9,
              question_ids: Collection[str] | None = None) -> HaystackSet:
    """Depth x length haystacks: each question's gold paragraph at each depth of about L tokens of filler.

    The filler is other articles' paragraphs holding no gold answer, in one seeded order per question
    (`random.Random(f"{seed}:{id}")`) for every length: a haystack takes them in that order, skipping
    any that would take it past L, until no paragraph fits the room left. The gold paragraph goes at
    the paragraph boundary nearest each depth d, a fraction of the filler's tokens (0 first, 1 last).

    Args:
        examples, count_tokens, seed, question_ids: as `multi_document_qa`'s.
        lengths: the haystack sizes L, in tokens of the documents (gold + filler).
        depths: fractions in [0, 1].
        min_fill: a haystack under `min_fill` x L tokens (too few paragraphs to draw from) is left out,
            as is one whose gold paragraph takes more than half of L.
    """
    if not lengths:
        raise ConfigError("lengths must name at least one haystack length")
    for L in lengths:
        _check_count("lengths", L)
    if not depths or any(not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in depths):
        raise ConfigError(f"depths must be fractions in [0, 1], got {list(depths)}")
    if not 0 <= min_fill <= 1:
        raise ConfigError(f"min_fill must be in [0, 1], got {min_fill}")
    pool = _Pool(examples, functools.lru_cache(maxsize=None)(count_tokens))
    left_q = dict.fromkeys(("unanswerable", "no_title", "empty_answer"), 0)
    left_h = dict.fromkeys(("gold_over_half", "short_haystack"), 0)
    out = []
    for e, texts, norms in _questions(examples, question_ids, left_q):
        g = pool.index[(e.title, e.context)]
        cands = pool.candidates(e.title, norms)
        shortest = min((pool.tokens[i] for i in cands), default=0)
        order = _random_order(random.Random(f"{seed}:{e.id}"), cands)
        drawn: list[int] = []  # the order drawn so far, shared by the lengths
        for L in lengths:
            used = pool.tokens[g]
            if 2 * used > L:  # the filler must be at least as long as the needle, for depth to mean something
                left_h["gold_over_half"] += 1
                continue
            filler = []
            n = 0
            while cands and L - used >= shortest:  # room for some paragraph yet
                if n == len(drawn):
                    nxt = next(order, None)
                    if nxt is None:
                        break
                    drawn.append(nxt)
                t = pool.tokens[drawn[n]]
                if used + t <= L:  # else skipped: it would overflow
                    filler.append(drawn[n])
                    used += t
                n += 1
            if used < min_fill * L:
                left_h["short_haystack"] += 1
                continue
            cum = [0]
            for i in filler:
                cum.append(cum[-1] + pool.tokens[i])
            fill = cum[-1]
            bounds = tuple(_nearest_boundary(cum, d * fill) for d in depths)
            out.append(Haystack(
                id=e.id, question=e.question, answers=texts, gold=pool.docs[g],
                filler=tuple(pool.docs[i] for i in filler), length=L, tokens=used, depths=tuple(depths),
                boundaries=bounds, actual_depths=tuple(cum[j] / fill if fill else 0.0 for j in bounds)))
    by_length = {}
    for L in dict.fromkeys(lengths):
        tokens = [h.tokens for h in out if h.length == L]
        by_length[L] = {"haystacks": len(tokens), "tokens_mean": sum(tokens) / len(tokens) if tokens else 0.0,
                        "tokens_max": max(tokens, default=0)}
    return HaystackSet(out, stats={
        "haystacks": len(out), "questions": len({h.id for h in out}), "left_out_questions": left_q,
        "left_out_haystacks": left_h, "by_length": by_length, "paragraphs": len(pool.docs),
        "depths": list(depths), "min_fill": min_fill, "seed": seed})


def prompt(question: str, documents: Sequence[Document], *, template: str = QA_PROMPT) -> str:
    """The prompt text: the documents as "Document [i](Title: t) text" lines, numbered from 1 and joined
    by newlines, put with the question into `template` (Liu et al.'s get_qa_prompt)."""
    if not question.strip():
        raise ConfigError("prompt: the question is empty")
    if not documents:
        raise ConfigError("prompt: no documents")
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    if "search_results" not in fields or not fields <= {"question", "search_results"}:
        raise ConfigError("prompt: template must have {search_results} and no field but {question}, "
                          f"got {sorted(fields)}")
    results = "\n".join(f"Document [{i}]{_line(Document(*d))}" for i, d in enumerate(documents, 1))
    return template.format(question=question, search_results=results)


def closedbook_prompt(question: str) -> str:
    """The closed-book prompt (Liu et al.'s get_closedbook_qa_prompt): what the model answers from its
    weights alone, the floor the documents are measured against."""
    if not question.strip():
        raise ConfigError("prompt: the question is empty")
    return CLOSEDBOOK_PROMPT.format(question=question)


def best_subspan_em(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when some normalised gold answer is a substring of the normalised prediction (Liu et al.).

    Their metrics.py normalises with the SQuAD script's steps in the SQuAD order, using the `regex`
    package where SQuAD uses `re`; `\\b` is the same in both for these patterns, so this reuses
    `posbias.qa.metrics.normalize_answer`. As theirs, an answer that normalises to "" (e.g. "The")
    matches any prediction; `multi_document_qa` leaves such questions out.
    """
    if isinstance(answers, str):
        raise ConfigError("best_subspan_em: answers must be a list of answer texts, got one string")
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(a) in pred for a in answers))


def long_context_reorder(documents: Sequence[T], scores: Sequence[float]) -> list[T]:
    """LangChain's `LongContextReorder`: the most relevant documents at the two ends, the least in the middle.

    Its rule (langchain `document_transformers/long_context_reorder.py`, which takes documents sorted
    most relevant first): walk them from the least relevant up, putting each alternately at the front
    (1st, 3rd, ...) and at the back (2nd, 4th, ...). Relevance ranks 1..6 (1 most relevant) come out
    as 2 4 6 5 3 1 and ranks 1..5 as 1 3 5 4 2: the most relevant ends last when the count is even,
    first when odd. Here the documents are first sorted by `scores`, highest first; on equal scores
    the earlier document counts as the more relevant.
    """
    if len(documents) != len(scores):
        raise ConfigError(f"long_context_reorder: {len(documents)} documents but {len(scores)} scores")
    if not all(math.isfinite(s) for s in scores):
        raise ConfigError("long_context_reorder: scores must be finite numbers")
    ranked = sorted(range(len(documents)), key=lambda i: (-scores[i], i))  # most relevant first
    front, back = [], []
    for step, i in enumerate(reversed(ranked)):
        (back if step % 2 else front).append(i)
    return [documents[i] for i in [*reversed(front), *back]]


def bm25_relevance(question: str, documents: Sequence[Document], *, k1: float = 1.5, b: float = 0.75) -> list[float]:
    """BM25 score of each document's title and text for the question, the documents as the corpus.

    The formula, tokens and Lucene idf of `posbias.retrieval.bm25` (its docstring), computed here in
    plain Python: a question has only its k documents, where building a bm25s index per question costs
    more than the sums and would need the optional `retrieval` extra.
    """
    docs = [tokenize(f"{d[0]} {d[1]}") for d in documents]
    if not docs:
        return []
    n = len(docs)
    avgdl = sum(map(len, docs)) / n
    df: dict[str, int] = {}
    for toks in docs:
        for t in set(toks):
            df[t] = df.get(t, 0) + 1
    query = [t for t in tokenize(question) if t in df]  # a term no document holds adds 0
    scores = []
    for toks in docs:
        tf: dict[str, int] = {}
        for t in toks:
            tf[t] = tf.get(t, 0) + 1
        norm = k1 * (1 - b + b * len(toks) / avgdl) if avgdl else 0.0
        scores.append(sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t] / (tf[t] + norm)
                          for t in query if t in tf))
    return scores
