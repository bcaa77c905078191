"""Position-aware retrieval benchmarks built from SQuAD-format data (Zeng et al. 2025).

`from_examples`: SQuAD-PosQ's construction. The corpus is every distinct passage (context) of the
file, each answerable question's gold passage is its own context, and a question's position is the
character offset where its first gold answer starts (buckets [0,100), [100,200), ..., 500+ as the
paper's), or the token that offset falls in under the model's tokenizer.

`positioned_sets`: the paired variant, where only the position moves. For each passage p of an
article, a document is p plus "filler": sentences of the article's other paragraphs (same topic, so
the document stays coherent and the filler is a hard negative for every other question of the
article), taken in a seeded order until the document fills the model's input. p is placed at the
start, in the middle (by tokens) or at the end of the same filler, giving three corpora, one per
position, and every question is ranked in each. A passage whose document would be longer than the
model reads, or whose filler would be shorter than the passage itself, is left out (counted), so
that the answer is always inside the model's window and the end position starts at least half way in.
"""
from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..diagnoses import answerable
from ..qa.sentences import sentence_spans

CHAR_EDGES = (0, 100, 200, 300, 400, 500)
"""SQuAD-PosQ's buckets of the answer's start character: [0,100), ..., [400,500), 500+."""
TOKEN_EDGES = (0, 32, 64, 96, 128, 192, 256)
"""Buckets of the answer's first token in its passage (the model's tokenizer, no special tokens)."""
POSITIONS = ("start", "middle", "end")


@dataclass
class RetrievalSet:
    """Queries, a corpus and each query's one relevant passage.

    Attributes:
        name: "passages" (SQuAD-PosQ) or a position of the paired variant.
        passages: the corpus texts.
        queries, query_ids: the questions and their ids.
        gold: (q,) index of each query's relevant passage.
        answer_char: (q,) character where the query's answer starts in its relevant passage.
        stats: how the set was built (counts of what was left out and why).
    """

    name: str
    passages: list[str]
    queries: list[str]
    query_ids: list[str]
    gold: np.ndarray
    answer_char: np.ndarray
    stats: dict = field(default_factory=dict)


def bucket_label(value: float, edges: Sequence[int]) -> str:
    """"[lo,hi)" of the bucket `value` falls in, "last+" past the last edge."""
    for lo, hi in itertools.pairwise(edges):
        if lo <= value < hi:
            return f"[{lo},{hi})"
    return f"{edges[-1]}+"


def from_examples(examples, name: str = "passages") -> RetrievalSet:
    """SQuAD-PosQ from QA examples: every distinct context is a passage; each answerable question's
    gold passage is its own; its position is its first gold answer's start character."""
    usable = answerable(examples)
    index: dict[str, int] = {}
    for e in usable:
        index.setdefault(e.context, len(index))
    return RetrievalSet(
        name=name, passages=list(index), queries=[e.question for e in usable], query_ids=[e.id for e in usable],
        gold=np.array([index[e.context] for e in usable], dtype=np.int64),
        answer_char=np.array([e.answers[0].start for e in usable], dtype=np.int64),
        stats={"questions": len(usable), "passages": len(index), "left_out_unanswerable": len(examples) - len(usable)})


def positioned_sets(examples, count_tokens: Callable[[str], int], max_tokens: int, *, seed: int = 0,
                    positions: Sequence[str] = POSITIONS) -> dict[str, RetrievalSet]:
    """The paired variant: one `RetrievalSet` per position, the same questions in each (module docstring).

    Args:
        count_tokens: tokens of a text under the model's tokenizer, without special tokens.
        max_tokens: the most tokens a document may have (the model's input length less its special tokens).
        seed: the filler order.
    """
    bad = [p for p in positions if p not in POSITIONS]
    if bad:
        raise ValueError(f"positions must be among {POSITIONS}, got {bad}")
    count_tokens = functools.lru_cache(maxsize=None)(count_tokens)  # a sentence is filler for many passages
    usable = answerable(examples)
    asked = {e.context for e in usable}
    articles: dict[str, list[str]] = {}  # title -> its distinct contexts, in file order (any can be filler)
    for e in examples:
        ctxs = articles.setdefault(e.title, [])
        if e.context.strip() and e.context not in ctxs:
            ctxs.append(e.context)
    rng = random.Random(seed)
    docs: dict[str, tuple[list[str], list[str]]] = {}  # context -> (filler before a middle p, after it)
    left = {"no_title": 0, "one_paragraph_article": 0, "passage_over_half": 0, "too_little_filler": 0}
    for title, ctxs in articles.items():
        for ctx in (c for c in ctxs if c in asked):
            if not title:
                left["no_title"] += 1
                continue
            others = [c for c in ctxs if c != ctx]
            if not others:
                left["one_paragraph_article"] += 1
                continue
            n = count_tokens(ctx)
            if 2 * n > max_tokens:  # the filler must be at least as long as the passage
                left["passage_over_half"] += 1
                continue
            order = others[:]
            rng.shuffle(order)
            filler, used = [], n
            for other in order:
                for s, t in sentence_spans(other):
                    sent = other[s:t].strip()
                    k = count_tokens(sent) if sent else 0
                    if sent and used + k <= max_tokens:
                        filler.append((sent, k))
                        used += k
            fill = sum(k for _, k in filler)
            if fill < n:
                left["too_little_filler"] += 1
                continue
            half, acc = 0, 0  # the middle: split the filler where half its tokens lie before p
            while half < len(filler) and acc + filler[half][1] <= fill / 2:
                acc += filler[half][1]
                half += 1
            docs[ctx] = ([s for s, _ in filler[:half]], [s for s, _ in filler[half:]])
    kept = [e for e in usable if e.context in docs]
    out = {}
    for pos in positions:
        passages, index, starts = [], {}, {}
        for ctx, (before, after) in docs.items():
            sents = before + after
            if pos == "start":
                head, tail = [], sents
            elif pos == "end":
                head, tail = sents, []
            else:
                head, tail = before, after
            prefix = " ".join(head) + (" " if head else "")
            passages.append(prefix + ctx + ((" " + " ".join(tail)) if tail else ""))
            index[ctx], starts[ctx] = len(passages) - 1, len(prefix)
        out[pos] = RetrievalSet(
            name=pos, passages=passages, queries=[e.question for e in kept], query_ids=[e.id for e in kept],
            gold=np.array([index[e.context] for e in kept], dtype=np.int64),
            answer_char=np.array([starts[e.context] + e.answers[0].start for e in kept], dtype=np.int64),
            stats={"questions": len(kept), "passages": len(docs), "left_out_passages": dict(left),
                   "left_out_questions": len(usable) - len(kept), "max_tokens": max_tokens, "seed": seed})
    return out
